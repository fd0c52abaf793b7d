"""One sweep step's row, from the Locust results folders the step wrote.

A step is one headless Locust run per arm at a fixed concurrency, planned as 1 + n equal Locust
steps: the first is the warm-up and is dropped, the other n are the *measured windows*. A step
that was not yet decisive runs more *looks* — another such Locust run per arm, in ``look2``,
``look3`` … inside the first one's folder — and its row pools every look. This module reads the
loadgen files (``run.json``, ``steps.csv``, ``requests.jsonl``, ``scrapes.jsonl`` — contract in
``spectest.loadgen.results``) and returns the row of ``spectest.report.table.COLUMNS``:

* latency percentiles from the requests *sent* in the measured windows;
* throughput as tokens *generated inside* the measured span: each successful request's tokens
  are spread evenly over its first-to-last-token interval and the part inside the span counts.
  This neither loses the warm-up requests still running nor counts the tail that runs after the
  span (the closed-loop users finish in-flight requests when the step stops);
* acceptance from the server's counter deltas summed over the measured windows (the per-response
  ``spec`` objects when the server has no counters);
* relative standard errors of throughput and TPOT p50 across the windows;
* standard errors of the log of TPOT p50 (bootstrap), output tokens/s and goodput tokens/s
  (the closed loop's ratio estimator) over the step's successful requests
  (``spectest.report.evidence``): the intervals of every ratio the report states. Goodput
  tokens are the in-window tokens of requests that met every per-request SLO;
* the server's running-requests gauge over the windows (``running_mean`` …): the batch size a
  concurrency gave, which a batch-size schedule is written in.

It knows nothing about processes or HTTP; the round figures measured by ``engine_metrics`` come
from each look's ``engine.json`` (or the ``engine`` argument).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from spectest.loadgen import cpu
from spectest.report import evidence
from spectest.report.table import COLUMNS, LATENCIES, PERCENTILES
from spectest.sweep import engine_metrics

ENGINE_JSON = "engine.json"  # a look's engine-round figures (``step.run_step`` writes it)


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
    sent = req.started_at.to_numpy(dtype=float)
    first = sent + np.nan_to_num(req.ttft_ms.to_numpy(dtype=float)) / 1e3
    last = sent + np.nan_to_num(req.e2el_ms.to_numpy(dtype=float)) / 1e3
    span = last - first
    overlap = (np.minimum(last, end) - np.maximum(first, start)).clip(min=0)
    inside = (last >= start) & (last <= end)
    frac = np.where(span > 0, overlap / np.where(span > 0, span, 1), inside.astype(float))
    return np.nan_to_num(req.output_tokens.to_numpy(dtype=float)) * frac


def _pct(values: pd.Series | np.ndarray, p: float) -> float | None:
    v = np.asarray(values, dtype=float)
    v = v[~np.isnan(v)]
    return float(np.percentile(v, p)) if len(v) else None


def _rse(values: list[float]) -> float | None:
    v = np.array([x for x in values if x is not None and math.isfinite(x)], dtype=float)
    if len(v) < 2 or v.mean() <= 0:
        return None
    return float(v.std(ddof=1) / math.sqrt(len(v)) / v.mean())


def look_dirs(run_dir: Path) -> list[Path]:
    """The Locust folders of one arm at one step: ``run_dir`` itself (the first look) and the
    ``look2``, ``look3`` … folders inside it (the looks a decisive step added; ``sweep.run``)."""
    run_dir = Path(run_dir)
    more = [d for d in run_dir.glob("look*") if d.is_dir() and d.name[4:].isdigit()]
    return [run_dir] + sorted(more, key=lambda d: int(d.name[4:]))


@dataclass
class Look:
    """One look's requests and measured windows (from its Locust folder, or built by a
    simulation: ``from_frame``)."""
    folder: Path | None
    windows: list[tuple[float, float]]
    req: pd.DataFrame  # every request sent before the window's end (warm-up ones too)
    measured: pd.DataFrame  # those sent in the measured windows

    @classmethod
    def from_frame(cls, req: pd.DataFrame, t1: float, t2: float) -> Look:
        """A one-window look of ``requests.jsonl``-like rows (``step`` ≥ 1: measured)."""
        req = req[req.started_at < t2]
        return cls(None, [(t1, t2)], req, req[req.step >= 1])

    @property
    def t1(self) -> float:
        return self.windows[0][0]

    @property
    def t2(self) -> float:
        return self.windows[-1][1]


def _read_look(folder: Path, warmup_steps: int) -> Look | None:
    try:
        info = json.loads((folder / "run.json").read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return None
    wins = windows(info, warmup_steps)
    if not wins:
        return None
    req = read_requests(folder / "requests.jsonl")
    if not req.empty:
        req = req[req.started_at < wins[-1][1]]
    measured = req[req.step >= warmup_steps] if not req.empty else req
    return Look(folder, wins, req, measured)


def summarize(run_dir: Path, *, workload: str, arm: str, concurrency: int, warmup_steps: int,
              engine: dict | None = None, rel_to: Path | None = None) -> dict | None:
    """The sweep row of one arm at one step — every look of it pooled (``look_dirs``) — or
    None when no measured window began. ``engine``: the round figures (default: each look's
    ``engine.json``, written by ``step.run_step``, combined)."""
    run_dir = Path(run_dir)
    looks = [x for x in (_read_look(d, warmup_steps) for d in look_dirs(run_dir)) if x]
    if not looks:
        return None
    wins = [w for look in looks for w in look.windows]
    duration = sum(look.t2 - look.t1 for look in looks)
    measured = pd.concat([look.measured for look in looks], ignore_index=True)
    ok = measured[measured.ok] if not measured.empty else measured
    row: dict = {c: None for c in COLUMNS}
    n_req = len(measured)
    failures = int((~measured.ok).sum()) if n_req else 0
    row.update(workload=workload, arm=arm, concurrency=concurrency,
               started_at=round(looks[0].t1, 3), duration_s=round(duration, 3),
               windows=len(wins), looks=len(looks), requests=n_req, failures=failures,
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
    row.update({k: v for k, v in figures(looks, concurrency).items()
                if k != "tpot_p50_ms"})  # the percentile above, rounded like the others
    row["requests_per_s"] = len(ok) / duration if duration > 0 else None
    row["goodput_rps"] = (float(ok.slo_ok.sum()) / duration) if duration > 0 and len(ok) else 0.0
    row["output_tokens_per_s_rse"] = _rse([tokens_in(_good(look.req), a, b) / (b - a)
                                           for look in looks for a, b in look.windows])
    if not ok.empty and len(wins) > 1:
        row["tpot_p50_rse"] = _rse([_pct(look.measured[(look.measured.step == i)
                                                       & look.measured.ok].tpot_ms.astype(float),
                                         50)
                                    for look in looks if not look.measured.empty
                                    for i in sorted(look.measured.step.unique())])
    row.update(_acceptance([look.folder for look in looks], warmup_steps, ok))
    row.update(_running(looks))
    if not measured.empty and "client_cpu" in measured:
        row["client_cpu"] = cpu.busiest(zip(measured.worker, measured.client_cpu))
        row["client_saturated"] = cpu.is_saturated(row["client_cpu"])
    if engine is None:
        engine = engine_metrics.combine([_json(look.folder / ENGINE_JSON) for look in looks])
    for key, value in (engine or {}).items():
        if key == "k":
            row["k"] = value if row.get("k") is None else row["k"]
        elif key in row:
            row[key] = value
    row["run_dir"] = str(run_dir.relative_to(rel_to)) if rel_to else str(run_dir)
    return row


def _good(req: pd.DataFrame, slo: bool = False) -> pd.DataFrame:
    """The successful requests of a frame (``slo``: those that also met every SLO)."""
    if req.empty:
        return req
    keep = req.ok.astype(bool)
    if slo:
        keep &= req.slo_ok.fillna(False).astype(bool) if "slo_ok" in req else False
    return req[keep]


def figures(looks: list[Look], concurrency: int) -> dict:
    """An arm's figures at one step that the verdicts compare, over all its looks: output and
    goodput tokens/s (tokens generated inside the measured windows per second of them), TPOT
    p50, the standard errors of their logs, and the requests behind them. ``summarize`` and
    the simulations of ``tests/report`` share it."""
    duration = sum(look.t2 - look.t1 for look in looks)
    measured = pd.concat([look.measured for look in looks], ignore_index=True)
    ok = _good(measured)
    out: dict = {"requests": len(measured),
                 "failures": len(measured) - len(ok),
                 "tpot_p50_ms": _pct(ok.tpot_ms.astype(float), 50) if len(ok) else None}
    if duration > 0:
        out["output_tokens_per_s"] = sum(tokens_in(_good(look.req), look.t1, look.t2)
                                         for look in looks) / duration
        out["goodput_tokens_per_s"] = sum(tokens_in(_good(look.req, slo=True), look.t1,
                                                    look.t2) for look in looks) / duration
    out.update(_intervals(looks, concurrency))
    return out


def _json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return None


def _intervals(looks: list[Look], concurrency: int) -> dict:
    """The log standard errors (``evidence``) of TPOT p50, output and goodput tokens/s, over
    every look's measured requests: the median bootstrapped, the rates by the closed loop's
    ratio estimator (tokens over the seconds the requests took, in send order)."""
    out: dict = {}
    ok = pd.concat([look.measured[look.measured.ok].sort_values("started_at")
                    for look in looks if not look.measured.empty] or [pd.DataFrame()],
                   ignore_index=True)
    if ok.empty:
        return out
    tokens = ok.output_tokens.fillna(0).to_numpy(dtype=float)
    busy = ok.e2el_ms.astype(float).to_numpy() / 1e3
    met = (ok.slo_ok.fillna(False).astype(bool).to_numpy() if "slo_ok" in ok
           else np.zeros(len(ok), dtype=bool))
    out["output_tokens_per_s_log_se"] = evidence.throughput_log_se(tokens, busy, concurrency)
    if (tokens * met).sum() > 0:
        out["goodput_tokens_per_s_log_se"] = evidence.throughput_log_se(tokens * met, busy,
                                                                        concurrency)
    out["tpot_p50_log_se"] = evidence.median_log_se(ok.tpot_ms.astype(float))
    return out


def _running(looks: list[Look]) -> dict:
    """The server's running-requests gauge (its batch) over the measured windows: mean, min and
    max of the scrapes taken inside them (``scrapes.jsonl``; None where the server has none)."""
    values = []
    for look in looks:
        path = look.folder / "scrapes.jsonl"
        if not path.is_file():
            continue
        for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
            try:
                snap = json.loads(line)
            except json.JSONDecodeError:
                continue
            t, v = snap.get("taken_at"), snap.get("running")
            if v is not None and t is not None and any(a <= t <= b for a, b in look.windows):
                values.append(float(v))
    if not values:
        return {}
    return {"running_mean": float(np.mean(values)), "running_min": float(min(values)),
            "running_max": float(max(values)), "running_samples": len(values)}


def _acceptance(folders: list[Path], warmup_steps: int, ok: pd.DataFrame) -> dict:
    """Server counter deltas over the measured windows of every look (else the responses'
    spec objects)."""
    out: dict = {}
    frames = []
    for folder in folders:
        try:
            steps = pd.read_csv(folder / "steps.csv")
        except (OSError, pd.errors.EmptyDataError, pd.errors.ParserError):
            continue
        if not steps.empty:
            frames.append(steps[(steps.workload == "all") & (steps.step >= warmup_steps)])
    s = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
    if not s.empty and "acceptance_source" in s:
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
