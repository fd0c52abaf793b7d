"""The sweep's control flow on synthetic steps: arm order, early stop past saturation, decisive
steps (another look until the verdict is settled, or the cap), and an interruption that keeps
every finished step.

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

from spectest import flavours, procs
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
             fake=None, pool_fn=None, **kw):
        kw.setdefault("max_step_time_s", 2)  # one look per step unless a test asks for more
        cfg = SweepConfig(out=tmp_path / "sweep", workloads=workloads, steps=steps,
                          embedded=False, host="http://127.0.0.1:1", verify_advice=False,
                          step_time_s=2, warmup_s=1, **kw)
        fake = fake or FakeSteps(interrupt_at)
        return run_mod.SweepRunner(cfg, Display(Console(file=open("/dev/null", "w"))),
                                   step_fn=fake, pool_fn=pool_fn), fake
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


def test_a_sigterm_whose_interrupt_python_dropped_still_stops_the_sweep(runner):
    """A KeyboardInterrupt raised by the SIGTERM handler inside a finalizer is dropped by
    Python; the flag the handler set stops the sweep at the next poll of the step under way
    (the step does not count), keeping the finished ones."""
    terminated = procs.Terminated()
    steps = FakeSteps()

    def step(plan, on_live=None, rel_to=None):
        if len(steps.plans) == 2:  # the third look: SIGTERM came, its interrupt was lost
            terminated.signalled = True
        return steps(plan, on_live, rel_to)
    r, _ = runner(steps=(1, 2, 4), fake=step)
    r.terminated = terminated
    result = r.run()
    assert result.status == "interrupted" and result.steps == 2 and len(steps.plans) == 3


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


def test_a_step_where_every_request_failed_ends_the_sweep_with_the_error(runner):
    """A server that answers every request with an error (the bundled engine's first GPU run
    did) is not measured look after look: the sweep keeps the step in its table, stops, and
    says what the requests ended with."""
    steps = FakeSteps()

    def step(plan, on_live=None, rel_to=None):
        outcome = steps(plan, on_live, rel_to)
        if plan.arm != "spec" or plan.concurrency < 2:
            return outcome
        plan.run_dir.mkdir(parents=True, exist_ok=True)
        (plan.run_dir / "requests.jsonl").write_text("".join(
            json.dumps({"ok": False, "error": "HTTP 500: prefill failed"}) + "\n"
            for _ in range(5)))
        return StepOutcome({**outcome.row, "requests": 5, "failures": 5, "error_rate": 1.0},
                           0, False, False, "")
    r, _ = runner(steps=(1, 2, 4), workloads=("chat",), fake=step, max_step_time_s=8,
                  pool_fn=lambda run_dir, outcomes, **kw: outcomes[-1].row)  # up to 4 looks
    result = r.run()
    assert result.status == "failed"
    assert result.message.startswith("chat spec c=2: every request failed (5 of 5): HTTP 500: "
                                     "prefill failed; requests: ")
    assert [(p.arm, p.concurrency, p.run_dir.name) for p in steps.plans][-2:] == [
        ("base", 2, "c2"), ("spec", 2, "c2")]  # one look: another would settle nothing
    table = pd.read_csv(result.folder / "steps.csv")
    assert list(table.concurrency) == [1, 1, 2, 2]
    assert list(table.error_rate) == [0.0, 0.0, 1.0, 0.0]  # spec, base at each step


def test_an_existing_sweep_is_never_overwritten(runner):
    r, _ = runner(steps=(1,), workloads=("chat",))
    assert r.run().status == "finished"
    again, _ = runner(steps=(1,), workloads=("chat",))
    result = again.run()
    assert result.status == "failed" and "already holds a sweep" in result.message


class NoisySteps(FakeSteps):
    """Rows with an interval that shrinks as looks add up: speculation 20 % ahead at c=1
    (clear from the first look) and 4 % ahead at c=2 (inside the even band only once its
    interval is narrow)."""

    SE = 0.09  # per look and arm, on both metrics

    def __call__(self, plan, on_live=None, rel_to=None):
        self.plans.append(plan)
        gain = {1: 1.2, 2: 1.04}[plan.concurrency] if plan.arm == "spec" else 1.0
        row = {"workload": plan.workload, "arm": plan.arm, "concurrency": plan.concurrency,
               "requests": 30, "failures": 0, "tpot_p50_ms": 10.0 / gain,
               "output_tokens_per_s": 100.0 * gain, "tpot_p50_log_se": self.SE,
               "output_tokens_per_s_log_se": self.SE, "run_dir": str(plan.run_dir)}
        return StepOutcome(row, 0, False, False, "")


def pool_looks(run_dir, outcomes, **kw):
    """n looks pooled: the same figures, n times the requests, the SE over √n."""
    row = dict(outcomes[-1].row)
    n = len(outcomes)
    row.update(requests=30 * n, tpot_p50_log_se=NoisySteps.SE / n ** 0.5,
               output_tokens_per_s_log_se=NoisySteps.SE / n ** 0.5)
    return row


def test_a_step_runs_more_looks_until_its_verdicts_are_settled_or_the_cap(runner):
    r, fake = runner(steps=(1, 2), workloads=("chat",), patience=0, fake=NoisySteps(),
                     pool_fn=pool_looks, max_step_time_s=8)  # up to 4 looks of 2 s
    assert r.cfg.looks == 4
    result = r.run()
    assert result.status == "finished"
    looks = [(p.arm, p.concurrency, p.run_dir.name) for p in fake.plans]
    # c=1: 1.2× has an interval of 1.2·exp(±z·0.09·√(2/n)): z = 2.37 at looks 1 and 2 keeps
    # its low end under 1.0× (0.86×, 0.97×); look 3 (z 2.36, n 3): 1.01×–1.43×, ahead on both
    # metrics, settled. c=2: 1.04× needs the interval inside 0.91–1.10: not before the cap
    assert looks[:6] == [("spec", 1, "c1"), ("base", 1, "c1"), ("base", 1, "look2"),
                         ("spec", 1, "look2"), ("spec", 1, "look3"), ("base", 1, "look3")]
    assert [x for x in looks if x[1] == 2][-1][2] == "look4"
    table = pd.read_csv(result.folder / "steps.csv")
    one = table[table.concurrency == 1].iloc[0]
    two = table[table.concurrency == 2].iloc[0]
    assert (one.looks, one.decided) == (3, "settled") and (two.looks, two.decided) == (4, "cap")
    from spectest.report import sequential
    assert one.interval_z == pytest.approx(sequential.critical_values(4)[2], abs=1e-3)
    assert two.interval_z == pytest.approx(sequential.critical_values(4)[3], abs=1e-3)


class CrossingSteps(FakeSteps):
    """Speculation clearly ahead at c=1 and 2, clearly behind at c=4 (a crossover between 2
    and 4); the server's gauge reads 0.9 × c. The advised arm runs on its own URL."""

    def __call__(self, plan, on_live=None, rel_to=None):
        self.plans.append(plan)
        gain = {1: 1.5, 2: 1.3, 4: 0.7}[plan.concurrency]
        advised_on = plan.host.endswith(":2") and 0.9 * plan.concurrency <= 2  # its schedule
        on = plan.arm in ("spec", "verify-on") or advised_on
        tpot = 10.0 / gain if on else 10.0
        row = {"workload": plan.workload, "arm": plan.arm, "concurrency": plan.concurrency,
               "k": 4 if on else None, "requests": 40, "failures": 0, "tpot_p50_ms": tpot,
               "output_tokens_per_s": 1000.0 / tpot, "tpot_p50_log_se": 0.02,
               "output_tokens_per_s_log_se": 0.02, "drafts": 100 if on else 0,
               "draft_tokens": 400 if on else 0, "running_mean": 0.9 * plan.concurrency,
               "running_min": 0.5 * plan.concurrency, "running_max": plan.concurrency,
               "run_dir": str(plan.run_dir)}
        return StepOutcome(row, 0, False, False, "")


class FakeServer:
    started: list = []

    def __init__(self, args, log_path, **kw):
        self.args = list(args)
        FakeServer.started.append(self.args)

    def __enter__(self):
        return f"http://127.0.0.1:{len(FakeServer.started)}"

    def __exit__(self, *exc):
        return False


def test_the_advised_schedule_runs_beside_fresh_on_and_off_arms(tmp_path, monkeypatch):
    monkeypatch.setattr(run_mod, "check_server", lambda url: "fake-model")
    monkeypatch.setattr(run_mod, "detect_flavour", lambda url: flavours.SPECTEST)
    FakeServer.started = []
    cfg = SweepConfig(out=tmp_path / "sweep", workloads=("chat",), steps=(1, 2, 4),
                      embedded=True, verify_advice=True, step_time_s=2, warmup_s=1,
                      max_step_time_s=2, patience=0)
    fake = CrossingSteps()
    r = run_mod.SweepRunner(cfg, Display(Console(file=open("/dev/null", "w"))), step_fn=fake,
                            server_factory=FakeServer)
    assert r.run().status == "finished"
    main, advised = FakeServer.started
    # the TPOT crossover at c ≈ 2.8 (between 2 and 4) is batch ≈ 2.5: K 4 up to batch 2
    assert advised[-4:] == ["--k", "4", "--disable-above", "2"] and "--k" not in advised[:-4]
    table = pd.read_csv(tmp_path / "sweep" / "steps.csv")
    verified = table[table.arm.isin(["verify-on", "verify-off", "spec-advised"])]
    assert sorted(set(verified.arm)) == ["spec-advised", "verify-off", "verify-on"]
    assert sorted(verified.concurrency.unique()) == [1, 2, 4]
    info = json.loads((tmp_path / "sweep" / "sweep.json").read_text())
    assert info["advice_verified"]["ranges"] == [[1, 2, 4], [3, 4, 0]]
    md = Path(render_report(tmp_path / "sweep").markdown).read_text()
    assert "## Verification: the advice, run" in md and "beside fresh always-on and off" in md
    # at c=4 the advised server (no speculation above batch 2) is as good as off, the better
    line = next(x for x in md.splitlines() if x.startswith("| chat | 4 |"))
    assert "vs off" in line and "as good as the better arm" in line and "K 4 → off" in line
