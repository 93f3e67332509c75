"""A Toxiproxy-compatible server in asyncio: the HTTP API of Shopify's Toxiproxy 2.x
(https://github.com/Shopify/toxiproxy, README "HTTP API") for the proxies and toxics the chaos
suite uses, so that toxiproxy-python (and any other Toxiproxy client) drives it unchanged. The
real Toxiproxy server cannot be installed on these machines; where one runs, set TOXIPROXY_URL
and the same tests drive it instead.

    python -m chaos.toxiproxy [--host 127.0.0.1] [--port 8474]

API (JSON bodies; errors are {"error": "...", "status": N}):

| request                               | answer                                              |
|---------------------------------------|-----------------------------------------------------|
| GET /version                          | 200 the version, as text                            |
| GET /proxies                          | 200 {name: proxy}                                   |
| POST /proxies {name, listen, upstream, enabled?} | 201 proxy (listen with the bound port); |
|                                       | 409 exists; 400 bad field                           |
| POST /populate [proxy...] or {"proxies": [...]} | 201 {"proxies": [...]} (replaces same-named)|
| GET /proxies/{proxy}                  | 200 proxy; 404                                      |
| POST /proxies/{proxy} {enabled?, listen?, upstream?} | 200 proxy (disabling drops its       |
|                                       | connections and stops listening)                    |
| DELETE /proxies/{proxy}               | 204                                                 |
| GET /proxies/{proxy}/toxics           | 200 [toxic]                                         |
| POST /proxies/{proxy}/toxics {name?, type, stream?, toxicity?, attributes} | 200 toxic;     |
|                                       | 409 exists; 400 invalid                             |
| GET / POST / DELETE /proxies/{proxy}/toxics/{toxic} | 200 toxic / 200 updated / 204        |
| POST /reset                           | 204: every proxy enabled, every toxic removed       |

A proxy is {name, listen, upstream, enabled, toxics: [toxic]}; a toxic {name, type, stream,
toxicity, attributes} (chaos.toxics lists the types). Toxics added, changed or removed act on
open connections at once, as in Toxiproxy.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import random
import socket
import struct
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from chaos import toxics as tx

VERSION = "2.9.0-spate"
"""The Toxiproxy API version this implements (the subset above)."""
READ_BYTES_MAX = 64 * 1024
QUEUE_CHUNKS_MAX = 64
"""Chunks read ahead per direction before the reader waits (back-pressure: a slow or delayed
direction slows its sender, as a real link would)."""
PROXIES_MAX = 1024
TOXICS_PER_PROXY_MAX = 64


class ApiError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass(eq=False)
class Connection:
    """One client connection through a proxy: two directions, each a reader task feeding a
    bounded queue and a writer task applying the toxics; a watcher for timeout/reset_peer."""

    proxy: Proxy
    client: tuple[asyncio.StreamReader, asyncio.StreamWriter]
    server: tuple[asyncio.StreamReader, asyncio.StreamWriter]
    rng: random.Random
    drawn: dict[str, bool] = field(default_factory=dict)
    tasks: list[asyncio.Task[None]] = field(default_factory=list)
    closed: bool = False

    def active(self, stream: str) -> list[tx.Toxic]:
        out = []
        for toxic in self.proxy.toxics.values():
            if toxic.stream != stream:
                continue
            if toxic.name not in self.drawn:
                self.drawn[toxic.name] = tx.applies(toxic, self.rng)
            if self.drawn[toxic.name]:
                out.append(toxic)
        return out

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        for stream, (source, _), (_, sink) in (
            ("upstream", self.client, self.server),
            ("downstream", self.server, self.client),
        ):
            queue: asyncio.Queue[tuple[bytes, float] | None] = asyncio.Queue(QUEUE_CHUNKS_MAX)
            self.tasks.append(loop.create_task(self._read(source, queue)))
            self.tasks.append(loop.create_task(self._write(stream, queue, sink)))
        self.tasks.append(loop.create_task(self._watch()))

    async def _read(
        self, source: asyncio.StreamReader, queue: asyncio.Queue[tuple[bytes, float] | None]
    ) -> None:
        loop = asyncio.get_running_loop()
        try:
            while data := await source.read(READ_BYTES_MAX):
                await queue.put((data, loop.time()))
        except (ConnectionError, OSError):
            pass
        await queue.put(None)

    async def _write(
        self,
        stream: str,
        queue: asyncio.Queue[tuple[bytes, float] | None],
        sink: asyncio.StreamWriter,
    ) -> None:
        loop = asyncio.get_running_loop()
        sent = 0
        try:
            while (item := await queue.get()) is not None:
                data, arrived = item
                toxics = self.active(stream)
                cut = tx.cut(self.active("upstream") + self.active("downstream"))
                if cut is not None and cut.drop:
                    continue  # a timeout toxic: the data is lost
                wait = arrived + tx.delay_s(toxics, self.rng) - loop.time()
                if wait > 0:
                    await asyncio.sleep(wait)
                rate = tx.rate_bytes_per_s(toxics)
                pause = tx.piece_delay_s(toxics)
                for piece in tx.slices(data, toxics, self.rng):
                    for part in tx.paced(piece, rate):
                        if rate:  # as Toxiproxy: wait the part's time at the rate, then send
                            await asyncio.sleep(len(part) / rate)
                        limit = tx.byte_limit(self.active(stream))
                        if limit is not None and sent + len(part) >= limit:
                            sink.write(part[: limit - sent])
                            await sink.drain()
                            self.close()
                            return
                        sink.write(part)
                        await sink.drain()
                        sent += len(part)
                    if pause:
                        await asyncio.sleep(pause)
            await asyncio.sleep(tx.close_delay_s(self.active(stream)))
            with contextlib.suppress(OSError, RuntimeError):
                if sink.can_write_eof():
                    sink.write_eof()
        except (ConnectionError, OSError):
            pass
        writers = (self.tasks[1], self.tasks[3])  # [read up, write up, read down, write down, ...]
        if all(t.done() or t is asyncio.current_task() for t in writers):
            self.close()  # both directions ended

    async def _watch(self) -> None:
        """timeout / reset_peer: after their timeout (counted from when the toxic is first seen
        here), close or reset both sides; re-evaluated whenever the proxy's toxics change."""
        while not self.closed:
            version = self.proxy.version
            cut = tx.cut(self.active("upstream") + self.active("downstream"))
            timeout = None if cut is None else cut.after_s
            changed = self.proxy.changed
            try:
                await asyncio.wait_for(changed.wait(), timeout)
            except TimeoutError:
                if cut is not None and self.proxy.version == version:
                    self.close(reset=cut.reset)
                    return

    def close(self, reset: bool = False) -> None:
        if self.closed:
            return
        self.closed = True
        self.proxy.connections.discard(self)
        for _, writer in (self.client, self.server):
            transport = writer.transport
            if reset:
                sock = transport.get_extra_info("socket")
                if sock is not None:
                    with contextlib.suppress(OSError):
                        sock.setsockopt(
                            socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0)
                        )
                transport.abort()
            else:
                transport.close()
        current = asyncio.current_task()
        for task in self.tasks:
            if task is not current:
                task.cancel()


@dataclass(eq=False)
class Proxy:
    name: str
    listen: str
    upstream: str
    enabled: bool
    seed: int
    toxics: dict[str, tx.Toxic] = field(default_factory=dict)
    connections: set[Connection] = field(default_factory=set)
    server: asyncio.Server | None = None
    version: int = 0
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    accepted: int = 0

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "listen": self.listen,
            "upstream": self.upstream,
            "enabled": self.enabled,
            "toxics": [t.to_json() for t in self.toxics.values()],
        }

    def touch(self) -> None:
        """Toxics changed: every connection's watcher re-evaluates."""
        self.version += 1
        self.changed.set()
        self.changed = asyncio.Event()

    async def start(self) -> None:
        host, port = split_address(self.listen)
        try:
            self.server = await asyncio.start_server(self._accept, host, port)
        except OSError as error:
            raise ApiError(
                500, f"proxy {self.name} cannot listen on {self.listen}: {error}"
            ) from error
        bound = self.server.sockets[0].getsockname()
        self.listen = f"{bound[0]}:{bound[1]}"

    async def stop(self) -> None:
        if self.server is not None:
            self.server.close()
            await self.server.wait_closed()
            self.server = None
        for connection in list(self.connections):
            connection.close()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        host, port = split_address(self.upstream)
        try:
            upstream = await asyncio.open_connection(host, port)
        except OSError:
            writer.transport.abort()
            return
        self.accepted += 1
        rng = random.Random(f"{self.seed}/{self.name}/{self.accepted}")
        connection = Connection(self, (reader, writer), upstream, rng)
        self.connections.add(connection)
        connection.start()


def split_address(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ApiError(400, f"{address!r} is not host:port")
    return host.strip("[]"), int(port)


class ToxiproxyServer:
    """The API and its proxies, on one event loop."""

    def __init__(self, host: str = "127.0.0.1", port: int = 8474, seed: int = 0) -> None:
        self.host, self.port, self.seed = host, port, seed
        self.proxies: dict[str, Proxy] = {}
        self._runner: web.AppRunner | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    async def start(self) -> None:
        app = web.Application(middlewares=[_errors])
        r = app.router
        r.add_get("/version", self._version)
        r.add_get("/proxies", self._list)
        r.add_post("/proxies", self._create)
        r.add_post("/populate", self._populate)
        r.add_post("/reset", self._reset)
        r.add_get("/proxies/{proxy}", self._get)
        r.add_post("/proxies/{proxy}", self._update)
        r.add_delete("/proxies/{proxy}", self._delete)
        r.add_get("/proxies/{proxy}/toxics", self._toxics)
        r.add_post("/proxies/{proxy}/toxics", self._add_toxic)
        r.add_get("/proxies/{proxy}/toxics/{toxic}", self._get_toxic)
        r.add_post("/proxies/{proxy}/toxics/{toxic}", self._update_toxic)
        r.add_delete("/proxies/{proxy}/toxics/{toxic}", self._delete_toxic)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port)
        await site.start()
        server = site._server
        assert isinstance(server, asyncio.Server)
        self.port = server.sockets[0].getsockname()[1]

    async def close(self) -> None:
        for proxy in list(self.proxies.values()):
            await proxy.stop()
        self.proxies.clear()
        if self._runner is not None:
            await self._runner.cleanup()

    # -- handlers

    async def _version(self, _: web.Request) -> web.Response:
        return web.Response(text=VERSION)

    async def _list(self, _: web.Request) -> web.Response:
        return web.json_response({n: p.to_json() for n, p in self.proxies.items()})

    async def _create(self, request: web.Request) -> web.Response:
        proxy = await self._new(await _body(request))
        return web.json_response(proxy.to_json(), status=201)

    async def _new(self, body: Any) -> Proxy:
        if not isinstance(body, dict):
            raise ApiError(400, "a proxy is a JSON object")
        name, upstream = body.get("name"), body.get("upstream")
        listen = body.get("listen") or "127.0.0.1:0"
        enabled = body.get("enabled", True)
        if not isinstance(name, str) or not name:
            raise ApiError(400, "missing required field: name")
        if not isinstance(upstream, str):
            raise ApiError(400, "missing required field: upstream")
        split_address(upstream)
        if not isinstance(listen, str) or not isinstance(enabled, bool):
            raise ApiError(400, "listen must be host:port and enabled a boolean")
        if name in self.proxies:
            raise ApiError(409, "proxy already exists")
        if len(self.proxies) >= PROXIES_MAX:
            raise ApiError(400, f"at most {PROXIES_MAX} proxies")
        proxy = Proxy(name, listen, upstream, enabled, self.seed)
        if enabled:
            await proxy.start()
        self.proxies[name] = proxy
        return proxy

    async def _populate(self, request: web.Request) -> web.Response:
        body = await _body(request)
        items = body.get("proxies") if isinstance(body, dict) else body
        if not isinstance(items, list):
            raise ApiError(400, "populate takes a list of proxies")
        out = []
        for item in items:
            if isinstance(item, dict) and item.get("name") in self.proxies:
                await self.proxies.pop(item["name"]).stop()
            out.append((await self._new(item)).to_json())
        return web.json_response({"proxies": out}, status=201)

    async def _reset(self, _: web.Request) -> web.Response:
        for proxy in self.proxies.values():
            proxy.toxics.clear()
            proxy.touch()
            if not proxy.enabled:
                proxy.enabled = True
                await proxy.start()
        return web.Response(status=204)

    def _proxy(self, request: web.Request) -> Proxy:
        proxy = self.proxies.get(request.match_info["proxy"])
        if proxy is None:
            raise ApiError(404, "proxy not found")
        return proxy

    async def _get(self, request: web.Request) -> web.Response:
        return web.json_response(self._proxy(request).to_json())

    async def _update(self, request: web.Request) -> web.Response:
        proxy = self._proxy(request)
        body = await _body(request)
        if not isinstance(body, dict):
            raise ApiError(400, "a proxy update is a JSON object")
        enabled = body.get("enabled", proxy.enabled)
        if not isinstance(enabled, bool):
            raise ApiError(400, "enabled must be a boolean")
        moved = False
        for key in ("listen", "upstream"):
            if key in body and body[key] != getattr(proxy, key):
                split_address(body[key])
                setattr(proxy, key, body[key])
                moved = True
        if moved or not enabled:
            await proxy.stop()
        if enabled and (moved or not proxy.enabled):
            await proxy.start()
        proxy.enabled = enabled
        return web.json_response(proxy.to_json())

    async def _delete(self, request: web.Request) -> web.Response:
        proxy = self._proxy(request)
        await proxy.stop()
        del self.proxies[proxy.name]
        return web.Response(status=204)

    async def _toxics(self, request: web.Request) -> web.Response:
        return web.json_response([t.to_json() for t in self._proxy(request).toxics.values()])

    async def _add_toxic(self, request: web.Request) -> web.Response:
        proxy = self._proxy(request)
        try:
            toxic = tx.parse(await _body(request))
        except tx.InvalidToxic as error:
            raise ApiError(400, str(error)) from error
        if toxic.name in proxy.toxics:
            raise ApiError(409, "toxic already exists")
        if len(proxy.toxics) >= TOXICS_PER_PROXY_MAX:
            raise ApiError(400, f"at most {TOXICS_PER_PROXY_MAX} toxics per proxy")
        proxy.toxics[toxic.name] = toxic
        proxy.touch()
        return web.json_response(toxic.to_json())

    def _toxic(self, request: web.Request) -> tuple[Proxy, tx.Toxic]:
        proxy = self._proxy(request)
        toxic = proxy.toxics.get(request.match_info["toxic"])
        if toxic is None:
            raise ApiError(404, "toxic not found")
        return proxy, toxic

    async def _get_toxic(self, request: web.Request) -> web.Response:
        return web.json_response(self._toxic(request)[1].to_json())

    async def _update_toxic(self, request: web.Request) -> web.Response:
        proxy, toxic = self._toxic(request)
        body = await _body(request)
        if isinstance(body, dict):
            body = {k: v for k, v in body.items() if k != "name"}
        try:
            updated = tx.parse(body, toxic)
        except tx.InvalidToxic as error:
            raise ApiError(400, str(error)) from error
        proxy.toxics[toxic.name] = updated
        for connection in proxy.connections:
            connection.drawn.pop(toxic.name, None)  # a new toxicity is drawn again
        proxy.touch()
        return web.json_response(updated.to_json())

    async def _delete_toxic(self, request: web.Request) -> web.Response:
        proxy, toxic = self._toxic(request)
        del proxy.toxics[toxic.name]
        for connection in proxy.connections:
            connection.drawn.pop(toxic.name, None)
        proxy.touch()
        return web.Response(status=204)


async def _body(request: web.Request) -> Any:
    try:
        return await request.json()
    except ValueError as error:
        raise ApiError(400, f"the body is not JSON: {error}") from error


@web.middleware
async def _errors(request: web.Request, handler: Any) -> web.StreamResponse:
    try:
        response: web.StreamResponse = await handler(request)
    except ApiError as error:
        return web.json_response({"error": str(error), "status": error.status}, status=error.status)
    return response


@contextlib.contextmanager
def running(host: str = "127.0.0.1", port: int = 0, seed: int = 0) -> Iterator[ToxiproxyServer]:
    """The server on its own event loop in a thread, for synchronous callers (tests, the chaos
    runner); stopped, with every proxy, on exit."""
    loop = asyncio.new_event_loop()
    server = ToxiproxyServer(host, port, seed)
    started = threading.Event()

    def serve() -> None:
        asyncio.set_event_loop(loop)
        loop.run_until_complete(server.start())
        started.set()
        loop.run_forever()
        loop.run_until_complete(server.close())
        loop.close()

    thread = threading.Thread(target=serve, name="toxiproxy", daemon=True)
    thread.start()
    if not started.wait(30):
        raise RuntimeError("the Toxiproxy-compatible server did not start in 30 s")
    try:
        yield server
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8474)
    parser.add_argument("--seed", type=int, default=0, help="seeds jitter, slicing and toxicity")
    args = parser.parse_args()

    async def serve() -> None:
        server = ToxiproxyServer(args.host, args.port, args.seed)
        await server.start()
        print(f"toxiproxy API on {server.url}", flush=True)
        try:
            await asyncio.Event().wait()
        finally:
            await server.close()

    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve())


if __name__ == "__main__":
    main()
