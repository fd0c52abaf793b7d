"""One real sweep step (a headless Locust process against the stub server): a step whose planned
time holds too few requests runs on, window by window, until the report's minimum is met."""

import json

from spectest.loadgen.runner import StubProcess
from spectest.sweep.step import EXTEND, StepPlan, run_step


def plan(url, tmp_path, min_requests: int) -> StepPlan:
    return StepPlan("chat", "spec", 1, url, "on", tmp_path / f"m{min_requests}", window_s=1.5,
                    windows=1, warmup=False, max_tokens=8, min_requests=min_requests,
                    stop_timeout_s=5)


def test_a_step_extends_until_it_has_enough_requests(tmp_path):
    # every request takes ~0.5 s (8 tokens, one every 60 ms): ~3 fit the planned 1.5 s
    with StubProcess("--ttft-ms", "60", "--itl-ms", "60", "--spec-k", "0") as url:
        short = run_step(plan(url, tmp_path, 0))
        long = run_step(plan(url, tmp_path, 10))
    assert short.extended_s == 0 and short.row["requests"] <= 6
    assert long.row["requests"] - long.row["failures"] >= 10
    assert 0 < long.extended_s <= EXTEND * 1.5
    assert long.row["duration_s"] > short.row["duration_s"] + 1


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
