"""Background traffic: workload requests a server serves while the audit's own requests run.

Owns: :class:`Background` — ``concurrency`` requests in flight to one server from the bundled
workload records (chat, code and RAG prompts, as text), each with its own sampling: greedy or
sampled at one of a few temperatures, of varied lengths, so that every batch the server runs
mixes rows of different kinds and ages, as production traffic does. It counts what was served,
keeps each request's own speculation (where the server reports it) in order of completion, and
turns a failed request into a :class:`~spectest.audit.samples.ServerFailure` for the audit to
confirm against the baseline. It also samples the server's running-requests gauge, the
evidence that the audited requests really ran inside busy batches.

Does not know: the checks. Used by the load condition (``conditions.load``); its request
bodies go into that condition's reproducers.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from spectest import flavours
from spectest.audit.client import Client
from spectest.audit.prompts import render
from spectest.audit.samples import AuditError, ServerFailure
from spectest.loadgen.datasets import Record
from spectest.telemetry import names as N

SETTINGS = ({"temperature": 0.0}, {"temperature": 0.7, "top_p": 0.95}, {"temperature": 1.0},
            {"temperature": 0.5, "top_p": 0.9, "top_k": 20})
PROMPT_CHARS = 3000  # a RAG record's text, cut: background requests stay short enough to mix


@dataclass
class Served:
    done: int = 0
    failed: ServerFailure | None = None
    spec: list[tuple[int, int]] = field(default_factory=list)  # (draft, accepted) per request
    running: list[float] = field(default_factory=list)  # the server's gauge, sampled


class Background:
    """``async with Background(client, records, concurrency, seed) as bg: ...``"""

    def __init__(self, client: Client, records: Sequence[Record], concurrency: int,
                 seed: int = 0, max_tokens: tuple[int, int] = (16, 96),
                 settings: Sequence[dict] = SETTINGS):
        if not records:
            raise AuditError("the load condition needs workload records for its traffic")
        self.client, self.records = client, list(records)
        self.concurrency, self.max_tokens, self.settings = concurrency, max_tokens, settings
        self.rng = random.Random(seed)
        self.served = Served()
        self.bodies: list[dict] = []  # every request sent, in order (reproducers keep some)
        self._tasks: list[asyncio.Task] = []
        self._stop = asyncio.Event()
        self._progress = asyncio.Event()

    def body(self) -> dict:
        record = self.rng.choice(self.records)
        body = self.client.body(render(record)[:PROMPT_CHARS],
                                max_tokens=self.rng.randint(*self.max_tokens),
                                seed=self.rng.randrange(2**31), ignore_eos=True,
                                **self.rng.choice(self.settings))
        body.pop("return_tokens_as_token_ids", None)
        body.update(self.client.endpoint.extra)
        return body

    async def _worker(self) -> None:
        while not self._stop.is_set():
            body = self.body()
            self.bodies.append(body)
            try:
                data = await self.client.call("POST", "/v1/completions", body)
            except ServerFailure as exc:
                self.served.failed = self.served.failed or exc
                self._stop.set()
                self._progress.set()
                return
            stats = flavours.response_stats(data)
            if stats is not None:
                self.served.spec.append((stats.draft_tokens, stats.accepted_tokens))
            self.served.done += 1
            self._progress.set()

    async def _gauge(self) -> None:
        while not self._stop.is_set():
            running = await self.client.metric(N.RUNNING)
            if running is None:
                return
            self.served.running.append(running)
            await asyncio.sleep(0.5)

    async def wait_for(self, requests: int, timeout: float) -> None:
        """Until ``requests`` background requests were served (or it failed, or timeout)."""
        deadline = time.monotonic() + timeout
        while self.served.done < requests and self.served.failed is None:
            self._progress.clear()
            left = deadline - time.monotonic()
            if left <= 0:
                return
            try:
                await asyncio.wait_for(self._progress.wait(), left)
            except TimeoutError:
                return

    async def __aenter__(self) -> Background:
        self._tasks = [asyncio.ensure_future(self._worker()) for _ in range(self.concurrency)]
        self._tasks.append(asyncio.ensure_future(self._gauge()))
        return self

    async def __aexit__(self, *exc) -> None:
        self._stop.set()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def recipe(self, keep: int = 64) -> dict:
        """What a reproducer replays alongside: the concurrency and the last requests sent."""
        return {"concurrency": self.concurrency, "bodies": self.bodies[-keep:]}
