"""Which asyncio event loop spectest's own servers run on.

Owns: ``run_loop`` — uvloop where it is installed (a dependency on Linux and macOS; vLLM's API
server runs on it too), else the standard loop — and ``loop_name`` for start-up lines. uvloop
does the loop's per-event work (epoll, thread wake-ups, transport writes) in C: in ``spectest
serve`` the loop shares the GIL with the engine thread, so every microsecond it spends per
streamed token is one the engine waits (issue 13: the loop's CPU per token, speculation off,
c = 1, went from 0.27–0.42 ms to 0.18–0.35 ms); the stub should cost as little as it can.

Does not know: what runs on the loop. No torch here: the load generator's stub imports it.
"""

from __future__ import annotations

import asyncio
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
