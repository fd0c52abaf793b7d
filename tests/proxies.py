"""A real HTTP proxy on loopback for tests: forwards every request to a real upstream server
and lets a subclass rewrite the request body or the answer on the way (a server that ignores a
parameter, a deployment that changes a sampling setting). Runs its own event loop on a thread.

    with LogprobStripper(url) as proxied_url: ...
"""

from __future__ import annotations

import asyncio
import json
import threading

from aiohttp import ClientSession, web


class RewritingProxy:
    def __init__(self, upstream: str):
        self.upstream = upstream
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)

    def rewrite_request(self, body: dict) -> dict:
        return body

    def rewrite_response(self, body: dict) -> dict:
        return body

    async def _handle(self, request: web.Request) -> web.Response:
        raw = await request.read()
        if request.method == "POST" and raw:
            raw = json.dumps(self.rewrite_request(json.loads(raw))).encode()
        async with ClientSession() as session:
            async with session.request(request.method, self.upstream + request.path,
                                       data=raw or None,
                                       headers={"Content-Type": "application/json"}) as r:
                status, content_type, data = r.status, r.content_type, await r.read()
        if content_type == "application/json":
            return web.json_response(self.rewrite_response(json.loads(data)), status=status)
        return web.Response(body=data, status=status, content_type=content_type)

    async def _start(self) -> int:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        return site._server.sockets[0].getsockname()[1]

    def __enter__(self) -> str:
        self.thread.start()
        port = asyncio.run_coroutine_threadsafe(self._start(), self.loop).result(10)
        return f"http://127.0.0.1:{port}"

    def __exit__(self, *exc) -> None:
        asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


class TemperatureProxy(RewritingProxy):
    """Forwards to a real server and multiplies the temperature of sampled requests by
    ``factor``: a sampling setting that reaches only one side (a lossy impostor)."""

    def __init__(self, upstream: str, factor: float):
        super().__init__(upstream)
        self.factor = factor

    def rewrite_request(self, body: dict) -> dict:
        if (body.get("temperature") or 0) > 0:
            body["temperature"] *= self.factor
        return body
