"""Authentication and permissions on the admin API (ADR 0023).

Every call to `spate.api.v1.Admin` passes `AdminAuth.interceptor()` before its handler; health
checking and reflection do not (they stay open, like their ports' TCP health probes).

Who calls (first that applies):
- metadata `authorization: Bearer <token>`: the user whose `token_sha256` in the users file is
  the token's SHA-256, else UNAUTHENTICATED ("unknown token"); a token wins over a certificate;
- no token, a client certificate verified by the admin CA (mTLS, `admin_tls_client_auth`; the
  handshake already refused any other) and a users file: the user named by the certificate's
  common name, else UNAUTHENTICATED naming the CN. Such a caller satisfies
  `admin_require_token` (a certificate user counts as a token user);
- no token, and tokens are not required: `anonymous`, if the caller is on loopback or
  `allow_remote_anonymous` is on; else UNAUTHENTICATED naming what to do;
- no token, tokens required: UNAUTHENTICATED.

What they may do: `RULES` below, per method: the permission (spate.core.permissions) and the
request field naming the stream, or None for cluster-wide reads (any authenticated caller).
A method not in the table (cluster operations added later) needs `configure` on the reserved
name `$cluster`, which only a pattern like `.*` matches. Refusals are PERMISSION_DENIED with
the user, permission, stream and pattern; the spate error code travels in the trailing
metadata as for every other admin error (spate.cluster.admin.errors).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

import grpc
from spate.cluster.admin.errors import ERROR_CODE_KEY, grpc_status
from spate.core.errors import BrokerError, Unauthenticated
from spate.core.permissions import ANONYMOUS, FULL, Permission, UserStore

ADMIN_SERVICE_PREFIX = "/spate.api.v1.Admin/"
CLUSTER_RESOURCE = "$cluster"
"""The name cluster-wide changes are checked against (`configure`)."""

_C, _R = Permission.CONFIGURE, Permission.READ
RULES: Mapping[str, tuple[Permission, str] | None] = MappingProxyType(
    {
        "CreateStream": (_C, "stream.name"),
        "DeleteStream": (_C, "name"),
        "DescribeStream": (_R, "name"),
        "ListStreams": None,
        "ClusterStatus": None,
        "ListPartitions": (_R, "stream"),
        "ListProducers": (_R, "stream"),
        "ListConsumers": (_R, "stream"),
        "SetConsumerOffset": (_C, "stream"),
        "CreateSuperStream": (_C, "name"),
        "ListSuperStreams": None,
        "DescribeSuperStream": (_R, "name"),
        "DeleteSuperStream": (_C, "name"),
        "CreateConsumerGroup": (_C, "stream"),
        "DeleteConsumerGroup": (_C, "stream"),
        "ListConsumerGroups": (_R, "stream"),
        "DescribeConsumerGroup": (_R, "stream"),
        # Cluster operations (ADR 0022): watching them and reading replica states is a read;
        # moves, transfers, drains, removals and the balancer switch change the cluster
        # (configure on $cluster, the default for a method not named here).
        "GetOperation": None,
        "ListReplicas": (_R, "stream"),
        "GetLocalReplica": (_R, "stream"),
    }
)
"""Method -> (permission, request field holding the stream name); None: any caller. An empty
stream field (ListPartitions of every stream) is a cluster-wide read."""


def _field(request: Any, path: str) -> str:
    value = request
    for part in path.split("."):
        value = getattr(value, part)
    return str(value)


def _peer_is_loopback(peer: str) -> bool:
    """gRPC peers look like `ipv4:127.0.0.1:5000`, `ipv6:[::1]:5000` or `unix:...`."""
    kind, _, rest = peer.partition(":")
    if kind == "unix":
        return True
    host = rest.rsplit(":", 1)[0].strip("[]")
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@dataclass
class AdminAuth:
    store: UserStore | None = None
    """Users with tokens and grants; None: no users file (everyone is anonymous). Replaced
    whole when the users file is reloaded (SIGHUP): calls after that see the new one."""
    require_token: bool = False
    allow_remote_anonymous: bool = False

    def identify(
        self, metadata: Sequence[tuple[str, Any]], peer: str, common_name: str | None = None
    ) -> str:
        """The caller's user name; `common_name`: of its verified client certificate, if any."""
        token = None
        for key, value in metadata:
            if key == "authorization":
                scheme, _, rest = str(value).partition(" ")
                if scheme.lower() != "bearer" or not rest:
                    raise Unauthenticated("authorization metadata must be 'Bearer <token>'")
                token = rest.strip()
        if token is not None:
            user = self.store.user_of_token(token) if self.store is not None else None
            if user is None:
                raise Unauthenticated("unknown admin token (check $SPATE_ADMIN_TOKEN)")
            return user
        if common_name is not None and self.store is not None:
            if not self.store.has_user(common_name):
                raise Unauthenticated(
                    f"the client certificate's common name {common_name!r} is not a user of "
                    "this admin API: add it to the users file (`spate user add "
                    f"{common_name}`), or send a token"
                )
            return common_name
        if self.require_token:
            raise Unauthenticated(
                "this admin API needs a token: set $SPATE_ADMIN_TOKEN (made by `spate user add "
                "NAME --token`)"
            )
        if not self.allow_remote_anonymous and not _peer_is_loopback(peer):
            raise Unauthenticated(
                f"calls without a token are accepted from loopback only, and {peer} is not; "
                "set $SPATE_ADMIN_TOKEN, or start the node with allow_remote_anonymous"
            )
        return ANONYMOUS

    def authorize(self, method: str, request: Any, user: str) -> None:
        grants = self.store.grants_of(user) if self.store is not None else FULL
        if method in RULES:
            rule = RULES[method]
            if rule is None:
                return
            permission, path = rule
            stream = _field(request, path)
            if not stream:
                return  # every stream: a cluster-wide read or an invalid request, refused later
            grants.check(user, permission, stream)
            return
        grants.check(user, Permission.CONFIGURE, CLUSTER_RESOURCE)

    def interceptor(self) -> grpc.aio.ServerInterceptor[Any, Any]:
        return _Interceptor(self)


def _common_name(context: Any) -> str | None:
    """The verified client certificate's common name (gRPC puts it in the auth context only
    after verifying the certificate against the server's CA), or None."""
    names = context.auth_context().get("x509_common_name")
    if not names:
        return None
    value = names[0]
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


class _Interceptor(grpc.aio.ServerInterceptor):  # type: ignore[type-arg]
    def __init__(self, auth: AdminAuth) -> None:
        self.auth = auth

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[Any]],
        details: grpc.HandlerCallDetails,
    ) -> Any:
        handler: Any = await continuation(details)
        method_path: str = details.method
        if handler is None or not method_path.startswith(ADMIN_SERVICE_PREFIX):
            return handler  # health, reflection, unknown methods (UNIMPLEMENTED)
        method = method_path[len(ADMIN_SERVICE_PREFIX) :]
        metadata = tuple(details.invocation_metadata or ())
        auth = self.auth

        async def check(request: Any, context: Any) -> None:
            try:
                user = auth.identify(metadata, context.peer(), _common_name(context))
                auth.authorize(method, request, user)
            except BrokerError as error:
                await context.abort(
                    grpc_status(error),
                    error.message,
                    trailing_metadata=((ERROR_CODE_KEY, error.code.value),),
                )

        if handler.unary_unary is not None:
            inner: Any = handler.unary_unary

            async def unary(request: Any, context: Any) -> Any:
                await check(request, context)
                return await inner(request, context)

            return grpc.unary_unary_rpc_method_handler(
                unary,
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
        if handler.unary_stream is not None:
            inner_stream: Any = handler.unary_stream

            async def streaming(request: Any, context: Any) -> Any:
                await check(request, context)
                async for item in inner_stream(request, context):
                    yield item

            return grpc.unary_stream_rpc_method_handler(
                streaming,
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
        return handler  # no client-streaming methods in the Admin service
