"""One real sweep step (a headless Locust process against the stub server): a step whose planned
time holds too few requests runs on, window by window, until the report's minimum is met."""

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
