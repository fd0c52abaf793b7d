"""Requests whose own acceptance stands out from their workload's: a quality signal.

Owns: reading every speculative step's ``requests.jsonl`` of a sweep for each response's own
acceptance (accepted / draft tokens: spectest's ``spec``, vLLM's per-request stats, llama.cpp's
``timings``), the per-workload distribution (median and quartiles over requests with at least
``MIN_DRAFT_TOKENS`` draft tokens), and the requests far outside it — Tukey's far-out fences
(beyond 3 interquartile ranges from the quartiles) and at least ``MIN_GAP`` from the median, so
a tight distribution does not flag ordinary requests. Very low acceptance goes with garbled or
off-distribution output (the draft cannot follow what the target writes), very high with
repetition loops (the draft predicts the loop); the section lists each such request with its
prompt id and the first characters of its output, so a person can look.

Does not know: how the report is laid out (``render``) or statistics beyond this rule.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from spectest.report.document import Section, Table, fmt

MIN_DRAFT_TOKENS = 8  # fewer drafts say little about a request's acceptance
FENCE = 3.0  # interquartile ranges beyond the quartiles (Tukey's "far out")
MIN_GAP = 0.25  # and at least this far from the workload's median
LIST_AT_MOST = 12


@dataclass(frozen=True)
class Outlier:
    workload: str
    concurrency: int
    record_id: str
    acceptance: float
    draft_tokens: int
    median: float
    side: str  # "low" | "high"
    head: str


@dataclass(frozen=True)
class Spread:
    workload: str
    requests: int  # with at least MIN_DRAFT_TOKENS draft tokens
    median: float
    q1: float
    q3: float


def per_request(table: pd.DataFrame, folder: Path) -> pd.DataFrame:
    """Every speculative request of the sweep with its own acceptance (and what it said)."""
    rows = []
    spec_steps = table[table.arm == "spec"] if "arm" in table else table.iloc[0:0]
    for _, step in spec_steps.iterrows():
        path = folder / str(step.get("run_dir", "")) / "requests.jsonl"
        if not path.is_file():
            continue
        with open(path, encoding="utf-8") as f:
            for line in f:
                try:
                    r = json.loads(line)
                except json.JSONDecodeError:
                    continue  # a torn last line after a hard kill
                spec = r.get("spec") or {}
                if not r.get("ok") or not spec.get("draft_tokens"):
                    continue
                rows.append({"workload": step.workload, "concurrency": int(step.concurrency),
                             "record_id": r.get("record_id", ""),
                             "draft_tokens": int(spec["draft_tokens"]),
                             "acceptance": (spec.get("accepted_tokens") or 0)
                             / spec["draft_tokens"],
                             "head": r.get("output_head") or ""})
    return pd.DataFrame(rows, columns=["workload", "concurrency", "record_id", "draft_tokens",
                                       "acceptance", "head"])


def find(requests: pd.DataFrame) -> tuple[list[Spread], list[Outlier]]:
    spreads, outliers = [], []
    for w, g in requests[requests.draft_tokens >= MIN_DRAFT_TOKENS].groupby("workload"):
        a = g.acceptance.to_numpy()
        q1, median, q3 = (float(x) for x in np.percentile(a, [25, 50, 75]))
        spreads.append(Spread(str(w), len(g), median, q1, q3))
        if len(g) < 8:
            continue  # too few to call anything an outlier
        low = min(q1 - FENCE * (q3 - q1), median - MIN_GAP)
        high = max(q3 + FENCE * (q3 - q1), median + MIN_GAP)
        for _, r in g[(g.acceptance < low) | (g.acceptance > high)].iterrows():
            outliers.append(Outlier(str(w), int(r.concurrency), str(r.record_id),
                                    float(r.acceptance), int(r.draft_tokens), median,
                                    "low" if r.acceptance < low else "high", str(r["head"])))
    return spreads, outliers


def section(table: pd.DataFrame, folder: Path) -> Section:
    requests = per_request(table, folder)
    spec_dirs = table[table.arm == "spec"].run_dir if "arm" in table and "run_dir" in table \
        else []
    if not any((folder / str(d) / "requests.jsonl").is_file() for d in spec_dirs):
        return Section("Acceptance outliers", [
            "Not available: this folder keeps no speculative step's requests.jsonl (runs/)."])
    if requests.empty:
        return Section("Acceptance outliers", [
            "No per-request acceptance in this sweep: the speculative server's responses carry "
            "no draft statistics (vLLM: start it with --per-request-spec-decode-metrics "
            "summary)."])
    spreads, outliers = find(requests)
    lines = [f"Each request's own acceptance against its workload's (requests with at least "
             f"{MIN_DRAFT_TOKENS} draft tokens); an outlier lies beyond {FENCE:g} interquartile "
             f"ranges from the quartiles and at least {MIN_GAP:g} from the median. Very low "
             f"acceptance goes with garbled or off-distribution output, very high with "
             f"repetition loops."]
    spread = Table(["workload", "requests", "median", "quartiles"],
                   [[s.workload, str(s.requests), fmt(s.median, ".3f"),
                     f"{fmt(s.q1, '.3f')} – {fmt(s.q3, '.3f')}"] for s in spreads])
    if not outliers:
        return Section("Acceptance outliers", lines + [spread, "No request stands out."])
    shown = sorted(outliers, key=lambda o: -abs(o.acceptance - o.median))[:LIST_AT_MOST]
    listed = Table(["workload", "c", "prompt", "acceptance (draft tokens)", "vs median",
                    "output begins"],
                   [[o.workload, str(o.concurrency), f"`{o.record_id}`",
                     f"{o.acceptance:.2f} ({o.draft_tokens})",
                     f"{o.side}, median {o.median:.2f}",
                     repr(o.head[:60]) if o.head else "(not recorded)"] for o in shown])
    more = ([f"{len(outliers) - len(shown)} more outliers not listed."]
            if len(outliers) > len(shown) else [])
    return Section("Acceptance outliers", lines + [spread, f"{len(outliers)} outlier(s):",
                                                   listed] + more)
