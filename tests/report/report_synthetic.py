"""A synthetic sweep folder with known break points, for the report and compare tests.

The model behind the numbers: a plain target round costs T0(c) = 10 ms · (1 + 0.25·(c − 1));
a speculative round at K = 4 costs T0(c) · (1 + c_eff(c)·4) with c_eff(c) = 0.04·c; acceptance
is geometric with α per workload. TPOT = round / E[tokens per round]; throughput = c / TPOT
until the server saturates at 8 concurrent requests (beyond, throughput stays flat and TTFT
grows). So the TPOT crossover is where E_4 = 1 + 0.16·c (c ≈ 11.1 for α = 0.7, ≈ 5.9 for
α = 0.5; interpolating between the measured steps gives ≈ 11.3 and ≈ 5.8). Every step has at
least 40 requests per arm and a bootstrap log standard error of ``LOG_SE`` on TPOT p50,
throughput and goodput tokens, so every ratio is stated with an interval (``intervals=False``
writes an old steps.csv without those columns).
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from spectest.report.table import COLUMNS

K = 4
LOG_SE = 0.02


def rows(alpha: dict[str, float], steps=(1, 2, 4, 8, 16), saturation: int = 8,
         intervals: bool = True) -> list[dict]:
    out = []
    for w, a in alpha.items():
        p = [a ** (i + 1) for i in range(K)]
        e = 1 + sum(p)
        for c in steps:
            t0 = 10.0 * (1 + 0.25 * (c - 1))
            for arm in ("spec", "base"):
                round_ms = t0 * (1 + 0.04 * c * K) if arm == "spec" else t0
                tpot = round_ms / (e if arm == "spec" else 1)
                batch = min(c, saturation)
                tput = batch / tpot * 1e3
                queue = max(0.0, c / saturation - 1) * 100 * tpot
                row = {col: None for col in COLUMNS}
                row.update(workload=w, arm=arm, concurrency=c, k=K if arm == "spec" else None,
                           duration_s=12.0, windows=3, requests=40 * batch, failures=0,
                           error_rate=0.0, ttft_p50_ms=40 + queue, ttft_p90_ms=55 + queue,
                           ttft_p99_ms=70 + 1.5 * queue, tpot_p50_ms=tpot,
                           tpot_p90_ms=1.2 * tpot, tpot_p99_ms=1.5 * tpot,
                           e2el_p50_ms=40 + queue + 100 * tpot,
                           e2el_p99_ms=70 + 1.5 * queue + 150 * tpot,
                           output_tokens_per_s=tput, output_tokens_per_s_rse=0.02,
                           tpot_p50_rse=0.02, requests_per_s=tput / 100,
                           goodput_rps=tput / 100 if 1.5 * tpot <= 60 else 0.0,
                           slo_attainment=1.0, run_dir=f"runs/{w}/{arm}/c{c}")
                if intervals:
                    row.update(goodput_tokens_per_s=tput if 1.5 * tpot <= 60 else 0.0,
                               tpot_p50_log_se=LOG_SE, output_tokens_per_s_log_se=LOG_SE,
                               goodput_tokens_per_s_log_se=LOG_SE)
                if arm == "spec":
                    row.update(acceptance_source="spectest", drafts=1000.0 * c,
                               draft_tokens=4000.0 * c, accepted_tokens=1000.0 * c * (e - 1),
                               acceptance_rate=(e - 1) / K, mean_accepted_length=e,
                               draft_ms_per_round=0.3 * (round_ms - t0),
                               verify_ms_per_round=round_ms - 0.3 * (round_ms - t0))
                    row.update({f"acceptance_pos_{i}": p[i] for i in range(K)})
                else:
                    row.update(acceptance_source="spectest", drafts=0.0,
                               draft_ms_per_round=0.0, verify_ms_per_round=t0)
                out.append(row)
    return out


def write_sweep(folder: Path, alpha: dict[str, float] | None = None, label: str = "",
                **kw) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    alpha = alpha or {"chat": 0.7, "code": 0.5}
    frame = pd.DataFrame(rows(alpha, **kw))
    if not kw.get("intervals", True):  # an old steps.csv: the columns did not exist
        frame = frame.drop(columns=["goodput_tokens_per_s", "tpot_p50_log_se",
                                    "output_tokens_per_s_log_se", "goodput_tokens_per_s_log_se"])
    frame.to_csv(folder / "steps.csv", index=False)
    info = {"label": label or folder.name, "status": "finished", "workloads": list(alpha),
            "config": {"steps": sorted(set(frame.concurrency)), "warmup_s": 4,
                       "step_time_s": 12, "windows": 3, "max_tokens": 128, "temperature": 0.0,
                       "seed": 0, "k": K, "draft": "synthetic"},
            "slo": {"ttft_p99_ms": 1000, "tpot_p99_ms": 60, "e2el_p99_ms": None,
                    "max_error_rate": 0.01},
            "server": {"embedded": True, "model": "synthetic"}, "notes": []}
    (folder / "sweep.json").write_text(json.dumps(info))
    return folder
