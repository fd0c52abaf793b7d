"""Continuous batching bookkeeping: slots, the waiting queue, admission and cancellation.

Owns: :class:`Sequence` (one request's mutable state while it runs), :class:`Scheduler` (a FIFO
waiting queue bounded by ``max_waiting``, ``max_num_seqs`` slots, a KV-position budget covering
the speculative slots, refusal of requests that can never fit, cancellation from any thread,
and preemption).

Two ways to keep within the budget. Without ``kv_budget_tokens`` every admitted sequence
reserves what it may ever need (prompt + ``max_tokens`` + the speculative slots), so nothing is
ever preempted. With it, the running sequences together may hold at most that many positions
(each its tokens so far plus the speculative slots): a sequence is admitted on what it holds
now, and when the running ones outgrow the budget the newest admitted goes back to the front of
the queue — vLLM's recompute preemption — to be recomputed from its tokens when room comes
back. (The engine's KV tensors are still allocated per slot: the budget emulates a smaller
paged pool, which is what makes a server preempt.)

Does not know: models, drafting or verification. Thread-safe: ``submit`` / ``cancel`` may be
called from the server's thread while the engine thread calls ``schedule`` between rounds.
"""

from __future__ import annotations

import heapq
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Callable

import torch

from spectest.engine.requests import (CapacityError, GenerationRequest, QueueFullError,
                                      RequestOutput)
from spectest.engine.sampling import make_generator

OutputCallback = Callable[[RequestOutput], None]


@dataclass(frozen=True)
class SchedulerConfig:
    max_num_seqs: int = 8
    max_model_len: int = 1024  # KV positions per sequence, in each model's cache
    max_waiting: int = 256
    kv_budget_tokens: int | None = None  # total reserved positions; default: slots × len
    spec_slots: int = 8  # extra positions reserved per sequence for drafts (K_max + 1)

    @property
    def budget(self) -> int:
        return self.kv_budget_tokens or self.max_num_seqs * self.max_model_len


@dataclass(eq=False)
class Sequence:
    request: GenerationRequest
    on_output: OutputCallback
    arrival: float
    tokens: list[int] = field(default_factory=list)  # prompt + output
    slot: int = -1
    admitted_at: float = 0.0
    prefill_seconds: float = 0.0
    first_token_at: float = 0.0
    last_token_at: float = 0.0
    cancelled: bool = False
    finished: bool = False
    preemptions: int = 0  # times it went back to the queue to be recomputed
    resume: bool = False  # preempted: the next admission recomputes its tokens, samples none
    drafts: int = 0
    draft_tokens: int = 0
    accepted_tokens: int = 0
    accepted_per_pos: list[int] = field(default_factory=list)
    steps: list[tuple[int, int]] = field(default_factory=list)  # (drafted, accepted) a round
    text: str = ""  # emitted so far
    held: str = ""  # decoded but not emitted: it may begin a stop string
    decoder: object = None
    generator: torch.Generator | None = None
    cached_tokens: int = 0  # prompt tokens restored from the prefix cache at admission

    @property
    def prompt_len(self) -> int:
        return len(self.request.prompt_ids)

    @property
    def generated(self) -> int:
        return len(self.tokens) - self.prompt_len

    @property
    def reservation(self) -> int:
        return self.prompt_len + self.request.params.max_tokens


class Scheduler:
    def __init__(self, config: SchedulerConfig):
        self.config = config
        self.waiting: deque[Sequence] = deque()
        self.running: dict[int, Sequence] = {}  # slot → sequence
        # a min-heap: the lowest free slot first, so running slots stay packed at 0..B-1 and
        # the KV cache can attend over a view of them instead of gathering rows (kv_cache)
        self.free_slots = list(range(config.max_num_seqs))
        self.reserved = 0
        self.lock = threading.Lock()
        self.wakeup = threading.Condition(self.lock)
        self._cancel: set[str] = set()

    def need(self, request: GenerationRequest) -> int:
        return len(request.prompt_ids) + request.params.max_tokens + self.config.spec_slots

    def submit(self, request: GenerationRequest, on_output: OutputCallback) -> Sequence:
        if not request.prompt_ids:
            raise CapacityError("the prompt is empty")
        need = self.need(request)
        limit = min(self.config.max_model_len, self.config.budget)
        if need > limit:
            raise CapacityError(
                f"request needs {need} KV positions (prompt {len(request.prompt_ids)} + "
                f"max_tokens {request.params.max_tokens} + {self.config.spec_slots} speculative)"
                f" but a sequence can hold at most {limit}")
        seq = Sequence(request, on_output, time.perf_counter(), list(request.prompt_ids))
        seq.generator = make_generator(request.params.seed)
        with self.lock:
            # requests that will take a free slot at the next round are not really waiting
            if len(self.waiting) >= self.config.max_waiting + len(self.free_slots):
                raise QueueFullError(f"{len(self.waiting)} requests already waiting")
            self.waiting.append(seq)
            self.wakeup.notify()
        return seq

    def cancel(self, request_id: str) -> None:
        with self.lock:
            self._cancel.add(request_id)
            self.wakeup.notify()

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def wait_for_work(self, timeout: float) -> None:
        with self.lock:
            if not (self.waiting or self.running or self._cancel):
                self.wakeup.wait(timeout)

    def holds(self, seq: Sequence) -> int:
        """Positions ``seq`` may hold during its next round (budgeted mode)."""
        return len(seq.tokens) + self.config.spec_slots

    def schedule(self) -> tuple[list[Sequence], list[Sequence], list[Sequence]]:
        """Between rounds: apply cancellations, preempt where the running sequences outgrew
        the budget, else admit waiting requests FIFO.

        Returns (newly admitted, cancelled, preempted) — the caller prefills (or, for a
        resumed sequence, recomputes) the first, reports the second and drops the KV of the
        third; cancelled and preempted sequences have already given back their slot.
        """
        with self.lock:
            cancelled = []
            if self._cancel:
                for seq in list(self.waiting):
                    if seq.request.request_id in self._cancel:
                        self.waiting.remove(seq)
                        cancelled.append(seq)
                for seq in list(self.running.values()):
                    if seq.request.request_id in self._cancel:
                        self._free(seq)
                        cancelled.append(seq)
                self._cancel.clear()
            admitted, preempted = [], self._preempt() if self.config.kv_budget_tokens else []
            while self.waiting and self.free_slots and not preempted:
                seq = self.waiting[0]
                if self._used() + self._wants(seq) > self.config.budget:
                    break
                self.waiting.popleft()
                seq.slot = heapq.heappop(self.free_slots)
                seq.admitted_at = seq.admitted_at or time.perf_counter()
                self.reserved += self.need(seq.request)
                self.running[seq.slot] = seq
                admitted.append(seq)
            for seq in cancelled:
                seq.cancelled = True
        return admitted, cancelled, preempted

    def _wants(self, seq: Sequence) -> int:
        return self.holds(seq) if self.config.kv_budget_tokens else self.need(seq.request)

    def _used(self) -> int:
        if not self.config.kv_budget_tokens:
            return self.reserved
        return sum(self.holds(s) for s in self.running.values())

    def _preempt(self) -> list[Sequence]:
        """The newest running sequences, back to the front of the queue, until the rest fit
        (at least one keeps running). Call with the lock held."""
        out = []
        while len(self.running) > 1 and self._used() > self.config.budget:
            seq = max(self.running.values(), key=lambda s: (s.admitted_at, s.slot))
            self._free(seq)
            seq.finished, seq.resume = False, True
            seq.preemptions += 1
            out.append(seq)
        for seq in out:  # the newest last: the oldest preempted runs first again
            self.waiting.appendleft(seq)
        return out

    def finish(self, seq: Sequence) -> None:
        with self.lock:
            self._free(seq)

    def _free(self, seq: Sequence) -> None:
        if seq.slot >= 0 and self.running.get(seq.slot) is seq:
            del self.running[seq.slot]
            heapq.heappush(self.free_slots, seq.slot)
            self.reserved -= self.need(seq.request)
        seq.finished = True

    def counts(self) -> tuple[int, int]:
        return len(self.running), len(self.waiting)
