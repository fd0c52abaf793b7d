"""Benchmark: at batch, is the model the cost, or the engine's Python around it?

The embedded pair (or ``--pair smollm2``) in-process, greedy, fixed-length answers
(``ignore_eos``) to held-out-shaped prompts (the code workload's records), both arms:
speculation on (draft-model, K = ``--k``) and off (the same engine build with speculation off
for every request — the sweep's baseline). For each batch size, ``batch`` requests are
submitted together and stepped to completion, ``--repeats`` times (median):

* tokens/s (wall clock of ``run_until_idle``, prefill included);
* where the time goes: the model (prefill + draft + verify forwards, from the engine's own
  round records and request stats) and everything else — the engine's per-row bookkeeping
  (accept, rewind, emit, stop rules, detokenising, outputs, round records);
* ``bookkeeping share`` = everything else / wall clock; at 8–32 rows it should be small;
* batch-N / batch-1 throughput per arm, and spec / off per batch size.

One torch thread by default (``--threads``), so the figures do not depend on what else the
machine runs on its other core.

    python benchmarks/engine_batch.py [--pair embedded] [--batches 1,8,16,32]
        [--max-tokens 64] [--k 4] [--repeats 3] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import uuid
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from spectest.engine.api import build_engine  # noqa: E402
from spectest.engine.policies import FixedK  # noqa: E402
from spectest.engine.requests import GenerationRequest  # noqa: E402
from spectest.engine.sampling import SamplingParams  # noqa: E402
from spectest.loadgen.datasets import load_dataset  # noqa: E402


def code_prompts(tokenizer, n: int, max_prompt: int) -> list[tuple[int, ...]]:
    """The code workload's first ``n`` records that fit ``max_prompt`` tokens."""
    out = []
    for rec in load_dataset("code", seed=0).records:
        text = (tokenizer.apply_chat_template(list(rec.messages), add_generation_prompt=True)
                if rec.messages is not None else rec.prompt)
        ids = tuple(tokenizer.encode(text))
        if len(ids) <= max_prompt:
            out.append(ids)
        if len(out) == n:
            break
    return out


def one_batch(engine, prompts, max_tokens: int, speculative: bool) -> dict:
    """Submit ``prompts`` together, step to completion; wall clock and the model's share."""
    records, finals = [], []
    engine.observers.append(records.append)
    for ids in prompts:
        params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
        engine.submit(GenerationRequest(uuid.uuid4().hex, ids, params, speculative=speculative),
                      lambda o: finals.append(o) if o.finished else None)
    t0 = time.perf_counter()
    engine.run_until_idle()
    wall = time.perf_counter() - t0
    engine.observers.remove(records.append)
    tokens = sum(o.stats.completion_tokens for o in finals)
    model = (sum(r.draft_seconds + r.verify_seconds for r in records)
             + sum(o.stats.prefill_time for o in finals))
    return {"tokens": tokens, "wall_s": wall, "model_s": model, "rounds": len(records)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pair", choices=("embedded", "smollm2"), default="embedded")
    ap.add_argument("--batches", default="1,8,16,32")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--max-prompt", type=int, default=400)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--device", default="cpu", choices=("auto", "cpu", "cuda"))
    ap.add_argument("--json", type=Path, default=None, help="also write the figures here")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    batches = [int(b) for b in args.batches.split(",")]
    engine = build_engine(args.pair, policy=FixedK(args.k), max_num_seqs=max(batches),
                          max_model_len=args.max_prompt + args.max_tokens + args.k + 8,
                          device=args.device)
    prompts = code_prompts(engine.tokenizer, max(batches), args.max_prompt)
    print(f"pair {args.pair} ({engine.target.quantization}), {torch.get_num_threads()} "
          f"thread(s), K={args.k}, {args.max_tokens} tokens per request, {len(prompts)} "
          f"distinct prompts", flush=True)
    one_batch(engine, prompts[:2], 8, True)  # warm-up
    rows = []
    for b in batches:
        batch = (prompts * (b // len(prompts) + 1))[:b]
        for arm, spec in (("spec", True), ("off", False)):
            runs = [one_batch(engine, batch, args.max_tokens, spec) for _ in range(args.repeats)]
            wall = statistics.median(r["wall_s"] for r in runs)
            model = statistics.median(r["model_s"] for r in runs)
            row = {"batch": b, "arm": arm, "tok_s": round(runs[0]["tokens"] / wall, 1),
                   "wall_s": round(wall, 3), "model_s": round(model, 3),
                   "bookkeeping_share": round(max(0.0, wall - model) / wall, 3),
                   "rounds": runs[0]["rounds"],
                   "ms_per_round_outside_model": round(
                       1e3 * max(0.0, wall - model) / runs[0]["rounds"], 2)}
            rows.append(row)
            print(row, flush=True)
    by = {(r["batch"], r["arm"]): r for r in rows}
    print("\nbatch  arm   tok/s   bookkeeping share  ms/round outside the model")
    for r in rows:
        print(f"{r['batch']:5d}  {r['arm']:4s} {r['tok_s']:7.1f}   {r['bookkeeping_share']:17.1%}"
              f"  {r['ms_per_round_outside_model']:8.2f}")
    b_max = max(batches)
    summary = {}
    for arm in ("spec", "off"):
        summary[f"{arm}_b{b_max}_over_b1"] = round(by[(b_max, arm)]["tok_s"]
                                                   / by[(1, arm)]["tok_s"], 2)
    for b in batches:
        summary[f"spec_over_off_b{b}"] = round(by[(b, "spec")]["tok_s"] / by[(b, "off")]["tok_s"],
                                               2)
    print("\nSUMMARY " + ", ".join(f"{k} {v}" for k, v in summary.items()))
    if args.json:
        tmp = args.json.with_suffix(".tmp")
        tmp.write_text(json.dumps({"rows": rows, "summary": summary}, indent=2))
        tmp.replace(args.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
