"""Other tools' result folders (NVIDIA AIPerf, GuideLLM) as the arms of a spectest report.

Owns: recognising which tool wrote a folder (``detect``), the ``PeerStep`` every reader returns
(one measured run at one concurrency: its per-request records where the file keeps them, else
the tool's own aggregates), turning those steps into rows of the sweep table
(``table.COLUMNS``) and the ``Sweep`` that ``render`` and ``compare`` take (``peer_sweep``).

A row from per-request records is computed as ``spectest sweep`` computes its own
(``sweep.summary``): latency percentiles of the successful requests, tokens generated inside
the measured span per second, goodput under the report's SLO (a request meets it when its TTFT,
TPOT and E2EL are each within the p99 objective, as spectest's load generator judges its own),
and the bootstrap log standard errors behind every interval (``evidence``). Acceptance is the
sum of the responses' per-request speculation (vLLM's ``metrics.speculative_decoding``, as the
tool recorded it) and per-position acceptance comes from their acceptance histograms. A row
from aggregates only carries the tool's own figures and no interval. Whatever a file lacks is
said once, in one line, in the report's notes; nothing is filled in from elsewhere. A run
without a concurrency level (a request-rate run) is left out, with a note: spectest's verdicts
are per concurrency.

Does not know: the tools' file layouts (``peer_aiperf``, ``peer_guidellm``), HTTP, plotting.
The types every reader shares are ``peer_step``'s.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pandas as pd

from spectest.report import evidence, peer_aiperf, peer_guidellm, peer_notes
from spectest.report.peer_step import ARM_NAMES, PeerError, PeerStep, positions
from spectest.report.table import COLUMNS, LATENCIES, PERCENTILES, SLO, Sweep

TOOLS = ("aiperf", "guidellm")
TOOL_NAMES = {"aiperf": "NVIDIA AIPerf", "guidellm": "GuideLLM"}


def detect(folder: Path) -> str:
    """The tool that wrote ``folder`` (or file): 'aiperf' or 'guidellm'; PeerError otherwise."""
    if not folder.exists():
        raise PeerError(f"{folder} does not exist")
    if peer_aiperf.runs(folder):
        return "aiperf"
    if peer_guidellm.files(folder):
        return "guidellm"
    if folder.is_dir() and (folder / "steps.csv").is_file():
        raise PeerError(f"{folder} is a spectest sweep, not a peer run: give it to spectest "
                        f"report as the folder argument")
    raise PeerError(f"{folder} holds no AIPerf (profile_export_aiperf.json) or GuideLLM "
                    f"(benchmarks.json / .yaml) results")


def read(folder: str | Path, tool: str | None = None) -> list[PeerStep]:
    """Every run in ``folder`` (one run, an AIPerf sweep, a GuideLLM file of benchmarks)."""
    folder = Path(folder)
    found = detect(folder)
    if tool and tool != found:
        raise PeerError(f"{folder} holds {found} results, not {tool}")
    return peer_aiperf.read(folder) if found == "aiperf" else peer_guidellm.read(folder)


# --- a step as a row of the table -----------------------------------------------------------
def slo_ok(req: pd.DataFrame, slo: SLO) -> np.ndarray:
    """Per request: meets every objective that is set (DistServe goodput; no TPOT → no miss)."""
    met = req.ok.to_numpy(dtype=bool).copy()
    for col, limit in ((("ttft_ms", slo.ttft_p99_ms), ("tpot_ms", slo.tpot_p99_ms),
                        ("e2el_ms", slo.e2el_p99_ms))):
        if not limit:
            continue
        v = req[col].to_numpy(dtype=float)
        miss = v > limit if col == "tpot_ms" else ~(v <= limit)
        met &= ~miss
    return met


def _pct(values, p: float) -> float | None:
    v = np.asarray(values, dtype=float)
    v = v[np.isfinite(v)]
    return round(float(np.percentile(v, p)), 3) if len(v) else None


def _shares(ok: pd.DataFrame, t1: float, t2: float) -> np.ndarray:
    """Each request's tokens generated inside [t1, t2], spread over its first-to-last token
    (``sweep.summary.token_shares``)."""
    from spectest.sweep.summary import token_shares

    return token_shares(ok.reset_index(drop=True), t1, t2)


def step_row(step: PeerStep, arm: str, slo: SLO, workload: str | None = None) -> dict:
    """The table row of ``step`` as arm ``arm``: from its records, else its aggregates."""
    row: dict = {c: None for c in COLUMNS}
    row.update(workload=workload or step.workload, arm=arm, concurrency=step.concurrency,
               windows=1, run_dir=str(step.path))
    req = step.requests
    if req is None or req.empty:
        row.update({k: v for k, v in step.aggregates.items() if k in COLUMNS
                    or k.startswith("acceptance_pos_")})
        return row
    t1, t2 = float(req.started_at.min()), float(req.ended_at.max())
    duration = t2 - t1
    ok = req[req.ok]
    n, failures = len(req), int((~req.ok).sum())
    row.update(started_at=round(t1, 3), duration_s=round(duration, 3), requests=n,
               failures=failures, error_rate=failures / n if n else None)
    for m in LATENCIES:
        values = (np.concatenate([np.asarray(x, dtype=float) for x in ok.itl_ms
                                  if isinstance(x, list | tuple | np.ndarray)] or [[]])
                  if m == "itl" else ok[f"{m}_ms"].astype(float).to_numpy())
        for p in PERCENTILES:
            row[f"{m}_p{p}_ms"] = _pct(values, p)
    met = slo_ok(ok, slo)
    row["output_tokens"] = int(ok.output_tokens.sum())
    if len(ok):
        row["tpot_mean_ms"] = round(float(ok.tpot_ms.astype(float).mean()), 3)
        chunks = float(ok.chunks.sum())
        row["tokens_per_chunk"] = row["output_tokens"] / chunks if chunks else None
        row["slo_attainment"] = float(met.mean())
    if duration > 0:
        shares = _shares(ok, t1, t2)
        good = shares * met
        # the closed loop's ratio estimator over the requests in send order (``evidence``)
        order = ok.sort_values("started_at")
        tokens = order.output_tokens.fillna(0).to_numpy(dtype=float)
        busy = order.e2el_ms.astype(float).to_numpy() / 1e3
        met_sorted = slo_ok(order, slo)
        c = int(step.concurrency or 1)
        row.update(output_tokens_per_s=float(shares.sum()) / duration,
                   requests_per_s=len(ok) / duration, goodput_rps=float(met.sum()) / duration,
                   goodput_tokens_per_s=float(good.sum()) / duration,
                   output_tokens_per_s_log_se=evidence.throughput_log_se(tokens, busy, c))
        if good.sum() > 0:
            row["goodput_tokens_per_s_log_se"] = evidence.throughput_log_se(
                tokens * met_sorted, busy, c)
    if len(ok):
        row["tpot_p50_log_se"] = evidence.median_log_se(ok.tpot_ms.astype(float))
    row.update(acceptance(ok))
    return row


def acceptance(ok: pd.DataFrame) -> dict:
    """Acceptance from the responses' per-request speculation (empty when none reported)."""
    drafts = float(ok.drafts.fillna(0).sum()) if "drafts" in ok else 0.0
    if not drafts:
        return {}
    dtok, acc = (float(ok[c].fillna(0).sum()) for c in ("draft_tokens", "accepted_tokens"))
    out = {"acceptance_source": "client", "drafts": drafts, "draft_tokens": dtok,
           "accepted_tokens": acc, "acceptance_rate": acc / dtok if dtok else None,
           "mean_accepted_length": 1 + acc / drafts}
    ks = ok.k.dropna()
    if len(ks):
        out["k"] = float(ks.max())
    out.update(positions([h for h in ok.histogram if isinstance(h, list | tuple)]))
    return out


# --- both arms as one sweep -----------------------------------------------------------------
def peer_sweep(spec_dirs: list[Path], base_dirs: list[Path], out: Path, slo: SLO,
               tool: str | None = None, workload: str | None = None,
               label: str | None = None) -> Sweep:
    """The two arms' runs as one sweep table, with the notes of what their files lack."""
    arms = {"spec": _arm_steps(spec_dirs, "spec", tool), "base": _arm_steps(base_dirs, "base",
                                                                            tool)}
    names = {arm: next((s.workload for s in steps if not s.left_out), None)
             for arm, steps in arms.items()}
    name = workload or names["spec"] or names["base"] or "peer"
    rows = [step_row(s, arm, slo, name) for arm, steps in arms.items() for s in steps
            if not s.left_out]
    if not any(r["arm"] == "spec" for r in rows) or not any(r["arm"] == "base" for r in rows):
        empty = "spec" if not any(r["arm"] == "spec" for r in rows) else "base"
        raise PeerError(f"no run of the {ARM_NAMES[empty]} arm has a concurrency level: "
                        f"{peer_notes.left_out_text(arms[empty])}")
    table = pd.DataFrame(rows)
    for col in COLUMNS:
        if col not in table.columns:
            table[col] = float("nan")
    cols = list(COLUMNS) + sorted((c for c in table.columns if c.startswith("acceptance_pos_")),
                                  key=lambda c: int(c.rsplit("_", 1)[1]))
    table = table[cols].sort_values(["arm", "concurrency"]).reset_index(drop=True)
    table["run_dir"] = [_relative(Path(d), out) for d in table.run_dir]
    info = peer_notes.info(arms, names, name, table, slo, label)
    return Sweep(out, table, info)


def build(spec_dirs: list[Path], base_dirs: list[Path], out: Path, slo: SLO,
          tool: str | None = None, workload: str | None = None,
          label: str | None = None) -> Sweep:
    """``peer_sweep`` written into ``out`` as ``steps.csv`` + ``sweep.json`` (a sweep folder)."""
    sweep = peer_sweep(spec_dirs, base_dirs, Path(out), slo, tool, workload, label)
    peer_notes.write(Path(out), sweep.table, sweep.info)
    return sweep


def _relative(path: Path, out: Path) -> str:
    """``run_dir`` as the sweep table keeps it: relative to the output folder where possible."""
    try:
        return os.path.relpath(path.resolve(), Path(out).resolve())
    except ValueError:  # another drive
        return str(path.resolve())


def _arm_steps(dirs: list[Path], arm: str, tool: str | None) -> list[PeerStep]:
    steps: list[PeerStep] = []
    for d in dirs:
        steps += read(d, tool)
    seen: dict[float, PeerStep] = {}
    for s in steps:
        if s.left_out:
            continue
        if s.concurrency in seen:
            raise PeerError(f"two {ARM_NAMES[arm]} runs at concurrency {s.concurrency:g} "
                            f"({seen[s.concurrency].path} and {s.path}): give one run per "
                            f"concurrency")
        seen[s.concurrency] = s
    return steps
