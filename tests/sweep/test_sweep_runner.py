"""The sweep's control flow on synthetic steps: arm order, early stop past saturation, and an
interruption that keeps every finished step.

``SweepRunner`` takes its step function as an argument; here it returns rows computed from a
saturating server model (throughput grows with concurrency up to a capacity, then stays flat
while latency grows), so where each series must stop is known. The real Locust/engine path is
covered by ``test_sweep_bundled.py``.
"""

import json
from pathlib import Path

import pandas as pd
import pytest
from rich.console import Console

from spectest import flavours
from spectest.report.render import render_report
from spectest.sweep import run as run_mod
from spectest.sweep.config import SweepConfig
from spectest.sweep.progress import Display
from spectest.sweep.step import Live, StepOutcome

CAPACITY = {"spec": 4, "base": 8}  # concurrency at which each arm saturates


def saturating_row(plan) -> dict:
    cap = CAPACITY[plan.arm]
    busy = min(plan.concurrency, cap)
    tpot = 10.0 if plan.arm == "spec" else 20.0
    e2el = 100 * tpot * plan.concurrency / busy  # Little's law once saturated
    return {"workload": plan.workload, "arm": plan.arm, "concurrency": plan.concurrency,
            "requests": 10 * busy, "failures": 0, "error_rate": 0.0,
            "tpot_p50_ms": tpot, "tpot_p99_ms": tpot * 1.5, "ttft_p99_ms": 50.0,
            "e2el_p50_ms": e2el, "e2el_p99_ms": e2el * 1.5,
            "output_tokens_per_s": 1000 * busy / tpot, "goodput_rps": busy / 2,
            "acceptance_rate": 0.6 if plan.arm == "spec" else None,
            "run_dir": str(plan.run_dir)}


class FakeSteps:
    """Records the plans and answers with ``saturating_row``; may raise Ctrl-C at call n."""

    def __init__(self, interrupt_at: int | None = None):
        self.plans = []
        self.interrupt_at = interrupt_at

    def __call__(self, plan, on_live=None, rel_to=None):
        self.plans.append(plan)
        if self.interrupt_at is not None and len(self.plans) == self.interrupt_at:
            raise KeyboardInterrupt
        on_live(Live(1.0, plan.planned_s, True, 3, 0, 0.6, 10.0))
        return StepOutcome(saturating_row(plan), 0, False, False, "")


@pytest.fixture
def runner(tmp_path, monkeypatch):
    monkeypatch.setattr(run_mod, "check_server", lambda url: "fake-model")
    monkeypatch.setattr(run_mod, "detect_flavour", lambda url: flavours.SPECTEST)

    def make(steps=(1, 2, 4, 8, 16, 32, 64), workloads=("chat", "code"), interrupt_at=None,
             **kw):
        cfg = SweepConfig(out=tmp_path / "sweep", workloads=workloads, steps=steps,
                          embedded=False, host="http://127.0.0.1:1", validate_k=False,
                          step_time_s=2, warmup_s=1, **kw)
        fake = FakeSteps(interrupt_at)
        return run_mod.SweepRunner(cfg, Display(Console(file=open("/dev/null", "w"))),
                                   step_fn=fake), fake
    return make


def test_arms_alternate_order_and_hit_one_server(runner):
    r, fake = runner(steps=(1, 2, 4), workloads=("chat",), patience=0)
    result = r.run()
    assert result.status == "finished" and result.steps == 6
    assert [(p.arm, p.concurrency) for p in fake.plans] == [
        ("spec", 1), ("base", 1), ("base", 2), ("spec", 2), ("spec", 4), ("base", 4)]
    assert {p.speculative for p in fake.plans if p.arm == "spec"} == {"on"}
    assert {p.speculative for p in fake.plans if p.arm == "base"} == {"off"}
    assert fake.plans[0].run_dir == r.out / "runs" / "chat" / "spec" / "c1"
    assert (fake.plans[0].window_s, fake.plans[0].windows, fake.plans[0].warmup) == (1, 2, True)


def test_series_stop_two_steps_past_their_knee(runner):
    r, fake = runner()
    result = r.run()
    table = pd.read_csv(result.folder / "steps.csv")
    for w in ("chat", "code"):
        # spec saturates at 4: steps 8 and 16 are past it; base at 8: 16 and 32
        assert sorted(table[(table.workload == w) & (table.arm == "spec")].concurrency) == \
            [1, 2, 4, 8, 16]
        assert sorted(table[(table.workload == w) & (table.arm == "base")].concurrency) == \
            [1, 2, 4, 8, 16, 32]
    assert 64 not in {p.concurrency for p in fake.plans}  # both stopped: workload ends
    info = json.loads((result.folder / "sweep.json").read_text())
    assert info["status"] == "finished" and set(info["stopped_series"]) == {
        "chat/spec", "chat/base", "code/spec", "code/base"}
    assert any("stopping this series early" in n for n in info["notes"])


def test_interrupt_keeps_every_finished_step_and_renders(runner):
    r, _ = runner(steps=(1, 2, 4), interrupt_at=5)
    result = r.run()
    assert result.status == "interrupted" and result.steps == 4
    table = pd.read_csv(result.folder / "steps.csv")
    assert len(table) == 4 and list(table.concurrency) == [1, 1, 2, 2]
    info = json.loads((result.folder / "sweep.json").read_text())
    assert info["status"] == "interrupted" and info["finished_steps"] == 4
    assert "4 finished steps kept" in info["notes"][-1]
    out = render_report(result.folder)
    assert "Status: **interrupted**" in Path(out.markdown).read_text()


def test_an_existing_sweep_is_never_overwritten(runner):
    r, _ = runner(steps=(1,), workloads=("chat",))
    assert r.run().status == "finished"
    again, _ = runner(steps=(1,), workloads=("chat",))
    result = again.run()
    assert result.status == "failed" and "already holds a sweep" in result.message
