"""Is the load generator itself the bottleneck? Each Locust process's own CPU, per step.

A Locust process runs its users on one core (gevent). When that core is nearly busy, requests
leave late and chunks are read late: the latencies it records grow with *its* load, not the
server's (measured against the stub: TTFT error under 1 ms with headroom, 4–19 ms with the
client's core saturated). A process that other work keeps off its core is late the same way,
so what is measured is demand: the share of one core the process that sent a request ran *or
waited in the run queue to run* over the last second or so (:class:`CpuMeter`, from
``/proc/self/schedstat``; CPU time alone where that is missing). Every request row carries it
as ``client_cpu``, and a step's
``client_cpu`` is the busiest process's mean over the step (:func:`busiest`); at or above
``SATURATED`` the step is flagged and the advice is to add processes.

Owns the meter, the threshold and the advice text; knows nothing of Locust, steps or files.
"""

from __future__ import annotations

import time
from collections import defaultdict
from pathlib import Path
from collections.abc import Iterable

SATURATED = 0.85  # share of one core at which a step's client timings are not trusted
WINDOW_S = 1.0
ADVICE = ("add load-generating processes (spectest sweep --processes N; "
          "locust --processes N, or master/worker on more machines)")


SCHEDSTAT = Path("/proc/self/schedstat")


def core_demand_seconds() -> float:
    """Seconds this process's main thread (where gevent runs every Locust user) has been on a
    core or runnable and waiting for one: the first two fields of ``/proc/self/schedstat``
    (nanoseconds). ``time.process_time()`` where the file is missing (not Linux)."""
    try:
        on_cpu, waiting = SCHEDSTAT.read_text().split()[:2]
    except (OSError, ValueError):
        return time.process_time()
    return (int(on_cpu) + int(waiting)) / 1e9


class CpuMeter:
    """``fraction()``: the share of one core this process used or waited for (1.0 = one core;
    :func:`core_demand_seconds`) in the most recent window of at least ``window_s``; cheap
    enough to call once per request (the clock is read once a window)."""

    def __init__(self, window_s: float = WINDOW_S, clock=time.monotonic,
                 cpu_clock=core_demand_seconds):
        self.window_s, self.clock, self.cpu_clock = window_s, clock, cpu_clock
        self._wall, self._cpu = clock(), cpu_clock()
        self._last: float | None = None

    def fraction(self) -> float | None:
        """None until the first window has passed."""
        wall = self.clock()
        if wall - self._wall >= self.window_s:
            cpu = self.cpu_clock()
            self._last = (cpu - self._cpu) / (wall - self._wall)
            self._wall, self._cpu = wall, cpu
        return self._last


def busiest(samples: Iterable[tuple[str, float | None]]) -> float | None:
    """The highest per-process mean of ``(process, cpu share)`` samples (None: no samples)."""
    per: dict[str, list[float]] = defaultdict(list)
    for process, share in samples:
        if share is not None and share == share:  # skips None and NaN
            per[process].append(float(share))
    return max((sum(v) / len(v) for v in per.values()), default=None)


def is_saturated(share: float | None) -> bool:
    return share is not None and share >= SATURATED


def flag_text(share: float | None) -> str:
    """'' or one clause for a saturated step, for live lines and reports."""
    if not is_saturated(share):
        return ""
    return (f"load generator saturated ({share:.0%} of a core): its latencies are inflated; "
            f"{ADVICE}")
