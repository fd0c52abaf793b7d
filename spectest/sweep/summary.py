"""One sweep step's row, from the Locust results folder the step wrote.

A step is one headless Locust run at a fixed concurrency, planned as 1 + n equal Locust steps:
the first is the warm-up and is dropped, the other n are the *measured windows*. This module
reads the loadgen files (``run.json``, ``steps.csv``, ``requests.jsonl`` — contract in
``spectest.loadgen.results``) and returns the row of ``spectest.report.table.COLUMNS``:

* latency percentiles from the requests *sent* in the measured windows;
* throughput as tokens *generated inside* the measured span: each successful request's tokens
  are spread evenly over its first-to-last-token interval and the part inside the span counts.
  This neither loses the warm-up requests still running nor counts the tail that runs after the
  span (the closed-loop users finish in-flight requests when the step stops);
* acceptance from the server's counter deltas summed over the measured windows (the per-response
  ``spec`` objects when the server has no counters);
* relative standard errors of throughput and TPOT p50 across the windows;
* bootstrap standard errors of the log of TPOT p50, output tokens/s and goodput tokens/s over
  the step's successful requests (``spectest.report.evidence``): the intervals of every ratio
  the report states. Goodput tokens are the in-window tokens of requests that met every
  per-request SLO.

It knows nothing about processes or HTTP; ``engine`` carries the round figures measured by
``engine_metrics``.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd

from spectest.loadgen import cpu
from spectest.report import evidence
from spectest.report.table import COLUMNS, LATENCIES, PERCENTILES


def read_requests(path: Path) -> pd.DataFrame:
    """``requests.jsonl`` as a frame (a torn last line after a hard kill is skipped)."""
    rows = []
    if path.is_file():
        with open(path, encoding="utf-8") as f:
            for line in f:
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError:
                    continue
    return pd.DataFrame(rows)


def windows(run_info: dict, warmup_steps: int) -> list[tuple[float, float]]:
    """(start, end) unix times of the measured Locust steps that began."""
    steps = run_info.get("steps") or []
    out = []
    for i, s in enumerate(steps):
        if i < warmup_steps or s.get("started_at") is None:
            continue
        end = s.get("ended_at") or run_info.get("ended_at")
        if end is not None and end > s["started_at"]:
            out.append((float(s["started_at"]), float(end)))
    return out


def tokens_in(req: pd.DataFrame, start: float, end: float) -> float:
    """Tokens generated inside [start, end], each request's spread over its token span."""
    return float(token_shares(req, start, end).sum())


def token_shares(req: pd.DataFrame, start: float, end: float) -> np.ndarray:
    """Per request (row order): its tokens generated inside [start, end]."""
    if req.empty:
        return np.zeros(0)
    first = req.started_at + req.ttft_ms.fillna(0) / 1e3
    last = req.started_at + req.e2el_ms.fillna(0) / 1e3
    span = (last - first).to_numpy()
    overlap = (np.minimum(last, end) - np.maximum(first, start)).clip(lower=0).to_numpy()
    inside = ((last >= start) & (last <= end)).to_numpy()
    frac = np.where(span > 0, overlap / np.where(span > 0, span, 1), inside.astype(float))
    return req.output_tokens.fillna(0).to_numpy(dtype=float) * frac


def _pct(values: pd.Series | np.ndarray, p: float) -> float | None:
    v = np.asarray(values, dtype=float)
    v = v[~np.isnan(v)]
    return float(np.percentile(v, p)) if len(v) else None


def _rse(values: list[float]) -> float | None:
    v = np.array([x for x in values if x is not None and math.isfinite(x)], dtype=float)
    if len(v) < 2 or v.mean() <= 0:
        return None
    return float(v.std(ddof=1) / math.sqrt(len(v)) / v.mean())


def summarize(run_dir: Path, *, workload: str, arm: str, concurrency: int, warmup_steps: int,
              engine: dict | None = None, rel_to: Path | None = None) -> dict | None:
    """The sweep row of one step, or None when no measured window began."""
    run_dir = Path(run_dir)
    try:
        info = json.loads((run_dir / "run.json").read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return None
    wins = windows(info, warmup_steps)
    if not wins:
        return None
    t1, t2 = wins[0][0], wins[-1][1]
    duration = t2 - t1
    req = read_requests(run_dir / "requests.jsonl")
    if not req.empty:
        req = req[req.started_at < t2]
    measured = req[req.step >= warmup_steps] if not req.empty else req
    ok = measured[measured.ok] if not measured.empty else measured
    row: dict = {c: None for c in COLUMNS}
    n_req = len(measured)
    failures = int((~measured.ok).sum()) if n_req else 0
    row.update(workload=workload, arm=arm, concurrency=concurrency,
               started_at=round(t1, 3), duration_s=round(duration, 3), windows=len(wins),
               requests=n_req, failures=failures,
               error_rate=failures / n_req if n_req else None)
    for m in LATENCIES:
        if ok.empty:
            continue
        if m == "itl":
            values = np.concatenate([np.asarray(x, dtype=float) for x in ok.itl_ms] or [[]])
        else:
            values = ok[f"{m}_ms"].astype(float).to_numpy()
        for p in PERCENTILES:
            q = _pct(values, p)
            row[f"{m}_p{p}_ms"] = None if q is None else round(q, 3)
    if not ok.empty:
        row["tpot_mean_ms"] = round(float(ok.tpot_ms.astype(float).mean()), 3)
        row["output_tokens"] = int(ok.output_tokens.sum())
        chunks = ok.chunks.sum()
        row["tokens_per_chunk"] = float(ok.output_tokens.sum() / chunks) if chunks else None
        row["slo_attainment"] = float(ok.slo_ok.mean())
    else:
        row["output_tokens"] = 0
    good = req[req.ok] if not req.empty else req
    row["output_tokens_per_s"] = tokens_in(good, t1, t2) / duration if duration > 0 else None
    row["requests_per_s"] = len(ok) / duration if duration > 0 else None
    row["goodput_rps"] = (float(ok.slo_ok.sum()) / duration) if duration > 0 and len(ok) else 0.0
    row["output_tokens_per_s_rse"] = _rse([tokens_in(good, a, b) / (b - a) for a, b in wins])
    row.update(_intervals(ok, good, t1, t2))
    if not ok.empty and len(wins) > 1:
        row["tpot_p50_rse"] = _rse([_pct(ok[ok.step == i].tpot_ms.astype(float), 50)
                                    for i in sorted(ok.step.unique())])
    row.update(_acceptance(run_dir, warmup_steps, ok))
    if not measured.empty and "client_cpu" in measured:
        row["client_cpu"] = cpu.busiest(zip(measured.worker, measured.client_cpu))
        row["client_saturated"] = cpu.is_saturated(row["client_cpu"])
    for key, value in (engine or {}).items():
        if key == "k":
            row["k"] = value if row.get("k") is None else row["k"]
        elif key in row:
            row[key] = value
    row["run_dir"] = str(run_dir.relative_to(rel_to)) if rel_to else str(run_dir)
    return row


def _intervals(ok: pd.DataFrame, good: pd.DataFrame, t1: float, t2: float) -> dict:
    """Goodput tokens/s and the bootstrap log standard errors (``evidence``) of the step."""
    out: dict = {}
    duration = t2 - t1
    if duration <= 0:
        return out
    shares = token_shares(good, t1, t2)
    inside = shares > 0  # requests that generated tokens in the window (resampled together)
    met = (good.slo_ok.fillna(False).astype(bool).to_numpy() if "slo_ok" in good
           else np.zeros(len(good), dtype=bool))
    goodput = shares * met
    out["goodput_tokens_per_s"] = float(goodput.sum()) / duration
    out["output_tokens_per_s_log_se"] = evidence.rate_log_se(shares[inside], duration)
    if goodput.sum() > 0:
        out["goodput_tokens_per_s_log_se"] = evidence.rate_log_se(goodput[inside], duration)
    if not ok.empty:
        out["tpot_p50_log_se"] = evidence.median_log_se(ok.tpot_ms.astype(float))
    return out


def _acceptance(run_dir: Path, warmup_steps: int, ok: pd.DataFrame) -> dict:
    """Server counter deltas over the measured windows (else the responses' spec objects)."""
    out: dict = {}
    try:
        steps = pd.read_csv(run_dir / "steps.csv")
    except (OSError, pd.errors.EmptyDataError, pd.errors.ParserError):
        steps = pd.DataFrame()
    if not steps.empty:
        s = steps[(steps.workload == "all") & (steps.step >= warmup_steps)]
        src = s.acceptance_source.dropna()
        if len(src) and s.drafts.notna().any():
            drafts, dtok, acc = (float(s[c].fillna(0).sum())
                                 for c in ("drafts", "draft_tokens", "accepted_tokens"))
            out.update(acceptance_source=str(src.iloc[-1]), drafts=drafts, draft_tokens=dtok,
                       accepted_tokens=acc,
                       acceptance_rate=acc / dtok if dtok else None,
                       mean_accepted_length=1 + acc / drafts if drafts else None)
            pos = sorted((c for c in s.columns if c.startswith("acceptance_pos_")),
                         key=lambda c: int(c.rsplit("_", 1)[1]))
            for c in pos:
                out[c] = (float((s[c].fillna(0) * s.drafts.fillna(0)).sum()) / drafts
                          if drafts else None)
            return out
    specs = [x for x in (ok.spec if "spec" in ok else []) if isinstance(x, dict)]
    drafts = sum(x.get("drafts") or 0 for x in specs)
    if drafts:
        dtok = sum(x.get("draft_tokens") or 0 for x in specs)
        acc = sum(x.get("accepted_tokens") or 0 for x in specs)
        out.update(acceptance_source="client", drafts=drafts, draft_tokens=dtok,
                   accepted_tokens=acc, acceptance_rate=acc / dtok if dtok else None,
                   mean_accepted_length=1 + acc / drafts)
    return out
