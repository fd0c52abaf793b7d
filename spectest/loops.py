"""Which asyncio event loop spectest's own servers run on.

Owns: ``run_loop`` — uvloop where it is installed (a dependency on Linux and macOS; vLLM's API
server runs on it too), else the standard loop —, ``loop_name`` for start-up lines, and
``until_signalled``, a server's wait for SIGINT or SIGTERM on the running loop. uvloop does the
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
