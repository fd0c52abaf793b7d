"""The audit's HTTP client against a real aiohttp server that drops connections.

A kept-alive connection the server closes as a request goes out (uvicorn drops idle ones after
5 s: plain vLLM "broke the connection" on one prompt-logprobs request of an audit in CI, and
the audit named prompt logprobs as what breaks it) is sent once more on a new connection; a
server that drops the connection on the request itself, every time, is still a serving failure.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest
from aiohttp import web

from spectest.audit.client import Client, Endpoint
from spectest.audit.samples import ServerFailure


async def _serve(drops: int, delay: float = 0.0):
    """A server that aborts the connection of its first ``drops`` requests and answers the
    others after ``delay`` seconds."""
    seen = {"n": 0}

    async def handle(request: web.Request) -> web.Response:
        seen["n"] += 1
        await asyncio.sleep(delay)
        if seen["n"] <= drops:
            request.transport.close()  # what a server closing the connection looks like
            await asyncio.sleep(0.05)
        return web.json_response({"ok": seen["n"]})

    app = web.Application()
    app.router.add_post("/v1/completions", handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    return runner, f"http://127.0.0.1:{port}", seen


def test_a_connection_dropped_once_is_sent_again():
    async def main():
        runner, url, seen = await _serve(drops=1)
        try:
            async with Client(Endpoint("candidate", url)) as client:
                data = await client.call("POST", "/v1/completions", {"prompt": "x"})
                return data, seen["n"], client.resent
        finally:
            await runner.cleanup()
    data, served, resent = asyncio.run(main())
    assert data == {"ok": 2} and served == 2 and resent == 1


def test_a_server_that_drops_every_time_is_a_serving_failure():
    async def main():
        runner, url, seen = await _serve(drops=10)
        try:
            async with Client(Endpoint("candidate", url)) as client:
                with pytest.raises(ServerFailure, match="broke the connection"):
                    await client.call("POST", "/v1/completions", {"prompt": "x"})
                return seen["n"]
        finally:
            await runner.cleanup()
    assert asyncio.run(main()) == 2  # sent once more, never a third time


def test_a_sibling_keeps_what_was_probed_and_has_its_own_timeout():
    """The preemption condition's long bursts go through a sibling client given more time:
    the same server, routes and model, a longer timeout; the original keeps its own."""
    async def main():
        runner, url, _ = await _serve(drops=0, delay=0.6)
        try:
            async with Client(Endpoint("candidate", url), timeout_s=0.2) as client:
                client.model, client.routes = "m", replace(client.routes, echo=False)
                with pytest.raises(ServerFailure, match="did not answer POST "
                                                        "/v1/completions within 0 s"):
                    await client.call("POST", "/v1/completions", {"prompt": "x"})
                async with client.sibling(concurrency=3, timeout_s=5) as twin:
                    data = await twin.call("POST", "/v1/completions", {"prompt": "x"})
                    return data, twin.model, twin.routes.echo, twin.concurrency
        finally:
            await runner.cleanup()
    data, model, echo, width = asyncio.run(main())
    assert data == {"ok": 2} and model == "m" and echo is False and width == 3
