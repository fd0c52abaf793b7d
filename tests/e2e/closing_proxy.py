"""A TCP proxy on loopback that closes kept-alive connections the way real servers do.

A server may close an idle keep-alive connection at any moment (uvicorn after 5 s, llama-server
after every streamed response although it answered ``Keep-Alive: timeout=5``). When the close
crosses the client's next request on the wire, the client sees its request answered by a closed
connection: no status line, nothing read. This proxy makes that race deterministic: once a
connection has carried a response and gone quiet for ``idle_close_s``, the next bytes the
client sends on it are dropped unread and the connection is closed. ``idle_close_s = 0`` is
llama-server's behaviour: every reused connection fails its next request.

It counts what it did (``closed_unread``) so a test can check that the client met the fault.
Everything else is forwarded byte for byte to the upstream server.
"""

from __future__ import annotations

import asyncio
import threading
import time


class ClosingProxy:
    def __init__(self, upstream_port: int, idle_close_s: float = 0.0):
        self.upstream_port = upstream_port
        self.idle_close_s = idle_close_s
        self.closed_unread = 0
        self.connections = 0
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)

    async def _pipe(self, reader, writer, state: dict, upstream: bool) -> None:
        try:
            while data := await reader.read(65536):
                now = time.monotonic()
                if upstream:
                    state["last_response"] = now
                elif (state["last_response"] is not None
                      and now - state["last_response"] >= self.idle_close_s
                      and not state["busy"]):
                    self.closed_unread += 1  # the server "closed first": drop it unread
                    break
                else:
                    state["busy"] = True
                writer.write(data)
                await writer.drain()
                if upstream:
                    state["busy"] = False
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            state["done"].set()

    async def _handle(self, client_reader, client_writer) -> None:
        self.connections += 1
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        state = {"last_response": None, "busy": False, "done": asyncio.Event()}
        tasks = [asyncio.ensure_future(self._pipe(client_reader, up_writer, state, False)),
                 asyncio.ensure_future(self._pipe(up_reader, client_writer, state, True))]
        await state["done"].wait()
        for t in tasks:
            t.cancel()
        for w in (client_writer, up_writer):
            w.close()

    async def _start(self) -> int:
        self.server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        return self.server.sockets[0].getsockname()[1]

    def __enter__(self) -> str:
        self.thread.start()
        port = asyncio.run_coroutine_threadsafe(self._start(), self.loop).result(10)
        return f"http://127.0.0.1:{port}"

    def __exit__(self, *exc) -> None:
        async def stop():
            self.server.close()
            await self.server.wait_closed()
        asyncio.run_coroutine_threadsafe(stop(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
