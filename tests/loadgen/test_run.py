"""A stop asked for as a step ends keeps that step (``LoadRun.finish`` / ``defer_interrupt``).

The sweep ends a step's Locust run with SIGTERM once enough requests have finished. When that
lands just as Locust's own step ends, the run is in ``finish``: its final /metrics scrape of a
busy server can take seconds. A SIGTERM raised there used to abort the write, leaving
``run.json`` with status "running" and an open step, which the sweep read as "Locust measured
nothing". A real Locust run against the stub, whose /metrics answers 2 s late, is stopped while
that final scrape is in flight.
"""

from __future__ import annotations

import json
import time

from spectest.loadgen.runner import LocustProcess, LocustRun, StubProcess


def _wait_for(path, text: str, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if path.exists() and text in path.read_text(errors="replace"):
            return True
        time.sleep(0.05)
    return False


def test_a_stop_during_the_final_scrape_keeps_the_step(tmp_path):
    with StubProcess("--metrics-delay-ms", "2000", "--ttft-ms", "5", "--itl-ms", "2") as url:
        run = LocustRun("chat", url, tmp_path, steps=(1,), step_time_s=1.0, max_tokens=16,
                        stop_timeout_s=5, extra_args=("--metrics-url", url + "/metrics"))
        with LocustProcess(run) as locust:
            assert _wait_for(locust.log_path, "Shape test stopping", 60), \
                locust.log_path.read_text()[-3000:]
            locust.terminate()  # the final scrape (2 s) has just begun
            assert locust.wait(30)
    log = locust.log_path.read_text()
    assert locust.returncode == 0, log[-3000:]
    info = json.loads((tmp_path / "run.json").read_text())
    # "finished" when the stop landed in ``finish``, "interrupted" just before it: closed both
    assert info["status"] in ("finished", "interrupted") and info["ended_at"], info
    [step] = info["steps"]
    assert step["ended_at"] is not None and step["ended_at"] > step["started_at"], info
    assert (tmp_path / "requests.jsonl").read_text().strip()  # the step's request rows
    assert "Exiting due to CTRL+C interruption" in log  # the stop was not lost either
