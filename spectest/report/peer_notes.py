"""What a sweep built from peer runs says about itself: ``sweep.json``'s fields and its notes.

Owns: the ``info`` of a ``Sweep`` made of AIPerf / GuideLLM runs (label, hosts, SLO, the
setup line the report prints instead of spectest's load-generator settings) and its notes —
one line per thing the files lack (grouped over the steps and arms it applies to), per run left
out, and per mismatch between the arms (different inputs, a baseline that reports speculation).
Also writes the converted table as ``steps.csv`` + ``sweep.json`` (``write``), so the output
folder is a sweep folder that ``spectest report`` re-renders and ``spectest compare`` takes.

Does not know: the tools' file layouts or how a row is computed (``peers``).
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from spectest import files
from spectest.report.peer_step import ARM_NAMES, NO_SPECULATION
from spectest.report.table import STEPS_CSV, SWEEP_JSON, SLO, SweepError

ALWAYS = ("{tools} files carry no measured sub-windows, server counters or engine-round "
          "timings, host load or load-generator CPU: the ± windows, engine-round, busy-machine "
          "and load-generator columns are empty, and acceptance is the responses' own "
          "(source `client`).")


def _where(names: list[str]) -> str:
    return ", ".join(names)


def _c(step) -> str:
    return f"c={step.concurrency:g}" if step.concurrency is not None else step.name


def left_out_text(steps) -> str:
    """'c=?: rate-based run at 2 req/s (…)' for the runs that are not steps."""
    out = [f"{s.path}: {s.left_out}" for s in steps if s.left_out]
    return "; ".join(out) if out else "no run found"


def notes(arms: dict) -> list[str]:
    """One line per lack (over the steps and arms it applies to), left-out run and mismatch."""
    lacks: dict[str, list[str]] = {}
    for arm, steps in arms.items():
        for s in steps:
            if s.left_out:
                continue
            for phrase in s.lacks:
                if arm == "base" and phrase == NO_SPECULATION:
                    continue  # a baseline does not speculate
                lacks.setdefault(f"{s.tool}: {phrase}", []).append(f"{arm} {_c(s)}")
    lines = []
    total = {arm: sum(1 for s in steps if not s.left_out) for arm, steps in arms.items()}
    for text, where in lacks.items():
        arms_in = {w.split(" ", 1)[0] for w in where}
        scope = ("every step" if len(where) == sum(total.values()) else
                 f"every {ARM_NAMES[next(iter(arms_in))]} step" if len(arms_in) == 1
                 and len(where) == total[next(iter(arms_in))] else _where(where))
        lines.append(f"{text} ({scope}).")
    for arm, steps in arms.items():
        for s in steps:
            if s.left_out:
                lines.append(f"Left out ({ARM_NAMES[arm]} arm): {s.path} — {s.left_out}.")
    for s in arms.get("base", []):
        if not s.left_out and s.requests is not None and "drafts" in s.requests \
                and s.requests.drafts.fillna(0).sum() > 0:
            lines.append(f"The baseline run {s.path} reports speculation in its responses: "
                         f"is the baseline server really speculation-free?")
            break
    return lines


def info(arms: dict, names: dict, workload: str, table: pd.DataFrame, slo: SLO,
         label: str | None) -> dict:
    tools = sorted({s.tool for steps in arms.values() for s in steps})
    first = {arm: next((s for s in steps if not s.left_out), None) for arm, steps in arms.items()}
    hosts = {arm: (s.setup.get("host") if s else None) for arm, s in first.items()}
    setup = first["spec"].setup if first["spec"] else {}
    base_setup = first["base"].setup if first["base"] else {}
    extra = [ALWAYS.format(tools=" and ".join(tools))]
    if names["spec"] and names["base"] and names["spec"] != names["base"]:
        extra.append(f"The arms sent different inputs (speculative: {names['spec']}, "
                     f"baseline: {names['base']}): the comparison is not like for like.")
    differs = [k for k in ("max_tokens", "temperature", "model")
               if setup.get(k) is not None and base_setup.get(k) is not None
               and setup.get(k) != base_setup.get(k)]
    if differs:
        extra.append(f"The arms ran with different {', '.join(differs)}: "
                     + "; ".join(f"{k} {setup[k]} vs {base_setup[k]}" for k in differs) + ".")
    steps = sorted({float(c) for c in table.concurrency.dropna()})
    records = [s for steps_ in arms.values() for s in steps_ if not s.left_out]
    no_records = all(s.requests is None for s in records)
    return {
        "label": label or f"{' + '.join(tools)} runs",
        "status": "finished",
        "workloads": [workload],
        "slo": slo.to_json(),
        "hosts": {k: v for k, v in hosts.items() if v},
        "server": {},
        "config": {"steps": [int(c) if c.is_integer() else c for c in steps],
                   "max_tokens": setup.get("max_tokens"),
                   "temperature": setup.get("temperature"), "seed": setup.get("seed")},
        "peer": {"tools": tools, "setup": setup_line(tools, arms, steps, setup),
                 "runs": {arm: [str(s.path) for s in steps_] for arm, steps_ in arms.items()},
                 "no_intervals": ("the peer files keep no per-request records" if no_records
                                  else None)},
        "notes": notes(arms) + extra,
    }


def setup_line(tools: list[str], arms: dict, steps: list[float], setup: dict) -> str:
    counts = {arm: [f"{_c(s)}: {s.setup.get('requests', '?')}" for s in steps_
                    if not s.left_out] for arm, steps_ in arms.items()}
    return (f"measured by {' and '.join(tools)} ({setup.get('profile', 'concurrency runs')}); "
            f"concurrency {', '.join(f'{c:g}' for c in steps)}; requests per run (speculative) "
            f"{_where(counts['spec'])}, (baseline) {_where(counts['base'])}; warm-up "
            f"{setup.get('warmup', 'none recorded')}; input {setup.get('input', '?')}; max "
            f"tokens {setup.get('max_tokens', '?')}; temperature "
            f"{setup.get('temperature', '?')}; seed {setup.get('seed', '?')}. Each run is one "
            f"step: its measured span runs from its first request sent to its last answered.")


def write(folder: Path, table: pd.DataFrame, info_: dict) -> None:
    """``steps.csv`` + ``sweep.json`` of the converted runs; refuses to overwrite a sweep that
    spectest measured (its ``sweep.json`` has no ``peer``)."""
    folder.mkdir(parents=True, exist_ok=True)
    existing = folder / SWEEP_JSON
    if (folder / STEPS_CSV).is_file():
        try:
            old = json.loads(existing.read_text(encoding="utf-8")) if existing.is_file() else {}
        except (OSError, json.JSONDecodeError):
            old = {}
        if "peer" not in old:
            raise SweepError(f"{folder} holds a spectest sweep (steps.csv): choose another --out "
                             f"for the peer report")
    files.write_atomic(folder / STEPS_CSV, table.to_csv(index=False))
    files.write_atomic(existing, json.dumps(info_, indent=2, default=str) + "\n")
