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

from spectest.loadgen.runner import LocustRun, StubProcess, run_locust  # noqa: E402
from spectest.procs import free_port  # noqa: E402


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


def test_a_server_closing_kept_alive_connections_causes_no_spurious_failures(tmp_path):
    """Every reused connection is closed unread on its next request (llama-server's behaviour
    after a streamed response): the client reconnects and resends, counts it, fails nothing."""
    import http.client

    from closing_proxy import ClosingProxy

    with StubProcess("--ttft-ms", "2", "--itl-ms", "1") as stub:
        upstream = int(stub.rsplit(":", 1)[1])
        with ClosingProxy(upstream, idle_close_s=0.0) as url:
            # the fault is real: a plain keep-alive client fails its second request
            conn = http.client.HTTPConnection("127.0.0.1", int(url.rsplit(":", 1)[1]))
            conn.request("GET", "/v1/models")
            conn.getresponse().read()
            conn.request("GET", "/v1/models")
            try:
                conn.getresponse()
                plain_failed = False
            except (http.client.RemoteDisconnected, ConnectionError):
                plain_failed = True
            assert plain_failed
            outcome = run_locust(LocustRun("code", host=url, results_dir=tmp_path / "out",
                                           users=3, run_time_s=6, max_tokens=16,
                                           stop_timeout_s=5), timeout_s=90)
    rows = [json.loads(x) for x in (tmp_path / "out" / "requests.jsonl").read_text().splitlines()]
    steps = pd.read_csv(tmp_path / "out" / "steps.csv")
    log = outcome.log_path.read_text()
    assert outcome.returncode == 0, log[-2000:]
    assert len(rows) >= 20
    assert not [r for r in rows if not r["ok"]], [r["error"] for r in rows if not r["ok"]][:3]
    reconnects = sum(r["reconnects"] for r in rows)
    # every request after a user's first went out on a reused connection and was resent once
    assert reconnects >= len(rows) - 3 - 1
    total = steps[steps.workload == "all"]
    assert int(total.reconnects.sum()) == reconnects and int(total.failures.sum()) == 0


def _run_against_faulty_stub(tmp_path, *stub_args, run_time_s=5, extra=()):
    with StubProcess("--ttft-ms", "2", "--itl-ms", "1", *stub_args) as url:
        outcome = run_locust(LocustRun("chat", host=url, results_dir=tmp_path / "out", users=2,
                                       run_time_s=run_time_s, max_tokens=12, stop_timeout_s=5,
                                       extra_args=extra), timeout_s=90)
    rows = [json.loads(x) for x in (tmp_path / "out" / "requests.jsonl").read_text().splitlines()]
    steps = pd.read_csv(tmp_path / "out" / "steps.csv")
    log = outcome.log_path.read_text()
    assert "Traceback" not in log
    return outcome, rows, steps[steps.workload == "all"], log


def test_a_refused_request_field_is_one_readable_line_and_the_run_ends(tmp_path):
    outcome, rows, steps, log = _run_against_faulty_stub(
        tmp_path, "--refuse-field", "stream_options", run_time_s=30,
        extra=("--server-down-grace", "3"))
    assert rows and not any(r["ok"] for r in rows)  # every request is kept, as failed
    assert all(r["error"] == "HTTP 400: Unsupported param: stream_options" for r in rows)
    stop = [x for x in log.splitlines() if "no request has succeeded" in x]
    assert len(stop) == 1 and "Unsupported param: stream_options" in stop[0]


def test_responses_without_usage_are_counted_and_said(tmp_path):
    outcome, rows, steps, log = _run_against_faulty_stub(tmp_path, "--no-usage")
    assert outcome.returncode == 0 and rows and all(r["ok"] for r in rows)
    assert not any(r["usage_reported"] for r in rows)
    assert int(steps.usage_missing.sum()) == len(rows)
    assert "no_usage=" in log and "undercount" in log


def test_a_dropped_stream_fails_the_request_and_keeps_what_arrived(tmp_path):
    outcome, rows, steps, log = _run_against_faulty_stub(tmp_path, "--drop-after-chunks", "3")
    assert rows and not any(r["ok"] for r in rows)
    assert all(r["error"].startswith("stream broken after 3 token chunk(s)") for r in rows)
    assert all(r["chunks"] == 3 and r["ttft_ms"] is not None for r in rows)  # partial kept
    assert int(steps.failures.sum()) == len(rows)
