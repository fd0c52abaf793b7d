"""GuideLLM (0.8) results files as ``peer_step.PeerStep``s.

Owns GuideLLM's layout and names. ``guidellm run --output kind=json,path=…`` writes one file
(``benchmarks.json``, or ``.yaml``) holding every benchmark of the run — one per profile
strategy: ``synchronous`` (concurrency 1), ``concurrent`` (one per ``streams`` value), and the
rate-based ``constant`` / ``poisson`` / ``throughput`` ones, which have no concurrency level and
are left out with a note. Each benchmark keeps ``config.strategy``, ``start_time`` /
``end_time`` (unix s), aggregate ``metrics`` and ``requests.{successful, errored,
incomplete}``: the lightweight stats of every request (kept whatever ``sample_size`` is). Names
(GuideLLM → spectest): ``time_to_first_token_ms`` → TTFT, ``inter_token_latency_ms`` → TPOT
(both (E2EL − TTFT) / (N − 1)), ``request_latency`` (s) → E2EL, ``output_tokens`` → output
tokens, ``output_tokens / info.timings.token_iterations`` → tokens per chunk. GuideLLM's own
``time_per_output_token_ms`` (E2EL / N, TTFT included) is not spectest's TPOT and is not used.
A request's ``response_metrics`` keeps the response's own ``metrics``: a server that reports
vLLM's per-request speculation there gives ``speculative_decoding``'s ``num_spec_steps`` /
``num_draft_tokens`` / ``num_accepted_draft_tokens`` → drafts / draft tokens / accepted tokens,
``num_spec_tokens`` → K, ``acceptance_histogram`` → per-position acceptance (acceptance stays
empty, with a note, when no response carried it). GuideLLM records no per-chunk times: chunk
ITL stays empty.

Does not know: how a step becomes a row (``peers``), the report.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from spectest.report.peer_step import NO_SPECULATION, REQUEST_COLUMNS, PeerError, PeerStep

SUFFIXES = (".json", ".yaml", ".yml")
MARK = "guidellm_version"  # in the first lines of a results file (metadata)
LEVELS = {"synchronous": lambda s: 1.0,
          "concurrent": lambda s: float(s["streams"]) if s.get("streams") else None}
NO_CHUNK_TIMES = "no per-chunk times: chunk ITL and its percentiles are empty"


def files(folder: Path) -> list[Path]:
    """GuideLLM results files: ``folder`` itself, or those in it and one level down."""
    if folder.is_file():
        return [folder] if _looks(folder) else []
    if not folder.is_dir():
        return []
    found = [p for pattern in ("*", "*/*") for p in sorted(folder.glob(pattern))
             if p.suffix in SUFFIXES and p.is_file() and _looks(p)]
    return found


def _looks(path: Path) -> bool:
    if path.suffix not in SUFFIXES:
        return False
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return MARK in f.read(4096)
    except OSError:
        return False


def _load(path: Path) -> dict:
    try:
        text = path.read_text(encoding="utf-8")
        if path.suffix == ".json":
            data = json.loads(text)
        else:
            import yaml
            data = yaml.safe_load(text)
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise PeerError(f"{path} is not a readable GuideLLM file "
                        f"({str(e).splitlines()[0] if str(e) else type(e).__name__})") from None
    except Exception as e:  # yaml's errors
        raise PeerError(f"{path} is not readable YAML ({type(e).__name__})") from None
    if not isinstance(data, dict) or not isinstance(data.get("benchmarks"), list):
        raise PeerError(f"{path} is not a GuideLLM results file (no benchmarks list)")
    return data


def read(folder: Path) -> list[PeerStep]:
    steps = []
    for path in files(folder):
        data = _load(path)
        tool = f"GuideLLM {(data.get('metadata') or {}).get('guidellm_version', '?')}"
        spec = (data.get("config") or {}).get("spec") or {}
        for i, bench in enumerate(data["benchmarks"]):
            steps.append(_step(path, i, bench, spec, tool))
    return steps


def _setup(spec: dict, bench: dict, body: dict) -> tuple[str, dict]:
    data = (spec.get("data") or [{}])[0]
    backend = spec.get("backend") or (bench.get("config") or {}).get("backend") or {}
    pt, ot = data.get("prompt_tokens"), data.get("output_tokens")
    workload = (f"synthetic-isl{pt}-osl{ot}" if data.get("kind") == "synthetic_text" and pt
                and ot else str(data.get("kind") or "guidellm"))
    profile = spec.get("profile") or {}
    cfg = bench.get("config") or {}
    warm = cfg.get("warmup") or {}
    return workload, {
        "host": backend.get("target"), "model": backend.get("model"),
        "max_tokens": body.get("max_completion_tokens", body.get("max_tokens", ot)),
        "temperature": body.get("temperature"),
        "seed": (spec.get("seed") or {}).get("value"),
        "input": f"{data.get('kind', '?')} prompts of {pt} tokens" if pt else "?",
        "warmup": (f"{warm.get('value')} ({warm.get('mode')}), dropped" if warm.get("value")
                   else "none"),
        "profile": f"GuideLLM {profile.get('kind', '?')} profile"}


def _step(path: Path, i: int, bench: dict, spec: dict, tool: str) -> PeerStep:
    strategy = (bench.get("config") or {}).get("strategy") or {}
    kind = strategy.get("type_") or strategy.get("type") or "?"
    reqs = bench.get("requests") or {}
    first = next((r for group in ("successful", "errored", "incomplete")
                  for r in reqs.get(group) or []), {})
    body = _body(first)
    workload, setup = _setup(spec, bench, body)
    totals = ((bench.get("metrics") or {}).get("request_totals") or {})
    setup["requests"] = totals.get("total")
    level = LEVELS.get(kind, lambda s: None)(strategy)
    where = path / f"benchmark-{i}-{kind}"
    if level is None:
        rate = strategy.get("rate")
        return PeerStep(tool, where, None, workload, None, setup=setup,
                        left_out=f"a GuideLLM {kind} benchmark"
                                 + (f" at {float(rate):g} req/s" if rate else "")
                                 + " has no concurrency level, and spectest's verdicts are "
                                   "per concurrency")
    rows = [_request(r, ok=(group == "successful"))
            for group in ("successful", "errored", "incomplete") for r in reqs.get(group) or []]
    frame = pd.DataFrame(rows, columns=list(REQUEST_COLUMNS))
    kept = len(reqs.get("successful") or [])
    if frame.empty or (totals.get("successful") is not None and kept < totals["successful"]):
        raise PeerError(f"{path}: benchmark {i} ({kind}) keeps {kept} of "
                        f"{totals.get('successful', '?')} successful requests' stats")
    has_spec = frame.drafts.fillna(0).sum() > 0
    lacks = (NO_CHUNK_TIMES,) + (() if has_spec else (NO_SPECULATION,))
    return PeerStep(tool, where, level, workload, frame, setup=setup, lacks=lacks)


def _body(req: dict) -> dict:
    args = req.get("request_args")
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except json.JSONDecodeError:
            args = {}
    return (args or {}).get("body") or {}


def _request(r: dict, ok: bool) -> dict:
    start, end = r.get("request_start_time"), r.get("request_end_time")
    latency = r.get("request_latency")
    tokens = r.get("output_tokens") or 0
    ttft, itl = r.get("time_to_first_token_ms"), r.get("inter_token_latency_ms")
    e2el = latency * 1e3 if latency is not None else None
    if itl is None and ttft is not None and e2el is not None and tokens > 1:
        itl = (e2el - ttft) / (tokens - 1)
    timings = (r.get("info") or {}).get("timings") or {}
    chunks = timings.get("token_iterations")
    spec = (r.get("response_metrics") or {}).get("speculative_decoding") or {}
    hist = spec.get("acceptance_histogram")
    if isinstance(hist, dict):  # {"j": steps}, as AIPerf keeps it
        hist = [int(hist.get(str(j), 0)) for j in range(max(int(k) for k in hist) + 1)] \
            if hist else None
    return {"started_at": start, "ended_at": end if end is not None else start,
            "ok": bool(ok and ttft is not None), "ttft_ms": ttft, "tpot_ms": itl, "e2el_ms": e2el,
            "output_tokens": tokens, "chunks": chunks or None, "itl_ms": None,
            "drafts": spec.get("num_spec_steps"), "draft_tokens": spec.get("num_draft_tokens"),
            "accepted_tokens": spec.get("num_accepted_draft_tokens"),
            "k": spec.get("num_spec_tokens"),
            "histogram": hist if isinstance(hist, list) else None}
