"""A saturated load generator is flagged; one with headroom is not.

Real Locust runs against the stub server: 48 users on a stub that answers at once keep the
single Locust process's core busy (its CPU share is what ``client_cpu`` records); 2 users on a
stub that takes 60 ms per request leave it mostly idle. The flag must be in ``steps.csv`` and in
the summary line, and the sweep's summary of the same folder must carry it to the report.
"""

from __future__ import annotations

import time

import pandas as pd
import pytest

from spectest.loadgen import cpu
from spectest.loadgen.results import summary_line
from spectest.loadgen.runner import LocustRun, StubProcess, run_locust
from spectest.report.sections import load_generator
from spectest.sweep.summary import summarize


def locust_steps(tmp_path, users: int, *stub_args: str) -> pd.DataFrame:
    with StubProcess(*stub_args, "--spec-k", "0") as url:
        outcome = run_locust(LocustRun("chat", host=url, results_dir=tmp_path, users=users,
                                       run_time_s=8, stop_timeout_s=10), timeout_s=90)
    assert outcome.returncode == 0, outcome.log_path.read_text()[-3000:]
    return pd.read_csv(tmp_path / "steps.csv")


def test_a_saturated_client_is_flagged(tmp_path):
    steps = locust_steps(tmp_path, 48, "--ttft-ms", "0", "--itl-ms", "0", "--output-tokens", "4")
    row = steps[steps.workload == "all"].iloc[-1]
    assert row.client_cpu >= cpu.SATURATED and bool(row.client_saturated), row.client_cpu
    assert "load generator saturated" in summary_line(row.to_dict())
    swept = summarize(tmp_path, workload="chat", arm="spec", concurrency=48, warmup_steps=0)
    assert swept["client_saturated"] and swept["client_cpu"] >= cpu.SATURATED
    text = load_generator(pd.DataFrame([swept]))
    assert "Load generator saturated in 1 step(s)" in text and "--processes" in text


def test_a_client_with_headroom_is_not(tmp_path):
    steps = locust_steps(tmp_path, 2, "--ttft-ms", "40", "--itl-ms", "5", "--output-tokens", "4")
    row = steps[steps.workload == "all"].iloc[-1]
    assert row.client_cpu < 0.5 and not bool(row.client_saturated), row.client_cpu
    assert "saturated" not in summary_line(row.to_dict())
    swept = summarize(tmp_path, workload="chat", arm="spec", concurrency=2, warmup_steps=0)
    assert not swept["client_saturated"]
    assert "it had headroom" in load_generator(pd.DataFrame([swept]))


def test_meter_and_busiest_process():
    ticks = iter([0.0, 0.5, 1.0, 2.0])
    cpu_used = iter([0.0, 0.9, 1.7])
    meter = cpu.CpuMeter(window_s=1.0, clock=lambda: next(ticks), cpu_clock=lambda: next(cpu_used))
    assert meter.fraction() is None  # half a second: no window yet
    assert meter.fraction() == pytest.approx(0.9)  # 0.9 s of CPU in 1 s
    assert meter.fraction() == pytest.approx(0.8)
    assert cpu.busiest([("a", 0.2), ("a", 0.4), ("b", 0.9), ("b", None)]) == pytest.approx(0.9)
    assert cpu.busiest([]) is None and cpu.busiest([("a", None)]) is None


def test_core_demand_counts_time_on_the_core():
    before, t0 = cpu.core_demand_seconds(), time.monotonic()
    while time.monotonic() - t0 < 0.3:  # busy: on the core or waiting for it all along
        pass
    spent = cpu.core_demand_seconds() - before
    assert 0.25 <= spent <= time.monotonic() - t0 + 0.05
