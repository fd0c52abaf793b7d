"""NVIDIA AIPerf (0.13) result folders as ``peer_step.PeerStep``s.

Owns AIPerf's layout and names. A run is a folder with ``profile_export_aiperf.json`` (the
aggregates, its ``input_config`` and ``run_info``) and, with ``--export-level records`` (or
``raw``), ``profile_export.jsonl`` — one record per request: ``metadata``
(``benchmark_phase``, ``request_start_ns``, ``request_end_ns``), ``metrics`` ({name: {value,
unit}}), ``error`` and, for a server that reports vLLM's per-request speculation,
``spec_decode_acceptance``. ``aiperf profile --concurrency 1,2,4`` writes one such folder per
level (``concurrency_N/``); any folder holding runs at any depth is read, the per-phase copies
under ``phases/`` are not. Names (AIPerf → spectest): ``time_to_first_token`` → TTFT,
``inter_token_latency`` → TPOT (both (E2EL − TTFT) / (N − 1)), ``inter_chunk_latency`` → chunk
ITL, ``request_latency`` → E2EL, ``usage_completion_tokens`` (else ``output_sequence_length``)
→ output tokens; the Spec Decode section's ``num_spec_steps`` / ``num_draft_tokens`` /
``num_accepted_draft_tokens`` → drafts / draft tokens / accepted tokens, ``num_spec_tokens`` →
K, ``acceptance_histogram`` → per-position acceptance.

Does not know: how a step becomes a row (``peers``), the report.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from spectest.report.peer_step import (
    NO_SPECULATION,
    REQUEST_COLUMNS,
    PeerError,
    PeerStep,
    positions,
)

SUMMARY = "profile_export_aiperf.json"
RECORDS = "profile_export.jsonl"
LATENCY = {"ttft": "time_to_first_token", "tpot": "inter_token_latency",
           "itl": "inter_chunk_latency", "e2el": "request_latency"}


def runs(folder: Path) -> list[Path]:
    """The run summaries under ``folder`` (or the file itself), per-phase copies left out."""
    if folder.is_file():
        return [folder] if folder.name == SUMMARY else []
    if not folder.is_dir():
        return []
    return sorted(p for p in folder.rglob(SUMMARY)
                  if "phases" not in p.relative_to(folder).parts[:-1])


def read(folder: Path) -> list[PeerStep]:
    return [read_run(p) for p in runs(folder)]


def _load(path: Path) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise PeerError(f"{path} is not readable JSON ({str(e).splitlines()[0]})") from None
    if not isinstance(data, dict):
        raise PeerError(f"{path} is not an AIPerf summary (not a JSON object)")
    return data


def _value(d: dict, name: str, stat: str = "avg"):
    m = d.get(name)
    return m.get(stat) if isinstance(m, dict) else None


def read_run(path: Path) -> PeerStep:
    data = _load(path)
    cfg = data.get("input_config") or {}
    phase = next((p for p in cfg.get("phases") or [] if p.get("kind") == "profiling"), {})
    warm = next((p for p in cfg.get("phases") or [] if p.get("kind") == "warmup"), None)
    tool = f"AIPerf {data.get('aiperf_version', '?')}"
    folder = path.parent
    endpoint = cfg.get("endpoint") or {}
    extra = endpoint.get("extra") or {}
    dataset = (cfg.get("datasets") or [{}])[0]
    prompts = dataset.get("prompts") or {}
    isl, osl = (_int((prompts.get(k) or {}).get("mean")) for k in ("isl", "osl"))
    workload = (f"synthetic-isl{isl:g}-osl{osl:g}" if dataset.get("type") == "synthetic"
                and isl and osl else str(dataset.get("name") or dataset.get("path") or "aiperf"))
    setup = {"host": (endpoint.get("urls") or [None])[0],
             "model": ((cfg.get("models") or {}).get("items") or [{}])[0].get("name"),
             "max_tokens": osl, "temperature": extra.get("temperature"),
             "seed": (data.get("run_info") or {}).get("random_seed", dataset.get("random_seed")),
             "input": f"{dataset.get('type', '?')} prompts of {isl:g} tokens" if isl else "?",
             "warmup": f"{warm.get('requests')} request(s), dropped" if warm else "none",
             "profile": f"AIPerf {phase.get('type', '?')} phases",
             "requests": phase.get("requests") or _value(data, "request_count")}
    concurrency = _num(phase.get("concurrency"))
    left_out = ""
    if phase.get("type") not in (None, "concurrency"):
        rate = phase.get("request_rate")
        left_out = (f"an AIPerf {phase.get('type')} run"
                    + (f" at {rate:g} req/s" if _num(rate) else "")
                    + " has no concurrency level, and spectest's verdicts are per concurrency")
        concurrency = None
    elif concurrency is None:
        left_out = "the file names no concurrency level"
    lacks: list[str] = []
    requests = _records(folder / RECORDS) if (folder / RECORDS).is_file() else None
    if requests is None:
        lacks.append("no per-request records (profile_export.jsonl; run AIPerf with "
                     "--export-level records): its own aggregates are shown, without "
                     "intervals, and goodput under the report's SLO is empty")
    elif requests.empty:
        raise PeerError(f"{folder / RECORDS} has no profiling-phase record")
    has_spec = (requests is not None and requests.drafts.fillna(0).sum() > 0) or \
        _value(data, "total_spec_decode_steps") is not None
    if not has_spec:
        lacks.append(NO_SPECULATION)
    if requests is not None and has_spec and not requests.histogram.notna().any():
        lacks.append("no acceptance histogram: per-position acceptance and the K advisor are "
                     "empty")
    return PeerStep(tool, folder, concurrency, workload, requests,
                    aggregates(data) if requests is None else {}, setup, tuple(lacks), left_out)


def _num(v) -> float | None:
    try:
        return float(v) if v is not None else None
    except (TypeError, ValueError):
        return None


def _int(v) -> float | int | None:
    """A number from the file, as an int when it is one (64.0 → 64)."""
    f = _num(v)
    return int(f) if f is not None and f.is_integer() else f


def _records(path: Path) -> pd.DataFrame:
    rows = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                continue  # a torn last line
            meta = rec.get("metadata") or {}
            if meta.get("benchmark_phase", "profiling") != "profiling":
                continue
            rows.append(_request(rec, meta))
    return pd.DataFrame(rows, columns=list(REQUEST_COLUMNS))


def _request(rec: dict, meta: dict) -> dict:
    m = {k: (v.get("value") if isinstance(v, dict) else v)
         for k, v in (rec.get("metrics") or {}).items()}
    start = (meta.get("request_start_ns") or 0) / 1e9
    end = (meta.get("request_end_ns") or 0) / 1e9 or None
    tokens = m.get("usage_completion_tokens") or m.get("output_sequence_length")
    ttft, e2el = m.get(LATENCY["ttft"]), m.get(LATENCY["e2el"])
    tpot = m.get(LATENCY["tpot"])
    if tpot is None and tokens and tokens > 1 and ttft is not None and e2el is not None:
        tpot = (e2el - ttft) / (tokens - 1)
    itl = m.get(LATENCY["itl"])
    spec = rec.get("spec_decode_acceptance") or {}
    hist = spec.get("acceptance_histogram")
    if isinstance(hist, dict):
        hist = [int(hist.get(str(j), 0)) for j in range(max(int(k) for k in hist) + 1)] \
            if hist else None
    ok = not rec.get("error") and not meta.get("was_cancelled") and ttft is not None
    return {"started_at": start, "ended_at": end or (start + (e2el or 0) / 1e3), "ok": ok,
            "ttft_ms": ttft, "tpot_ms": tpot, "e2el_ms": e2el, "output_tokens": tokens or 0,
            "chunks": len(itl) + 1 if isinstance(itl, list) else None,
            "itl_ms": itl if isinstance(itl, list) else None,
            "drafts": spec.get("num_spec_steps", m.get("spec_decode_steps")),
            "draft_tokens": spec.get("num_draft_tokens", m.get("spec_decode_draft_tokens")),
            "accepted_tokens": spec.get("num_accepted_draft_tokens",
                                        m.get("spec_decode_accepted_draft_tokens")),
            "k": spec.get("num_spec_tokens"), "histogram": hist}


def aggregates(data: dict) -> dict:
    """Table columns from the summary alone (no per-request records)."""
    out: dict = {}
    for m, name in LATENCY.items():
        for p in (50, 90, 99):
            out[f"{m}_p{p}_ms"] = _value(data, name, f"p{p}")
    out["tpot_mean_ms"] = _value(data, LATENCY["tpot"])
    ok = _value(data, "request_count")
    errors = sum(int(e.get("count") or 0) for e in data.get("error_summary") or [])
    duration = _value(data, "benchmark_duration")
    out.update(requests=(ok or 0) + errors, failures=errors,
               error_rate=errors / ((ok or 0) + errors) if (ok or errors) else None,
               duration_s=duration, output_tokens=_value(data, "total_output_tokens"),
               output_tokens_per_s=_value(data, "output_token_throughput"),
               requests_per_s=_value(data, "request_throughput"),
               goodput_rps=_value(data, "goodput"))
    osl = _value(data, "output_sequence_length")
    itl_n = _value(data, "inter_chunk_latency", "count")  # gaps: one fewer than chunks
    if osl and itl_n and ok:
        out["tokens_per_chunk"] = osl / (itl_n / ok + 1)
    drafts = _value(data, "total_spec_decode_steps")
    if drafts:
        dtok, acc = _value(data, "total_draft_tokens"), _value(data, "total_accepted_draft_tokens")
        out.update(acceptance_source="client", drafts=drafts, draft_tokens=dtok,
                   accepted_tokens=acc, acceptance_rate=acc / dtok if dtok else None,
                   mean_accepted_length=1 + acc / drafts if acc is not None else None)
        hist = data.get("pooled_spec_decode_acceptance_histogram")
        if isinstance(hist, dict) and hist:
            width = max(int(k) for k in hist) + 1
            out.update(positions([[hist.get(str(j), 0) for j in range(width)]]))
            out["k"] = float(width - 1)
    return out
