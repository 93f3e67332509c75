"""The Synap endpoint (ADR 0018): aiohttp serving `SynapService` at one path, by WebSocket
(`GET` with Upgrade: every text message a command, answers and pushed events as text
messages) and by HTTP (`POST` a command, the answer as the body). The only module importing
aiohttp."""

from __future__ import annotations

import contextlib
import json
import logging
from typing import Any

from aiohttp import WSMsgType, web
from spate.core import limits
from spate.gateway import synap
from spate.gateway.synap import SynapError
from spate.gateway.synap_service import Connection, SynapService

log = logging.getLogger(__name__)

PATH = "/synap"
WS_CLOSE_POLICY = 1008


def _answer(answer: dict[str, Any], request_id: Any) -> dict[str, Any]:
    if request_id is not None:
        return {**answer, "request_id": request_id}
    return answer


class SynapServer:
    def __init__(self, service: SynapService, host: str = "127.0.0.1", port: int = 0) -> None:
        self.service = service
        self.host = host
        self.port = port
        self.app = web.Application(client_max_size=limits.synap_command_bytes_max)
        self.app.router.add_get(PATH, self._websocket)
        self.app.router.add_post(PATH, self._post)
        self.runner = web.AppRunner(self.app, access_log=None, handle_signals=False)
        self.sockets: set[web.WebSocketResponse] = set()

    async def start(self) -> int:
        await self.runner.setup()
        site = web.TCPSite(self.runner, self.host, self.port)
        await site.start()
        server = site._server
        assert server is not None
        sockets = getattr(server, "sockets", None) or []
        self.port = int(sockets[0].getsockname()[1])
        self.service.start()
        return self.port

    @property
    def url(self) -> str:
        return f"ws://{self.host}:{self.port}{PATH}"

    async def close(self) -> None:
        for ws in list(self.sockets):
            with contextlib.suppress(Exception):
                await ws.close()
        await self.service.close()
        await self.runner.cleanup()

    async def _post(self, request: web.Request) -> web.Response:
        request_id = None
        try:
            command, payload, request_id = synap.parse(await request.read())
            answer = await self.service.handle(command, payload, None)
            return web.json_response(_answer(answer, request_id))
        except SynapError as error:
            return web.json_response(_answer(error.answer(), request_id), status=error.status)

    async def _websocket(self, request: web.Request) -> web.StreamResponse:
        ws = web.WebSocketResponse(max_msg_size=limits.synap_command_bytes_max, heartbeat=30.0)
        if not ws.can_prepare(request).ok:
            error = SynapError(
                "InvalidRequest", f"GET {PATH} is a WebSocket; POST a command for HTTP", 400
            )
            return web.json_response(error.answer(), status=400)
        await ws.prepare(request)
        self.sockets.add(ws)
        connection = Connection(ws.send_str)
        try:
            async for message in ws:
                if message.type != WSMsgType.TEXT:
                    if message.type == WSMsgType.BINARY:
                        connection.push(
                            json.dumps(synap.invalid("send commands as text messages").answer())
                        )
                    continue
                # one command at a time: answers (and a publisher's events) keep their order
                await self._command(connection, message.data, ws)
                if connection.overflowed:
                    break
        finally:
            self.sockets.discard(ws)
            self.service.disconnected(connection)
            await connection.close()
            if not ws.closed:
                await ws.close()
        return ws

    async def _command(self, connection: Connection, text: str, ws: web.WebSocketResponse) -> None:
        request_id = None
        try:
            command, payload, request_id = synap.parse(text)
            answer = await self.service.handle(command, payload, connection)
        except SynapError as error:
            answer = error.answer()
        connection.push(json.dumps(_answer(answer, request_id), ensure_ascii=False))
        if connection.overflowed and not ws.closed:
            await ws.close(code=WS_CLOSE_POLICY, message=b"BroadcastFailed: subscriber too slow")
