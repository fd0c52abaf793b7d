"""How a request's outputs leave the engine thread: as few event-loop wake-ups as possible.

Owns: :class:`Outbox` (engine thread → event loop, one wake-up per burst) and :class:`Relay`
(one request's route). Does not know: OpenAI JSON (the server hands it an ``encode``
function), the engine's internals, or aiohttp beyond a socket's file descriptor.

Why it exists (measured by ``benchmarks/handoff_cost.py``; figures in docs/results.md): on a
machine whose event loop and engine thread run on different cores, *waking* the loop costs the
engine far more than the loop's work — more than doing the same work on the engine thread —
because the loop, once awake, takes the GIL from the engine thread and hands it back across
cores. So:

* a non-streaming request's outputs are collected on the engine thread and go to the loop
  once, when the request finishes;
* a streaming request starts on the loop (headers, the first chunk), and once everything the
  loop wrote has reached the kernel it turns *direct*: the engine thread encodes each round's
  chunk and writes it to the non-blocking socket itself (``os.write``), and the loop sleeps.
  The last output, an error, a write the socket could not take whole or a client that went
  away hands the stream back to the loop (the unwritten bytes first, in order), which writes
  everything after that as before. Only one side writes at a time: the engine thread writes
  only while no output of the request is queued for the loop (``_pending == 0``).
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass

log = logging.getLogger("spectest.server")


class Outbox:
    """Engine thread → event loop with one wake-up per burst.

    ``post`` queues a delivery and wakes the loop (``call_soon_threadsafe`` writes its
    self-pipe: a syscall and, across cores, an inter-processor wake-up) only when nothing is
    queued yet; the loop then runs every queued delivery, in order."""

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self.loop = loop
        self._items: list = []
        self._lock = threading.Lock()

    def post(self, deliver, item) -> None:  # engine thread
        with self._lock:
            self._items.append((deliver, item))
            if len(self._items) > 1:
                return  # a wake-up is already on its way
        self.loop.call_soon_threadsafe(self._run)

    def _run(self) -> None:  # event loop
        with self._lock:
            items, self._items = self._items, []
        for deliver, item in items:
            deliver(item)


@dataclass(frozen=True)
class Unsent:
    """Bytes the engine thread encoded for a direct stream but the socket did not take: the
    loop writes them, as they are, before anything else of the request."""
    data: bytes


class Relay:
    """One request's outputs, from the engine thread (``on_output``) to the loop (``deliver``).

    ``arrival(out)`` runs on the engine thread for every output, as it leaves the engine
    (token-gap metrics). ``collect=True`` (non-streaming): outputs are held until the last.
    Streaming: the loop calls :meth:`go_direct` whenever it has nothing queued and the socket
    took everything; from then on ``encode(out)`` → ``os.write`` on the engine thread, to a
    duplicate of the socket's descriptor that the relay owns (so that a connection the loop
    closes meanwhile can never turn the number into someone else's socket) until
    :meth:`close`, which the loop calls before the response ends."""

    def __init__(self, outbox: Outbox, deliver: Callable, arrival: Callable, *,
                 collect: bool = False):
        self.outbox, self.deliver, self.arrival = outbox, deliver, arrival
        self._lock = threading.Lock()
        self._held: list | None = [] if collect else None
        self._pending = 0  # items posted to the loop and not yet taken by it
        self._fd: int | None = None  # our duplicate of the socket's descriptor
        self._encode: Callable | None = None  # set while the engine thread writes
        self.direct_writes = 0  # rounds the engine thread wrote itself (tests, diagnostics)
        self.handbacks = 0  # times a full socket (or a gone client) gave writing back

    # --- engine thread ---------------------------------------------------------------------
    def on_output(self, out) -> None:
        self.arrival(out)
        if self._held is not None:  # non-streaming: one hand-off, at the end
            self._held.append(out)
            if out.finished:
                for held in self._held:
                    self.outbox.post(self.deliver, held)
                self._held = []
            return
        with self._lock:
            if self._encode is not None:
                if not (out.finished or out.error) and self._write(out):
                    return
                self._encode = None  # the loop writes from here on
            self._pending += 1
        self.outbox.post(self._take, out)

    def _write(self, out) -> bool:
        """Write ``out``'s chunk to the socket; False when none of it was written (the
        caller queues ``out`` for the loop); a partial write queues the rest as
        :class:`Unsent` and ends direct writing."""
        try:
            data = self._encode(out)
        except Exception:  # a formatting bug must not fail the engine's round for every row:
            log.exception("encoding a streamed chunk on the engine thread failed")
            return False  # the loop formats this output and meets the error on its own
        try:
            sent = os.write(self._fd, data)
        except OSError:  # full (BlockingIOError), or the client went away: the loop's turn
            sent = 0
        if sent == len(data):
            self.direct_writes += 1
            return True
        self.handbacks += 1
        if sent:  # part of this output is on the wire: the rest must follow it, first
            self._encode = None
            self._pending += 1
            self.outbox.post(self._take, Unsent(data[sent:]))
            return True
        return False

    # --- event loop ------------------------------------------------------------------------
    def _take(self, item) -> None:
        with self._lock:
            self._pending -= 1
        self.deliver(item)

    def go_direct(self, fileno: int, encode: Callable) -> bool:
        """Hand writing to the engine thread if nothing of this request is queued for the
        loop (the caller checks that its own queue is empty and the socket took all)."""
        with self._lock:
            if self._pending or self._encode is not None or self._held is not None:
                return False
            if self._fd is None:
                self._fd = os.dup(fileno)
                os.set_blocking(self._fd, False)  # shared with the loop's: it already is
            self._encode = encode
            return True

    def close(self) -> None:
        """End direct writing for good; after this returns the engine thread never writes."""
        with self._lock:
            self._encode = None
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None
