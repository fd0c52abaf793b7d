"""``spectest profile``: measure what the goodput K policy needs.

Owns: timing one engine round at each (batch size, K) — K = 0 is the target-only step — with
long greedy generations so every round is a pure decode round, and the per-position acceptance
P(at least i+1 drafts accepted) at K = k_max. Writes a :class:`~spectest.engine.policies.Profile`.

Does not know: HTTP. Uses the same engine the server runs, on the caller's thread.
"""

from __future__ import annotations

import argparse
import statistics
import time
import uuid
from pathlib import Path

from spectest.engine.api import DRAFTERS, build_engine
from spectest.engine.int8 import QUANTIZE_CHOICES
from spectest.engine.policies import FixedK, Profile
from spectest.engine.requests import GenerationRequest
from spectest.engine.sampling import SamplingParams

PROMPTS = ("def parse_args(argv):\n    parser = argparse.ArgumentParser(",
           "The :mod:`collections` module implements specialized container datatypes",
           "<|im_start|>user\nHow do I read a file line by line?<|im_end|>\n"
           "<|im_start|>assistant\n",
           "class LRUCache:\n    def __init__(self, capacity):\n")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="embedded")
    p.add_argument("--draft", default="auto")
    p.add_argument("--quantize", choices=QUANTIZE_CHOICES, default="auto")
    p.add_argument("--drafter", choices=DRAFTERS, default="draft-model")
    p.add_argument("--batch-sizes", default="1,2,4,8,16")
    p.add_argument("--k-max", type=int, default=8)
    p.add_argument("--rounds", type=int, default=12, help="timed rounds per (batch, K)")
    p.add_argument("--out", type=Path, default=Path("profile.json"))


def measure(engine, batch: int, k: int, rounds: int) -> tuple[float, list]:
    """Mean seconds per decode round at this batch size and K, and the round records."""
    engine.policy = FixedK(k)
    records: list = []
    engine.observers.append(records.append)
    tok = engine.tokenizer
    max_tokens = (rounds + 3) * (k + 1) + 2
    for i in range(batch):
        ids = tuple(tok.encode(PROMPTS[i % len(PROMPTS)]))
        engine.submit(GenerationRequest(uuid.uuid4().hex, ids, SamplingParams(
            max_tokens=max_tokens, ignore_eos=True)), lambda out: None)
    times = []
    engine.step()  # admission + prefill + first round: not timed
    while len(times) < rounds and engine.scheduler.has_work():
        t0 = time.perf_counter()
        engine.step()
        times.append(time.perf_counter() - t0)
    for request_id in [s.request.request_id for s in engine.scheduler.running.values()]:
        engine.cancel(request_id)
    engine.run_until_idle()
    engine.observers.remove(records.append)
    return statistics.median(times), records


def run_profile(args) -> Profile:
    batches = [int(b) for b in str(args.batch_sizes).split(",")]
    engine = build_engine(args.model, args.draft, args.drafter, FixedK(args.k_max),
                          max_num_seqs=max(batches), max_model_len=2048,
                          quantize=args.quantize)
    step_seconds: dict[int, dict[int, float]] = {}
    accepted_at_least = [0] * args.k_max
    drafts = 0
    for b in batches:
        step_seconds[b] = {}
        for k in range(0, args.k_max + 1):
            seconds, records = measure(engine, b, k, args.rounds)
            step_seconds[b][k] = seconds
            print(f"profile: batch {b:3d} K {k}: {seconds * 1e3:7.2f} ms/round", flush=True)
            if k == args.k_max and b == batches[0]:
                for rec in records:
                    for row in rec.rows:
                        if row.k_proposed == args.k_max:
                            drafts += 1
                            for i in range(row.accepted):
                                accepted_at_least[i] += 1
    profile = Profile(step_seconds, tuple(a / max(drafts, 1) for a in accepted_at_least),
                      {"drafter": engine.drafter.name, "model": str(args.model),
                       "rounds": args.rounds})
    profile.save(args.out)
    print(f"profile: per-position acceptance "
          f"{[round(a, 3) for a in profile.accept_at_least]}; wrote {args.out}")
    return profile
