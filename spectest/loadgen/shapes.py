"""Load shapes: stepped concurrency, open-loop Poisson arrivals, or a plain fixed user count.

``plan_steps`` turns the options into a list of steps, each held for ``--step-time``:

* ``--steps 1,2,4,8`` — closed loop: that many users, each sending back to back;
* ``--request-rates 2,4,8`` — open loop: a pool of ``--max-users`` users takes arrivals from a
  ``PoissonPacer`` at that many requests/s (split evenly across distributed workers);
* neither — one step with Locust's ``--users`` for ``--run-time`` (or until stopped).

``--run-time`` cuts any plan short. ``SpecShape`` is the ``LoadTestShape`` a locustfile
exposes; it runs on the master (or the only process) and reports each new step to the run
(``on_step``), which scrapes ``/metrics`` and closes the previous step's row.

The pacer schedules arrival *k* at origin + the sum of *k* exponential gaps — against cumulative
time, never "sleep one gap after each request" — so slow requests or late wake-ups never make
the offered rate drift. When every user is busy an arrival is served late, and its lag is
recorded rather than hidden.
"""

from __future__ import annotations

import math
import random
import time
from dataclasses import dataclass
from typing import Protocol

from locust import LoadTestShape

from spectest.loadgen.options import SpecOptions


@dataclass(frozen=True)
class PlannedStep:
    index: int
    users: int
    rate: float | None  # total arrivals/s (open loop) or None (closed loop)
    start_s: float
    end_s: float


def plan_steps(opts: SpecOptions, num_users: int | None,
               run_time: float | None) -> tuple[PlannedStep, ...]:
    t = opts.step_time
    if opts.steps:
        plan = [PlannedStep(i, u, None, i * t, (i + 1) * t) for i, u in enumerate(opts.steps)]
    elif opts.request_rates:
        plan = [PlannedStep(i, opts.max_users, r, i * t, (i + 1) * t)
                for i, r in enumerate(opts.request_rates)]
    else:
        plan = [PlannedStep(0, max(1, int(num_users or 1)), None, 0.0, math.inf)]
    if run_time:
        plan = [PlannedStep(s.index, s.users, s.rate, s.start_s, min(s.end_s, run_time))
                for s in plan if s.start_s < run_time]
    return tuple(plan)


def step_at(plan: tuple[PlannedStep, ...], elapsed: float) -> PlannedStep | None:
    for step in plan:
        if step.start_s <= elapsed < step.end_s:
            return step
    return None


class PoissonPacer:
    """Hands out Poisson arrival times; one instance per Locust process, shared by its users."""

    def __init__(self, seed: int, clock=time.time):
        self._rng = random.Random(f"spectest:arrivals:{seed}")
        self._clock = clock
        self.rate: float | None = None
        self._next = 0.0

    def start(self, rate: float | None, origin: float | None = None) -> None:
        """Begin a step: ``rate`` arrivals/s from ``origin`` (None: closed loop, no pacing)."""
        self.rate = rate if rate and rate > 0 else None
        if self.rate:
            start = self._clock() if origin is None else origin
            self._next = start + self._rng.expovariate(self.rate)

    def next_arrival(self) -> float | None:
        """The next scheduled send time (wall clock), or None when not pacing."""
        if not self.rate:
            return None
        t = self._next
        self._next += self._rng.expovariate(self.rate)
        return t


class StepListener(Protocol):
    active: bool
    aborted: bool
    stop_requested: bool

    def ensure_started(self) -> bool: ...
    def plan(self) -> tuple[PlannedStep, ...]: ...
    def on_step(self, step: PlannedStep) -> None: ...


class SpecShape(LoadTestShape):
    """Drives the plan; Locust's own user-count and spawn-rate fields stay usable in the UI."""

    use_common_options = True

    def __init__(self) -> None:
        super().__init__()
        self._current = -1

    def tick(self):
        run: StepListener | None = getattr(self.runner.environment, "spectest", None)
        if run is None:
            return None
        if not run.active:  # a new test: the first tick comes before test_start
            self._current = -1
            if not run.ensure_started():
                return None
        step = step_at(run.plan(), self.get_run_time())
        if step is None:
            return None
        if step.index != self._current:
            self._current = step.index
            run.on_step(step)
        if run.aborted or run.stop_requested:
            return None
        return step.users, float(max(1, step.users))  # reach the step's users in ~1 s
