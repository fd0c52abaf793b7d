"""``spectest profile``: measure what the goodput K policy needs, and where a round's time goes.

Owns: timing one engine round at each (batch size, K) — K = 0 is the target-only step — with
long greedy generations so every round is a pure decode round; the per-position acceptance
P(at least i+1 drafts accepted) at K = k_max; and each round's time split five ways:

* **model compute** — the target's forward over the round's K + 1 tokens a row;
* **drafting** — the drafter's proposal (a draft model's K forwards, or a lookup);
* **verification** — the accept decision: greedy matching or rejection sampling, logprobs;
* **host sync** — the host waiting for the device's result (the round's one fetch);
* **Python bookkeeping** — everything else in the step: scheduling, building the rows,
  emitting tokens, stop rules, round records.

On a GPU the engine waits for the device at each phase boundary while profiling
(``SpecEngine.phase_sync``), so kernels are charged to the phase that launched them; serving
never does (there the device's time shows up as host sync). Writes a
:class:`~spectest.engine.policies.Profile` whose ``meta["phases_ms"]`` holds the split.

Does not know: HTTP. Uses the same engine the server runs, on the caller's thread.
"""

from __future__ import annotations

import argparse
import statistics
import time
import uuid
from pathlib import Path

import torch

from spectest.engine.api import DRAFTERS, build_engine
from spectest.engine.device import DEVICE_CHOICES, DTYPE_CHOICES
from spectest.engine.int8 import QUANTIZE_CHOICES
from spectest.engine.policies import FixedK, Profile
from spectest.engine.requests import GenerationRequest
from spectest.engine.sampling import SamplingParams

PROMPTS = ("def parse_args(argv):\n    parser = argparse.ArgumentParser(",
           "The :mod:`collections` module implements specialized container datatypes",
           "<|im_start|>user\nHow do I read a file line by line?<|im_end|>\n"
           "<|im_start|>assistant\n",
           "class LRUCache:\n    def __init__(self, capacity):\n")
PHASES = ("model compute", "drafting", "verification", "host sync", "Python bookkeeping")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="embedded")
    p.add_argument("--draft", default="auto")
    p.add_argument("--quantize", choices=QUANTIZE_CHOICES, default="auto")
    p.add_argument("--drafter", choices=DRAFTERS, default="draft-model")
    p.add_argument("--device", choices=DEVICE_CHOICES, default="auto",
                   help="cuda, cpu, or auto = a GPU when torch sees one")
    p.add_argument("--dtype", choices=DTYPE_CHOICES, default="auto")
    p.add_argument("--threads", type=int, default=1,
                   help="torch CPU threads (default 1: what the sweep's and the audit's "
                        "servers run with, and spectest serve's default on 2 cores)")
    p.add_argument("--batch-sizes", default="1,2,4,8,16")
    p.add_argument("--k-max", type=int, default=8)
    p.add_argument("--rounds", type=int, default=12, help="timed rounds per (batch, K)")
    p.add_argument("--out", type=Path, default=Path("profile.json"))


def measure(engine, batch: int, k: int, rounds: int) -> tuple[float, list, dict[str, float]]:
    """Median seconds per decode round at this batch size and K, the round records, and the
    median split of a round (seconds per phase, :data:`PHASES`)."""
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
    timed_from = len(records)
    while len(times) < rounds and engine.scheduler.has_work():
        t0 = time.perf_counter()
        engine.step()
        times.append(time.perf_counter() - t0)
    for request_id in [s.request.request_id for s in engine.scheduler.running.values()]:
        engine.cancel(request_id)
    engine.run_until_idle()
    engine.observers.remove(records.append)
    timed = records[timed_from:timed_from + len(times)]
    return statistics.median(times), records, split(timed, times)


def split(records: list, step_seconds: list[float]) -> dict[str, float]:
    """The median seconds of each phase over rounds (``step_seconds``: each round's whole
    step, whose remainder is bookkeeping)."""
    if not records:
        return dict.fromkeys(PHASES, 0.0)
    parts = [(r.target_seconds, r.draft_seconds, r.accept_seconds, r.sync_seconds)
             for r in records]
    out = {name: statistics.median(p[i] for p in parts) for i, name in enumerate(PHASES[:4])}
    rest = [step - sum(p) for p, step in zip(parts, step_seconds)]
    out["Python bookkeeping"] = max(0.0, statistics.median(rest))
    return out


def format_split(phases: dict[str, float]) -> str:
    total = sum(phases.values()) or 1.0
    return ", ".join(f"{name} {seconds * 1e3:.2f} ms ({seconds / total:.0%})"
                     for name, seconds in phases.items())


def run_profile(args) -> Profile:
    batches = [int(b) for b in str(args.batch_sizes).split(",")]
    torch.set_num_threads(max(1, getattr(args, "threads", 1) or 1))
    engine = build_engine(args.model, args.draft, args.drafter, FixedK(args.k_max),
                          max_num_seqs=max(batches), max_model_len=2048,
                          quantize=args.quantize, device=getattr(args, "device", "auto"),
                          dtype=getattr(args, "dtype", "auto"))
    engine.phase_sync = True  # charge a GPU's kernels to the phase that launched them
    weights = engine.target.quantization if engine.target.quantization != "none" else \
        str(engine.place.dtype).removeprefix("torch.")
    print(f"profile: {args.model} on {engine.place.describe()}, {weights} weights, drafter "
          f"{engine.drafter.name}, {torch.get_num_threads()} torch thread(s)", flush=True)
    step_seconds: dict[int, dict[int, float]] = {}
    phases_ms: dict[str, dict[str, dict[str, float]]] = {}
    accepted_at_least = [0] * args.k_max
    drafts = 0
    for b in batches:
        step_seconds[b] = {}
        phases_ms[str(b)] = {}
        for k in range(0, args.k_max + 1):
            seconds, records, phases = measure(engine, b, k, args.rounds)
            step_seconds[b][k] = seconds
            phases_ms[str(b)][str(k)] = {n: round(s * 1e3, 4) for n, s in phases.items()}
            print(f"profile: batch {b:3d} K {k}: {seconds * 1e3:7.2f} ms/round — "
                  f"{format_split(phases)}", flush=True)
            if k == args.k_max and b == batches[0]:
                for rec in records:
                    for row in rec.rows:
                        if row.k_proposed == args.k_max:
                            drafts += 1
                            for i in range(row.accepted):
                                accepted_at_least[i] += 1
    profile = Profile(step_seconds, tuple(a / max(drafts, 1) for a in accepted_at_least),
                      {"drafter": engine.drafter.name, "model": str(args.model),
                       "rounds": args.rounds, "device": engine.place.describe(),
                       "phases_ms": phases_ms})
    profile.save(args.out)
    print(f"profile: per-position acceptance "
          f"{[round(a, 3) for a in profile.accept_at_least]}; wrote {args.out}")
    return profile
