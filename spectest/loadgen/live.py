"""The web UI's live charts: per workload, over time, acceptance, TPOT with speculation on and
off, and the running step's TPOT ratio with its interval, marked once it settles.

``LiveSeries`` lives on the process that owns a run (``LoadRun.live``, only when the web UI
is on). It is fed every request row (``add``) and the step boundaries (``begin_step``), and
every ``look_s`` seconds (``tick``, from the run's one-second ticker) it appends one point per
workload, computed over the running step's requests so far:

* acceptance — accepted / draft tokens summed over the responses' own statistics (per
  workload on every server that reports them: spectest's ``spec``, vLLM's per-request stats);
* TPOT p50 of the requests sent with speculation on and of those sent with it off — both exist
  when the locustfile runs with ``--speculative ab``, which alternates the switch request by
  request on a server that has one (spectest), so both kinds share one run and one load;
* the ratio off / on of those medians with its interval, judged like the sweep's
  (``report.evidence``) at the critical value of look k of the step's L looks
  (``report.sequential``: the step is looked at every ``look_s`` seconds, so the interval keeps
  its 95 % however long one watches), and ``settled`` from the first look at which it is ahead,
  behind or even.

In ``ab`` mode the two kinds of requests share the server's batches: at concurrency above 1 a
request without speculation waits on rounds that verify the others' drafts, so the live ratio
is "per request, on a server doing both"; the sweep's separate arms answer "all on vs all off".
It imports no torch; scipy (the bootstrap) only when a ratio is computed.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

LOOK_S = 5.0  # seconds between live points (the looks of the running step)
MAX_POINTS = 2000  # per workload: older points are dropped


@dataclass
class _Acc:
    """One workload's requests in the running step, by speculation on / off."""
    tpot: dict = field(default_factory=lambda: {"on": [], "off": []})
    draft_tokens: float = 0.0
    accepted: float = 0.0


class LiveSeries:
    def __init__(self, step_time_s: float | None = None, look_s: float = LOOK_S,
                 min_requests: int | None = None, clock=time.time):
        from spectest.report.evidence import MIN_REQUESTS_PER_STEP  # numpy/pandas only

        self.look_s = look_s
        self.step_time_s = step_time_s
        self.min_requests = min_requests or MIN_REQUESTS_PER_STEP
        self.clock = clock
        self.started = clock()
        self.step = -1
        self.users = 0
        self.step_started = self.started
        self.next_look = self.started + look_s
        self.looks_done = 0
        self.acc: dict[str, _Acc] = {}
        self.points: dict[str, list[dict]] = {}
        self.settled: dict[str, dict] = {}  # workload → the point at which the step settled
        self.steps: list[dict] = []  # step boundaries, for the charts

    # --- feeding ---------------------------------------------------------------------------
    def begin_step(self, index: int, users: int, step_time_s: float | None = None) -> None:
        now = self.clock()
        self.step, self.users = index, users
        self.step_started = now
        self.next_look = now + self.look_s
        self.looks_done = 0
        self.acc = {}
        self.settled = {}
        if step_time_s:
            self.step_time_s = step_time_s
        self.steps.append({"t": round(now - self.started, 2), "step": index, "users": users})

    def add(self, rows: list[dict]) -> None:
        for r in rows:
            if not r.get("ok") or r.get("started_at", 0) < self.step_started:
                continue
            acc = self.acc.setdefault(r.get("workload") or "all", _Acc())
            kind = r.get("speculative")
            kind = kind if kind in ("on", "off") else "on"
            if r.get("tpot_ms") is not None:
                acc.tpot[kind].append(float(r["tpot_ms"]))
            spec = r.get("spec") or {}
            if spec.get("draft_tokens"):
                acc.draft_tokens += spec.get("draft_tokens") or 0
                acc.accepted += spec.get("accepted_tokens") or 0

    def tick(self) -> None:
        """Append a point per workload once ``look_s`` has passed since the last one."""
        now = self.clock()
        if now < self.next_look:
            return
        self.next_look = now + self.look_s
        self.looks_done += 1
        for workload, acc in self.acc.items():
            point = self._point(workload, acc, now)
            series = self.points.setdefault(workload, [])
            series.append(point)
            del series[:-MAX_POINTS]

    # --- a point ---------------------------------------------------------------------------
    @property
    def looks(self) -> int:
        """The running step's looks: its planned time over ``look_s`` (one look per ``look_s``
        when the step has no end: an open-ended run is judged as if it had 12 looks)."""
        from spectest.report.sequential import MAX_LOOKS
        if not self.step_time_s:
            return MAX_LOOKS
        return max(1, min(MAX_LOOKS, round(self.step_time_s / self.look_s)))

    def _point(self, workload: str, acc: _Acc, now: float) -> dict:
        on, off = (np.asarray(acc.tpot[k], dtype=float) for k in ("on", "off"))
        point = {"t": round(now - self.started, 2), "step": self.step, "users": self.users,
                 "look": self.looks_done, "n_on": len(on), "n_off": len(off),
                 "acceptance": (acc.accepted / acc.draft_tokens if acc.draft_tokens
                                else None),
                 "tpot_on": float(np.median(on)) if len(on) else None,
                 "tpot_off": float(np.median(off)) if len(off) else None}
        if len(on) >= 2 and len(off) >= 2:
            point.update(self._ratio(workload, on, off, point))
        return point

    def _ratio(self, workload: str, on: np.ndarray, off: np.ndarray, point: dict) -> dict:
        from spectest.report import evidence as ev
        from spectest.report.sequential import z_at

        k = min(self.looks_done, self.looks)
        z = z_at(k, self.looks)
        rows = [{"tpot_p50_ms": float(np.median(v)), "tpot_p50_log_se": ev.median_log_se(v),
                 "requests": len(v), "failures": 0} for v in (on, off)]
        r = ev.ratio(rows[0], rows[1], "tpot_p50_ms", False, float(self.users),
                     self.min_requests, z=z, labels=("on", "off"))
        out = {"ratio": r.value, "low": r.low, "high": r.high, "z": round(z, 3),
               "judgement": r.judgement, "settled": workload in self.settled}
        if r.resolved and workload not in self.settled and self.looks_done <= self.looks:
            self.settled[workload] = {"t": point["t"], "judgement": r.judgement}
            out["settled"] = True
            out["settles_here"] = True
        return out

    def to_json(self) -> dict:
        return {"look_s": self.look_s, "looks": self.looks, "step": self.step,
                "users": self.users, "steps": self.steps,
                "workloads": {w: pts for w, pts in sorted(self.points.items())},
                "settled": self.settled}
