"""A sweep folder as the report reads it: the per-step table, the sweep's description, SLOs.

``spectest sweep`` writes one folder (``--out``):

``steps.csv``  one row per finished (workload, arm, concurrency) step, rewritten atomically after
    each step, so an interrupted sweep still has every finished step. Columns (``COLUMNS``, then
    ``acceptance_pos_0`` … as many as the server reported positions):

    =========================== ===========================================================
    workload, arm, concurrency  chat|code|rag|…, ``spec`` | ``base`` | ``spec-advised`` (the
                                advised schedule) | ``verify-on`` / ``verify-off`` (always-on
                                and off measured beside it), users
    k                           the server's draft length (``spec_decode_k`` gauge; empty
                                when unknown or not speculating)
    started_at, duration_s      start and length of the *measured* window (after warm-up)
    windows                     measured sub-windows (their spread gives the ``*_rse`` columns)
    looks                       how many times the step was measured and judged (a decisive
                                step runs another look per arm until its verdict is settled
                                or ``--max-step-time`` is reached; ``sequential.py``)
    interval_z                  the critical value of the step's intervals (1.96 for one look;
                                larger after several, so the 95 % holds under the stopping)
    decided                     settled (the step's verdicts are decided) | cap (the time cap
                                ended it first) | empty (one arm, or an older file)
    requests, failures          requests sent in the window that finished (ok + failed)
    error_rate                  failures / requests
    ttft_*, tpot_*, e2el_*,     percentiles p50/p90/p99 (ms) of successful requests sent in
    itl_*                       the window; ``tpot_mean_ms`` too
    output_tokens_per_s         tokens *generated inside the window* (each request's tokens
                                spread over its first-to-last-token span), per second
    output_tokens_per_s_rse,    relative standard error of the figure across sub-windows
    tpot_p50_rse                (empty with one window)
    requests_per_s, goodput_rps successful / SLO-meeting requests per second (DistServe)
    goodput_tokens_per_s        tokens generated inside the window by requests that met every
                                per-request SLO, per second (what the cost section prices)
    slo_attainment              share of successful requests meeting every per-request SLO
    tpot_p50_log_se,            bootstrap standard error of the log of TPOT p50, output
    output_tokens_per_s_log_se, tokens/s and goodput tokens/s over the step's successful
    goodput_tokens_per_s_log_se requests (``evidence.py``; empty under 2 requests): the
                                intervals of every ratio. Older files lack them: "interval
                                unavailable"
    tokens_per_chunk            output tokens per streamed chunk
    acceptance_source           spectest | vllm | sglang | client | empty
    drafts, draft_tokens,       server counter deltas over the window
    accepted_tokens
    acceptance_rate             Δaccepted / Δdraft_tokens
    mean_accepted_length        1 + Δaccepted / Δdrafts
    rounds, mean_batch          engine rounds and requests per round (spectest servers)
    running_mean, running_min,  the server's running-requests gauge over the measured windows
    running_max,                (vLLM ``num_requests_running``, llama.cpp
    running_samples             ``requests_processing``, spectest): the batch a concurrency
                                gave — what a batch-size schedule is written in; empty where
                                the server has no such gauge
    draft_ms_per_round,         mean drafting and verify time of one engine round (spectest
    verify_ms_per_round         servers: ``spec_decode_{draft,verify}_time_seconds``)
    network_ms_per_round        a disaggregated drafter (``serve --draft-url``): network time
                                per round inside draft_ms_per_round; empty when co-located
    draft_errors                rounds that lost their drafts to a failed drafter
    loadavg                     the host's 1-minute load average at the step's end (noise)
    client_cpu,                 the busiest Locust process's mean CPU share over the step
    client_saturated            (1.0 = one core) and whether it reached 0.85: then the client,
                                not the server, may be setting the latencies
    run_dir                     the Locust results folder of the step (relative)
    =========================== ===========================================================

``sweep.json``  the sweep's options, hosts, SLOs, status (running | finished | interrupted |
    failed), notes (early stops, failures) and the time it took.
``runs/<workload>/<arm>/c<N>/``  each step's Locust folder (``requests.jsonl``, …).

This module owns that contract and the SLO test of a step; it knows nothing about Locust,
HTTP or plotting.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

STEPS_CSV = "steps.csv"
SWEEP_JSON = "sweep.json"
ARMS = ("spec", "base", "spec-advised", "verify-on", "verify-off")
PERCENTILES = (50, 90, 99)
LATENCIES = ("ttft", "tpot", "itl", "e2el")
COLUMNS = (["workload", "arm", "concurrency", "k", "started_at", "duration_s", "windows",
            "looks", "interval_z", "decided", "requests", "failures", "error_rate"]
           + [f"{m}_p{p}_ms" for m in LATENCIES for p in PERCENTILES]
           + ["tpot_mean_ms", "output_tokens", "output_tokens_per_s", "output_tokens_per_s_rse",
              "tpot_p50_rse", "requests_per_s", "goodput_rps", "goodput_tokens_per_s",
              "tpot_p50_log_se", "output_tokens_per_s_log_se", "goodput_tokens_per_s_log_se",
              "slo_attainment",
              "tokens_per_chunk", "acceptance_source", "drafts", "draft_tokens",
              "accepted_tokens", "acceptance_rate", "mean_accepted_length", "rounds",
              "mean_batch", "running_mean", "running_min", "running_max", "running_samples",
              "draft_ms_per_round", "verify_ms_per_round",
              "network_ms_per_round", "draft_errors", "loadavg",
              "client_cpu", "client_saturated", "run_dir"])


class SweepError(ValueError):
    """A folder that is not a readable sweep; the message is one line for the user."""


@dataclass(frozen=True)
class SLO:
    """Service-level objectives of a step: p99 latencies (ms) and a failure budget.

    A threshold of 0 or None means "no objective". A step meets the SLO when every set
    percentile is at or under its threshold and its error rate is at most ``max_error_rate``.
    """

    ttft_p99_ms: float | None = None
    tpot_p99_ms: float | None = None
    e2el_p99_ms: float | None = None
    max_error_rate: float = 0.01

    @property
    def thresholds(self) -> dict[str, float]:
        """{column: threshold} for the objectives that are set."""
        pairs = (("ttft_p99_ms", self.ttft_p99_ms), ("tpot_p99_ms", self.tpot_p99_ms),
                 ("e2el_p99_ms", self.e2el_p99_ms))
        return {col: float(v) for col, v in pairs if v}

    @property
    def any(self) -> bool:
        return bool(self.thresholds)

    def violations(self, row) -> list[str]:
        """The columns of ``row`` that break the SLO ("error_rate" for failures)."""
        out = [col for col, limit in self.thresholds.items()
               if not _finite(row.get(col)) or float(row[col]) > limit]
        rate = row.get("error_rate")
        if _finite(rate) and float(rate) > self.max_error_rate:
            out.append("error_rate")
        return out

    def describe(self) -> str:
        parts = [f"{col.split('_')[0].upper()} p99 ≤ {v:g} ms"
                 for col, v in self.thresholds.items()]
        return ", ".join(parts) + f", errors ≤ {self.max_error_rate:.0%}" if parts else "none"

    def to_json(self) -> dict:
        return {"ttft_p99_ms": self.ttft_p99_ms, "tpot_p99_ms": self.tpot_p99_ms,
                "e2el_p99_ms": self.e2el_p99_ms, "max_error_rate": self.max_error_rate}

    @classmethod
    def from_json(cls, data: dict | None) -> SLO:
        data = data or {}
        return cls(data.get("ttft_p99_ms"), data.get("tpot_p99_ms"), data.get("e2el_p99_ms"),
                   float(data.get("max_error_rate", 0.01)))


def _finite(v) -> bool:
    try:
        return v is not None and math.isfinite(float(v))
    except (TypeError, ValueError):
        return False


@dataclass(frozen=True)
class Sweep:
    folder: Path
    table: pd.DataFrame
    info: dict

    @property
    def slo(self) -> SLO:
        return SLO.from_json(self.info.get("slo"))

    @property
    def label(self) -> str:
        return str(self.info.get("label") or self.folder.name)

    @property
    def workloads(self) -> list[str]:
        order = list(self.info.get("workloads") or [])
        seen = list(dict.fromkeys(self.table["workload"]))
        return [w for w in order if w in seen] + [w for w in seen if w not in order]

    def series(self, workload: str, arm: str) -> pd.DataFrame:
        t = self.table
        return t[(t.workload == workload) & (t.arm == arm)].sort_values("concurrency")

    @property
    def position_columns(self) -> list[str]:
        cols = [c for c in self.table.columns if c.startswith("acceptance_pos_")]
        return sorted(cols, key=lambda c: int(c.rsplit("_", 1)[1]))


def empty_table() -> pd.DataFrame:
    return pd.DataFrame(columns=COLUMNS)


def load_sweep(folder: str | Path) -> Sweep:
    """Read ``steps.csv`` and ``sweep.json``; raises SweepError with one readable line."""
    folder = Path(folder)
    if not folder.is_dir():
        raise SweepError(f"{folder} is not a folder (expected the --out folder of a sweep)")
    csv = folder / STEPS_CSV
    if not csv.is_file():
        raise SweepError(f"{folder} has no {STEPS_CSV}: not a sweep folder, or no step finished")
    try:
        table = pd.read_csv(csv)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as e:
        raise SweepError(f"{csv} is not a readable CSV ({str(e).splitlines()[0]})") from None
    missing = [c for c in ("workload", "arm", "concurrency") if c not in table.columns]
    if missing:
        raise SweepError(f"{csv} lacks the columns {', '.join(missing)}: not a sweep table")
    for col in COLUMNS:
        if col not in table.columns:
            table[col] = float("nan")
    table["workload"] = table["workload"].astype(str)
    table["arm"] = table["arm"].astype(str)
    info: dict = {}
    if (folder / SWEEP_JSON).is_file():
        try:
            info = json.loads((folder / SWEEP_JSON).read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise SweepError(f"{folder / SWEEP_JSON} is not valid JSON ({e})") from None
    return Sweep(folder, table, info)
