"""End to end against a server spectest did not write: every locustfile vs llama.cpp's llama-server.

The speculative llama-server (SmolLM2-135M-Instruct drafting for itself, see ``conftest``) runs
each bundled workload headless for a few seconds at 2 users. Asserted per run: zero failures
(llama-server closes the connection after every streamed response: those requests are resent
and counted as reconnects, never as failures), every step carries acceptance read from
``llamacpp:`` counters, and that acceptance is exact: the counters' increase over the run, the
sum of the per-step deltas in ``steps.csv`` and the sum of the per-response
``timings.draft_n_accepted`` (normalised into ``spec``) are the same numbers.
"""

from __future__ import annotations

import json
import urllib.request

import pandas as pd
import pytest

from spectest.loadgen.runner import LocustRun, run_locust
from spectest.loadgen.scrape import ALL, parse_metrics


def counters(url: str):
    with urllib.request.urlopen(url + "/metrics", timeout=10) as resp:
        return parse_metrics(resp.read().decode()).counters.get(ALL)


@pytest.mark.parametrize("workload, seconds", [("chat", 10), ("code", 10), ("rag", 14),
                                               ("mixed", 10)])
def test_each_locustfile_measures_llama_server_exactly(llama_pair, tmp_path, workload, seconds):
    spec_url, _ = llama_pair
    before = counters(spec_url)
    outcome = run_locust(LocustRun(workload, host=spec_url, results_dir=tmp_path / "out",
                                   steps=(2,), step_time_s=seconds, max_tokens=24,
                                   stop_timeout_s=60), timeout_s=240)
    after = counters(spec_url)
    log = outcome.log_path.read_text()
    assert outcome.returncode == 0, log[-3000:]
    assert "Traceback" not in log
    rows = [json.loads(x) for x in outcome.requests_jsonl.read_text().splitlines()]
    steps = pd.read_csv(outcome.steps_csv)
    total = steps[steps.workload == "all"]
    assert len(rows) >= 2 and all(r["ok"] for r in rows), [r["error"] for r in rows][:3]
    assert int(total.failures.sum()) == 0
    assert (total.acceptance_source == "llamacpp").all()
    assert total.acceptance_rate.notna().all() and total.mean_accepted_length.notna().all()
    delta = after.since(before)
    from_responses = sum(r["spec"]["accepted_tokens"] for r in rows)
    drafted = sum(r["spec"]["draft_tokens"] for r in rows)
    assert delta.accepted == from_responses == total.accepted_tokens.sum() > 0
    assert delta.draft_tokens == drafted == total.draft_tokens.sum()
    assert all(r["spec"]["drafts"] is None for r in rows)  # llama.cpp does not say per request
