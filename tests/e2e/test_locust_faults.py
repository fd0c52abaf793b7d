"""Faults: the server is down at start, or dies in the middle of a run.

Both runs are headless Locust subprocesses bounded by ``run_locust``'s timeout; the second
also bounds itself (``--server-down-grace``) long before its 60 s ``--run-time``.
"""

import json
import sys
import threading
import time
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from spectest.loadgen.runner import LocustRun, StubProcess, free_port, run_locust  # noqa: E402


def test_server_down_at_start_is_one_clear_line_and_a_nonzero_exit(tmp_path):
    host = f"http://127.0.0.1:{free_port()}"
    t0 = time.monotonic()
    outcome = run_locust(LocustRun("chat", host=host, results_dir=tmp_path / "out",
                                   users=2, run_time_s=30), timeout_s=60)
    log = outcome.log_path.read_text()
    assert outcome.returncode == 2 and not outcome.timed_out
    assert time.monotonic() - t0 < 20
    assert f"cannot reach the server at {host}" in log and "is it running?" in log
    assert "Traceback" not in log
    assert not (tmp_path / "out" / "requests.jsonl").exists()  # nothing was measured


def test_bad_flag_is_one_readable_line(tmp_path):
    outcome = run_locust(LocustRun("chat", host="http://127.0.0.1:1", results_dir=tmp_path,
                                   users=1, run_time_s=5, extra_args=("--max-tokens", "-3")),
                         timeout_s=60)
    log = outcome.log_path.read_text()
    assert outcome.returncode == 2
    assert "spectest: --max-tokens and --max-prompt-chars must be >= 0" in log
    assert "Traceback" not in log


def test_server_killed_mid_run_counts_failures_keeps_results_and_ends(tmp_path):
    out = tmp_path / "out"
    stub = StubProcess("--ttft-ms", "5", "--itl-ms", "2")
    url = stub.__enter__()
    try:
        killer = threading.Timer(3.0, stub.kill)
        killer.start()
        t0 = time.monotonic()
        outcome = run_locust(LocustRun(
            "rag", host=url, results_dir=out, users=4, run_time_s=60, max_tokens=32,
            stop_timeout_s=5, extra_args=("--server-down-grace", "3")), timeout_s=90)
        elapsed = time.monotonic() - t0
    finally:
        killer.cancel()
        stub.__exit__(None, None, None)
    log = outcome.log_path.read_text()
    assert not outcome.timed_out and elapsed < 30, f"the run did not end on its own: {elapsed}"
    assert outcome.returncode == 1  # Locust's exit code when requests failed
    assert "stopping the run" in log and "Traceback" not in log
    rows = [json.loads(x) for x in (out / "requests.jsonl").read_text().splitlines()]
    ok = [r for r in rows if r["ok"]]
    failed = [r for r in rows if not r["ok"]]
    assert len(ok) > 20 and len(failed) >= 1
    assert all(r["error"] for r in failed)
    df = pd.read_csv(out / "steps.csv")
    total = df[df.workload == "all"].iloc[0]
    assert total.requests == len(rows) and total.failures == len(failed)
    assert total.ttft_p50_ms > 0  # what was measured before the crash is kept
    assert json.loads((out / "run.json").read_text())["status"] == "finished"
