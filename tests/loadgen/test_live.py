"""The web UI's live series: a point per workload every look, TPOT on and off, and the running
step's ratio with the interval of its look, marked once — at the first look it settles."""

import numpy as np

from spectest.loadgen.live import LiveSeries
from spectest.report import sequential


class Clock:
    def __init__(self):
        self.t = 1000.0

    def __call__(self):
        return self.t


def rows(rng, kind: str, median: float, n: int, t: float) -> list[dict]:
    tpot = median * np.exp(rng.normal(0, 0.05, n))
    spec = {"draft_tokens": 40, "accepted_tokens": 20} if kind == "on" else None
    return [{"ok": True, "started_at": t, "workload": "chat", "speculative": kind,
             "tpot_ms": float(x), "spec": spec} for x in tpot]


def test_points_every_look_and_a_mark_where_the_ratio_settles():
    clock, rng = Clock(), np.random.default_rng(0)
    live = LiveSeries(step_time_s=30, look_s=5, clock=clock)
    live.begin_step(0, 1)
    assert live.looks == 6
    for look in range(1, 7):
        live.add(rows(rng, "on", 6.0, 5, clock.t) + rows(rng, "off", 9.0, 5, clock.t))
        clock.t += 5
        live.tick()
    points = live.to_json()["workloads"]["chat"]
    assert [p["look"] for p in points] == [1, 2, 3, 4, 5, 6]
    assert points[0]["judgement"] == "thin"  # 5 requests a kind: under the minimum of 20
    settled = [p for p in points if p.get("settles_here")]
    assert len(settled) == 1 and settled[0]["look"] == 4  # 20 a kind from look 4
    assert settled[0]["judgement"] == "ahead" and settled[0]["low"] > 1
    assert settled[0]["z"] == round(sequential.critical_values(6)[3], 3)
    assert all(p["settled"] for p in points[3:]) and points[0]["acceptance"] == 0.5
    # a new step starts its own series of looks
    live.begin_step(1, 4)
    live.add(rows(rng, "on", 6.0, 3, clock.t))
    clock.t += 5
    live.tick()
    last = live.to_json()["workloads"]["chat"][-1]
    assert (last["step"], last["look"], last["n_on"], last["n_off"]) == (1, 1, 3, 0)
    assert "ratio" not in last and last["tpot_off"] is None
