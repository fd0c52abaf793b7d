"""Real Locust runs (subprocesses, loopback) of every locustfile against the stub server.

Each test is bounded by the plan (a few seconds) and by ``run_locust``'s timeout; the stub is
stopped when its ``with`` block ends. What they prove: the locustfiles run headless with zero
failures and sane latencies, the per-step acceptance equals the server's own counters and the
per-response ``spec`` objects, Locust's ``--csv`` rows are named by category, distributed runs
collect both workers' requests on the master, open-loop Poisson steps offer the asked rate, and
the web UI shows live acceptance.
"""

import json
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from spectest.loadgen.runner import LocustRun, StubProcess, locust_env, run_locust  # noqa: E402
from spectest.procs import free_port  # noqa: E402
from spectest.loadgen.scrape import ALL, parse_metrics  # noqa: E402

STUB = ("--ttft-ms", "5", "--itl-ms", "2", "--spec-k", "3", "--accept-prob", "0.7")


def read_requests(folder: Path) -> list[dict]:
    return [json.loads(x) for x in (folder / "requests.jsonl").read_text().splitlines()]


def server_counters(url: str) -> dict:
    with urllib.request.urlopen(url + "/metrics") as r:
        return parse_metrics(r.read().decode()).counters


@pytest.mark.parametrize("workload, steps", [("chat", ()), ("code", ()), ("rag", ()),
                                             ("mixed", (2, 4))])
def test_locustfile_runs_headless_and_acceptance_matches_the_server(tmp_path, workload, steps):
    out = tmp_path / "out"
    with StubProcess(*STUB) as url:
        outcome = run_locust(LocustRun(
            workload, host=url, results_dir=out, steps=steps, step_time_s=2.5, users=3,
            run_time_s=None if steps else 3, max_tokens=24, stop_timeout_s=10,
            extra_args=("--csv", str(tmp_path / "locust"))), timeout_s=60)
        counters = server_counters(url)
    log = outcome.log_path.read_text()
    assert outcome.returncode == 0, log[-3000:]
    df = pd.read_csv(outcome.steps_csv)
    rows = read_requests(out)
    categories = {"mixed": {"chat", "code", "rag"}}.get(workload, {workload})
    assert {r["workload"] for r in rows} == categories
    assert len(rows) > 20 and all(r["ok"] for r in rows) and df.failures.sum() == 0
    total = df[df.workload == ALL]
    assert list(total.users) == (list(steps) or [3])
    # sane latencies: the stub waits 5 ms for the first token and 2 ms per round
    assert (total.ttft_p50_ms >= 5).all() and (total.ttft_p50_ms < 60).all()
    assert (total.itl_p50_ms >= 1.5).all() and (total.itl_p50_ms < 30).all()
    assert (total.tpot_p50_ms > 0).all() and (total.tpot_p50_ms < total.itl_p50_ms).all()
    assert (total.tokens_per_chunk > 1).all()  # a round's accepted drafts share a chunk
    # acceptance per step sums to the server's own counters, per workload and in total
    for key in categories | {ALL}:
        part = df[df.workload == key]
        assert part.accepted_tokens.sum() == counters[key].accepted
        assert part.draft_tokens.sum() == counters[key].draft_tokens
        mine = [r["spec"] for r in rows if key in (ALL, r["workload"])]
        assert sum(s["accepted_tokens"] for s in mine) == counters[key].accepted
    assert total.acceptance_rate.between(0.3, 0.9).all()
    # Locust's own --csv: one row per category (request name), no failures
    stats = pd.read_csv(tmp_path / "locust_stats.csv")
    assert set(stats.Name) - {"Aggregated"} == categories
    assert stats["Failure Count"].sum() == 0


def test_distributed_master_collects_both_workers_requests(tmp_path):
    out = tmp_path / "out"
    with StubProcess(*STUB) as url:
        outcome = run_locust(LocustRun(
            "chat", host=url, results_dir=out, steps=(2, 4), step_time_s=3, max_tokens=16,
            workers=2, stop_timeout_s=10, extra_args=("--csv", str(tmp_path / "locust"))),
            timeout_s=90)
        with urllib.request.urlopen(url + "/stub/timings") as r:
            served = json.loads(r.read())
    assert outcome.returncode == 0, outcome.log_path.read_text()[-3000:]
    rows = read_requests(out)
    assert len({r["worker"] for r in rows}) == 2
    by_worker = pd.Series([r["worker"] for r in rows]).value_counts()
    assert by_worker.min() > 10
    stats = pd.read_csv(tmp_path / "locust_stats.csv").set_index("Name")
    assert stats.loc["Aggregated", "Request Count"] == len(rows) == len(served)
    df = pd.read_csv(outcome.steps_csv)
    assert list(df[df.workload == ALL].users) == [2, 4] and df.failures.sum() == 0


def test_open_loop_poisson_steps_offer_the_asked_rate(tmp_path):
    out = tmp_path / "out"
    with StubProcess("--ttft-ms", "2", "--itl-ms", "1", "--spec-k", "0") as url:
        outcome = run_locust(LocustRun(
            "code", host=url, results_dir=out, request_rates=(10, 40), step_time_s=4,
            max_tokens=8, stop_timeout_s=5, extra_args=("--max-users", "16")), timeout_s=60)
    assert outcome.returncode == 0, outcome.log_path.read_text()[-3000:]
    df = pd.read_csv(outcome.steps_csv)
    total = df[df.workload == ALL].set_index("step")
    assert list(total.request_rate) == [10, 40] and list(total.users) == [16, 16]
    for step, rate in ((0, 10), (1, 40)):
        expected = rate * total.loc[step, "duration_s"]
        # Poisson counts: within 4 standard deviations of the offered rate
        assert abs(total.loc[step, "requests"] - expected) < 4 * expected ** 0.5 + 2
    lags = [r["schedule_lag_ms"] for r in read_requests(out)]
    assert all(lag is not None for lag in lags)
    assert pd.Series(lags).quantile(0.9) < 20  # arrivals go out on schedule


def test_web_ui_shows_live_acceptance_and_charts(tmp_path):
    """The tab's table, and the charts above it: ``--speculative ab`` alternates the switch, so
    the live series has TPOT with speculation on and off and the running step's ratio with its
    interval (the page gets the script that draws them; a browser renders them: docs)."""
    port = free_port()
    with StubProcess(*STUB) as url:
        env = locust_env()
        proc = subprocess.Popen(
            [sys.executable, "-m", "locust", "-f", str(ROOT / "workloads" / "rag.py"),
             "--host", url, "--web-host", "127.0.0.1", "--web-port", str(port), "--autostart",
             "--steps", "2", "--step-time", "12", "--autoquit", "1", "--scrape-interval", "1",
             "--speculative", "ab", "--max-tokens", "16", "--results-dir", str(tmp_path / "out")],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env)
        base = f"http://127.0.0.1:{port}"
        try:
            page = stats = csv = charts = None
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                time.sleep(0.5)
                try:
                    page = urllib.request.urlopen(f"{base}/").read().decode()
                    stats = json.loads(urllib.request.urlopen(f"{base}/stats/requests").read())
                    csv = urllib.request.urlopen(f"{base}/spectest/steps.csv").read().decode()
                    charts = json.loads(urllib.request.urlopen(f"{base}/spectest/live.json")
                                        .read())
                    script = urllib.request.urlopen(f"{base}/spectest/live.js").read().decode()
                except OSError:
                    continue
                live = {e["key"]: e["data"] for e in stats.get("extended_stats", [])}
                rows = live.get("spectest") or []
                points = charts["workloads"].get("rag") or []
                if any(r["workload"] == "all" and r["acceptance_rate"] != "" for r in rows) \
                        and any(p.get("ratio") for p in points):
                    break
            proc.wait(timeout=40)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            proc.stdout.close()
    assert "Speculative decoding" in page and '<script src="/spectest/live.js">' in page
    assert "spectest-live-charts" in script
    row = next(r for r in rows if r["workload"] == "all")
    assert 0 < row["acceptance_rate"] < 1 and row["mean_accepted_length"] > 1
    assert row["requests"] > 0 and row["ttft_p50_ms"] >= 5
    assert csv.startswith("step,workload,users")
    # the stub speculates per request as asked: on requests get several tokens a round
    point = next(p for p in charts["workloads"]["rag"] if p.get("ratio"))
    assert point["n_on"] >= 2 and point["n_off"] >= 2 and 0 < point["acceptance"] < 1
    assert point["tpot_on"] < point["tpot_off"] and point["low"] < point["ratio"] < point["high"]
    assert charts["looks"] == 2 and point["z"] > 2  # 12 s step, a look every 5 s
    sent = [json.loads(x) for x in (tmp_path / "out" / "requests.jsonl").read_text().splitlines()]
    assert {x["speculative"] for x in sent} == {"on", "off"}


def test_the_last_step_ends_with_its_last_byte_not_with_a_slow_final_scrape(tmp_path):
    """A busy server answers ``/metrics`` late. The final scrape comes after the load stopped;
    the step's rates must divide by the time requests were in flight, not by the scrape's:
    ``duration_s`` ends at the last token received."""
    out = tmp_path / "out"
    with StubProcess("--ttft-ms", "5", "--itl-ms", "2", "--metrics-delay-ms", "2500") as url:
        outcome = run_locust(LocustRun("chat", host=url, results_dir=out, steps=(2,),
                                       step_time_s=5, max_tokens=16, stop_timeout_s=10),
                             timeout_s=90)
    assert outcome.returncode == 0, outcome.log_path.read_text()[-2000:]
    rows = read_requests(out)
    last_byte = max(r["started_at"] + r["e2el_ms"] / 1e3 for r in rows if r["ok"])
    run = json.loads((out / "run.json").read_text())
    step = run["steps"][-1]
    assert step["ended_at"] == pytest.approx(last_byte, abs=1e-3)
    assert run["ended_at"] - step["ended_at"] > 2.0  # the final scrape came after it
    total = pd.read_csv(outcome.steps_csv).query("workload == 'all'").iloc[-1]
    tokens = sum(r["output_tokens"] for r in rows if r["ok"])
    assert total.duration_s == pytest.approx(last_byte - step["started_at"], abs=0.01)
    assert total.output_tokens_per_s == pytest.approx(tokens / total.duration_s, rel=1e-3)
