"""Decode and verify forwards captured once and replayed: CUDA graphs for the engine's steps.

Owns: :class:`CapturedForwards` — for one model, a captured forward per (KV cache, batch
bucket, tokens per row, key-span bucket, output kind), made the first time that shape is
needed and replayed from then on with the new inputs copied into its static buffers. A replay
launches the whole forward at once instead of hundreds of kernels one by one from Python,
which is what a small model's decode step on a GPU is made of (one forward of the embedded
target launched ~400 kernels and took 9.6 ms on an H100 whose weights read takes 10 µs).

Shapes are fixed per capture: the batch is padded up to a bucket (1, 2, 4, 8, …; padding rows
write into the cache's scratch slot), keys are read over a span rounded up to a power of two
(at least ``SPAN_MIN``, at most the cache's length) with an explicit mask, K/V are written by
index (``engine.attention.static_inputs``). Forwards of more than ``MAX_TOKENS`` tokens a row
(prefills, catch-ups) run eagerly, as do int8 (row-exact, CPU) models. A capture that fails
falls back to eager for its shape, with a warning; ``stats()`` says how many ran which way.

``capture=False`` replays the same fixed-shape forward eagerly: how the CPU tests check the
padding, buckets, scratch slot and masks that a GPU capture relies on.

Does not know: requests, drafters or sampling. Outputs are copied out of the static buffers
(a later replay overwrites them).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import numpy as np
import torch

from spectest.engine.attention import static_inputs
from spectest.engine.device import copy_into

log = logging.getLogger("spectest.engine")
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64)
SPAN_MIN = 256
MAX_TOKENS = 16  # longer forwards (prefills) run eagerly


def bucket(n: int, buckets=BATCH_BUCKETS) -> int | None:
    return next((b for b in buckets if b >= n), None)


def span_bucket(need: int, max_len: int) -> int:
    span = SPAN_MIN
    while span < need:
        span *= 2
    return min(span, max_len)


@dataclass
class _Entry:
    ids: torch.Tensor  # [Bb, T] static inputs
    slots: torch.Tensor  # [Bb]
    positions: torch.Tensor  # [Bb, T]
    forward: object  # the eager forward (capture=False) …
    graph: torch.cuda.CUDAGraph | None = None  # … or its capture
    out: object = None  # the captured forward's static outputs
    keep: tuple = ()  # what the capture reads (cache, RoPE tables): alive while it may replay

    def replay(self):
        if self.graph is None:
            return self.forward()
        self.graph.replay()
        return self.out


@dataclass
class CapturedForwards:
    capture: bool = True  # False: replay the fixed-shape forward eagerly (CPU tests)
    entries: dict = field(default_factory=dict)
    failed: set = field(default_factory=set)
    counts: dict = field(default_factory=lambda: {"captured": 0, "replayed": 0, "eager": 0,
                                                  "failed": 0})
    _pool: object = None

    def stats(self) -> dict[str, int]:
        return dict(self.counts)

    def run(self, model, input_ids: torch.Tensor, cache, slots: np.ndarray, last_only: bool,
            hidden_only: bool, with_hidden: bool):
        """The forward's output from a replay, or None where this shape runs eagerly."""
        B, T = input_ids.shape
        scratch = cache.n_slots
        Bb = bucket(B)
        if T > MAX_TOKENS or Bb is None or len(cache.lengths) <= scratch:
            self.counts["eager"] += 1
            return None
        start = cache.lengths[slots].copy()
        need = int(start.max()) + T
        if need > cache.max_len:
            return None  # the eager path says why
        span = span_bucket(need, cache.max_len)
        key = (id(cache), Bb, T, span, last_only, hidden_only, with_hidden)
        if key in self.failed:
            self.counts["eager"] += 1
            return None
        entry = self.entries.get(key)
        if entry is None:
            entry = self._make(key, model, cache, Bb, T, span, last_only, hidden_only,
                               with_hidden)
            if entry is None:
                self.counts["eager"] += 1
                return None
        pad_slots = np.full(Bb, scratch, dtype=np.int64)
        pad_slots[:B] = slots
        positions = np.tile(np.arange(T, dtype=np.int64), (Bb, 1))
        positions[:B] += start[:, None]
        copy_into(entry.slots, pad_slots)
        copy_into(entry.positions, positions)
        entry.ids[:B].copy_(input_ids)
        out = entry.replay()
        self.counts["replayed"] += 1
        cache.lengths[slots] = start + T
        if isinstance(out, tuple):
            return tuple(o[:B].clone() for o in out)
        return out[:B].clone()

    def _make(self, key, model, cache, Bb: int, T: int, span: int, last_only: bool,
              hidden_only: bool, with_hidden: bool) -> _Entry | None:
        device = cache.device
        ids = torch.zeros(Bb, T, dtype=torch.long, device=device)
        slots = torch.full((Bb,), cache.n_slots, dtype=torch.long, device=device)
        positions = torch.arange(T, device=device).repeat(Bb, 1)
        model.rope_tables(cache.max_len)  # grown now: a capture allocates nothing of its own

        def forward():
            inputs = static_inputs(cache, slots, positions, span)
            return model.run(ids, inputs, last_only, hidden_only, with_hidden)

        entry = _Entry(ids, slots, positions, forward,
                       keep=(cache, model._cos, model._sin_rot))  # id(cache) stays unique
        if self.capture:
            try:
                entry.graph, entry.out, self._pool = _capture(forward, device, self._pool)
            except Exception as exc:  # an op that cannot be captured: eager for this shape
                log.warning("CUDA graph capture failed for batch %d × %d tokens (span %d): "
                            "%s; running it eagerly", Bb, T, span, exc)
                self.failed.add(key)
                self.counts["failed"] += 1
                return None
            self.counts["captured"] += 1
        self.entries[key] = entry
        return entry


def _capture(forward, device: torch.device, pool):
    """Warm ``forward`` up on a side stream (lazy initialisations, workspaces), then capture
    it; every capture shares one memory pool (replays run one at a time, in order)."""
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        for _ in range(2):
            forward()
    torch.cuda.current_stream(device).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool):
        out = forward()
    return graph, out, graph.pool()
