"""Every locustfile against real vLLM: acceptance per workload from the per-request stats.

vLLM's counters carry no workload label, so the ``all`` row of each step gets its acceptance from
the counters and each workload's row from the responses' ``metrics.speculative_decoding`` —
and the two are the same numbers: over a run, the workload rows sum to the counters' increase
and to the per-request stats in ``requests.jsonl``. Zero failures, no traceback.
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


@pytest.mark.parametrize("workload, method", [("chat", "ngram"), ("code", "ngram"),
                                              ("rag", "draft-model"), ("mixed", "ngram"),
                                              ("mixed", "draft-model")])
def test_each_locustfile_gets_per_workload_acceptance_from_vllm(vllm, tmp_path, workload,
                                                                method):
    url = vllm.by_method(method)
    before = counters(url)
    outcome = run_locust(LocustRun(workload, host=url, results_dir=tmp_path / "out",
                                   steps=(2,), step_time_s=10, max_tokens=32,
                                   stop_timeout_s=60), timeout_s=240)
    delta = counters(url).since(before)
    log = outcome.log_path.read_text()
    assert outcome.returncode == 0, log[-3000:]
    assert "Traceback" not in log
    rows = [json.loads(x) for x in outcome.requests_jsonl.read_text().splitlines()]
    assert len(rows) >= 2 and all(r["ok"] for r in rows), [r["error"] for r in rows][:3]
    steps = pd.read_csv(outcome.steps_csv)
    total, per = steps[steps.workload == "all"], steps[steps.workload != "all"]
    assert (total.acceptance_source == "vllm").all() and int(total.failures.sum()) == 0
    assert (per.acceptance_source == "responses").all() and per.acceptance_rate.notna().all()
    assert per.mean_accepted_length.notna().all() and per.acceptance_note.isna().all()
    for field, counter in (("accepted_tokens", "accepted"), ("draft_tokens", "draft_tokens"),
                           ("drafts", "drafts")):
        from_rows = sum(r["spec"][field] for r in rows)
        assert per[field].sum() == from_rows == getattr(delta, counter) == total[field].sum()
    assert delta.accepted > 0
