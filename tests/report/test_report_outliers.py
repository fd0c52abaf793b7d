"""The report's acceptance outliers: requests whose own acceptance lies far from their
workload's — a garbled answer (near 0) and a repetition loop (near 1) among ordinary ones."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
from report_synthetic import write_sweep

from spectest.report import outliers
from spectest.report.render import render_report


def _with_requests(folder, rng):
    """Give every speculative step a requests.jsonl: acceptance ~ N(0.6, 0.05) per request,
    plus, at c = 2 of chat, one garbled answer and one loop."""
    table = pd.read_csv(folder / "steps.csv")
    dirs = []
    for i, row in table.iterrows():
        run_dir = f"runs/{row.workload}/{row.arm}/c{row.concurrency}"
        table.loc[i, "run_dir"] = run_dir
        if row.arm != "spec":
            continue
        (folder / run_dir).mkdir(parents=True, exist_ok=True)
        rows = []
        for k in range(30):
            acc = float(np.clip(rng.normal(0.6, 0.05), 0, 1))
            rows.append({"ok": True, "record_id": f"{row.workload}-{k}",
                         "spec": {"draft_tokens": 40, "accepted_tokens": round(40 * acc)},
                         "output_head": "an ordinary answer"})
        if row.workload == "chat" and row.concurrency == 2:
            rows.append({"ok": True, "record_id": "garbled", "output_head": "xq#@ zz!!",
                         "spec": {"draft_tokens": 40, "accepted_tokens": 1}})
            rows.append({"ok": True, "record_id": "loop", "output_head": "the the the the",
                         "spec": {"draft_tokens": 40, "accepted_tokens": 40}})
            rows.append({"ok": True, "record_id": "too-short", "output_head": "",
                         "spec": {"draft_tokens": 4, "accepted_tokens": 0}})
        (folder / run_dir / "requests.jsonl").write_text(
            "".join(json.dumps(r) + "\n" for r in rows))
        dirs.append(run_dir)
    table.to_csv(folder / "steps.csv", index=False)
    return dirs


def test_outliers_are_found_named_and_quoted(tmp_path):
    folder = write_sweep(tmp_path / "sweep")
    _with_requests(folder, np.random.default_rng(0))
    requests = outliers.per_request(pd.read_csv(folder / "steps.csv"), folder)
    spreads, found = outliers.find(requests)
    assert {o.record_id: o.side for o in found} == {"garbled": "low", "loop": "high"}
    assert {s.workload for s in spreads} == {"chat", "code"}
    assert all(0.55 < s.median < 0.65 for s in spreads)
    render_report(folder)
    md = (folder / "report.md").read_text()
    section = md.split("## Acceptance outliers")[1].split("\n## ")[0]
    assert "2 outlier(s)" in section and "`garbled`" in section and "`loop`" in section
    assert "'xq#@ zz!!'" in section and "too-short" not in section


def test_a_sweep_without_per_request_stats_says_so(tmp_path):
    folder = write_sweep(tmp_path / "sweep")
    _with_requests(folder, np.random.default_rng(1))
    for path in folder.rglob("requests.jsonl"):
        path.write_text(json.dumps({"ok": True, "record_id": "r", "spec": None}) + "\n")
    render_report(folder)
    md = (folder / "report.md").read_text()
    assert "--per-request-spec-decode-metrics" in md.split("## Acceptance outliers")[1]
