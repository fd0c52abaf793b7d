"""Which asyncio event loop spectest's own servers run on.

Owns: ``run_loop`` — uvloop where it is installed (a dependency on Linux and macOS; vLLM's API
server runs on it too), else the standard loop —, ``loop_name`` for start-up lines, and
``until_signalled``, a server's wait for SIGINT or SIGTERM on the running loop, and
``cancelled_on``, which lets a signal cancel a command's coroutine as Ctrl-C does. uvloop does the
loop's per-event work (epoll, thread wake-ups, transport writes) in C: in ``spectest
serve`` the loop shares the GIL with the engine thread, so every microsecond it spends per
streamed token is one the engine waits (uvloop lowered the loop's CPU per streamed token:
docs/results.md); the stub should cost as little as it can.

Does not know: what runs on the loop. No torch here: the load generator's stub imports it.
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Coroutine


def _uvloop():
    try:
        import uvloop
    except ImportError:  # Windows, or a minimal install: the standard loop works the same
        return None
    return uvloop


def run_loop(main: Coroutine) -> None:
    """Run ``main`` to completion on uvloop where available, else on asyncio's own loop."""
    uvloop = _uvloop()
    if uvloop is None:
        asyncio.run(main)
    else:
        uvloop.run(main)


def loop_name() -> str:
    return "asyncio" if _uvloop() is None else "uvloop"


async def until_signalled() -> None:
    """Return when the process gets SIGINT or SIGTERM (handlers on the running loop)."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()


async def cancelled_on(signals: tuple[int, ...], main: Coroutine):
    """Await ``main``; each of ``signals`` cancels it the way asyncio's own Ctrl-C handler
    does: ``CancelledError`` at its next ``await``, so ``finally`` blocks run and the caller
    keeps what finished. Unlike SIGINT re-sent, this also works where SIGINT is ignored (a
    job a script started in the background), which asyncio then leaves alone. The signals'
    previous handlers are put back after. The main thread's loop only."""
    loop, task = asyncio.get_running_loop(), asyncio.current_task()
    previous = {sig: signal.getsignal(sig) for sig in signals}
    for sig in signals:
        loop.add_signal_handler(sig, task.cancel)
    try:
        return await main
    finally:
        for sig, handler in previous.items():
            loop.remove_signal_handler(sig)
            signal.signal(sig, handler)
