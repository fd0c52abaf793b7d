"""One real look of a sweep step (a headless Locust process against the stub server): it samples
the server's running-requests gauge every second and keeps its engine figures beside its files,
and a second look in ``look2`` is pooled into the same row; a sweep of a server that refuses
every request stops at its first step."""

import json
import subprocess
import sys

import pandas as pd

from spectest.loadgen.runner import StubProcess
from spectest.sweep.step import StepPlan, run_step
from spectest.sweep.summary import summarize


def plan(url, run_dir, c: int = 3) -> StepPlan:
    return StepPlan("chat", "spec", c, url, "on", run_dir, window_s=2.0, windows=1,
                    warmup=True, max_tokens=16, stop_timeout_s=5)


def test_a_look_samples_the_running_gauge_and_a_second_look_is_pooled(tmp_path):
    # every request takes ~0.4 s (16 tokens, a round every 40 ms): 3 users keep 3 running
    with StubProcess("--ttft-ms", "40", "--itl-ms", "40", "--spec-k", "0") as url:
        first = run_step(plan(url, tmp_path / "c3"))
        second = run_step(plan(url, tmp_path / "c3" / "look2"))
    assert first.returncode == 0, first.log_tail
    row = first.row
    assert row["running_samples"] >= 1 and 2 <= row["running_mean"] <= 3
    assert row["running_max"] <= 3 and row["looks"] == 1
    assert json.loads((tmp_path / "c3" / "engine.json").read_text()) is not None
    pooled = summarize(tmp_path / "c3", workload="chat", arm="spec", concurrency=3,
                       warmup_steps=1, rel_to=tmp_path)
    assert pooled["looks"] == 2 and pooled["windows"] == 2
    assert pooled["requests"] == row["requests"] + second.row["requests"]
    # pooled from the unrounded durations: within the two rows' rounding (0.5 ms each)
    assert abs(pooled["duration_s"] - (row["duration_s"] + second.row["duration_s"])) <= 0.0011
    assert pooled["running_samples"] == row["running_samples"] + second.row["running_samples"]
    assert pooled["run_dir"] == "c3"


def test_processes_split_the_users_over_locust_workers_and_keep_one_result(tmp_path):
    """--processes 2: Locust's master forks two workers; the step's files are the master's,
    with every worker's requests in them, and the row reads them as from one process."""
    with StubProcess("--ttft-ms", "10", "--itl-ms", "2", "--spec-k", "0") as url:
        p = StepPlan("chat", "spec", 4, url, "on", tmp_path / "p2", window_s=3, windows=1,
                     warmup=False, max_tokens=8, stop_timeout_s=10, processes=2)
        out = run_step(p)
    assert out.returncode == 0, out.log_tail
    req = [json.loads(line) for line in (p.run_dir / "requests.jsonl").read_text().splitlines()]
    assert len({r["worker"] for r in req}) == 2  # both workers sent requests
    assert all(r["ok"] for r in req) and out.row["requests"] >= 10 and out.row["failures"] == 0
    assert out.row["client_cpu"] is not None and not out.row["client_saturated"]


def test_a_sweep_of_a_server_that_fails_every_request_stops_with_its_error(tmp_path):
    """Through the CLI: a server that refuses every request (here the stub refusing
    ``max_tokens`` with a 400) is not measured look after look; the sweep stops after the first
    step with the server's own message, exit 1, and keeps that step."""
    with StubProcess("--refuse-field", "max_tokens") as url:
        proc = subprocess.run(
            [sys.executable, "-m", "spectest", "sweep", "--host", url, "--workloads", "chat",
             "--steps", "1,2", "--step-time", "2", "--warmup", "1", "--max-step-time", "6",
             "--validate-k", "off", "--out", str(tmp_path / "sweep")],
            capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-2000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert "chat spec c=1: every request failed" in last and "Unsupported param: max_tokens" \
        in last, proc.stderr[-2000:]
    steps = pd.read_csv(tmp_path / "sweep" / "steps.csv")
    assert list(steps.concurrency) == [1, 1] and (steps.looks == 1).all()
