"""Benchmark: a draft model's one-token step, its own forward against the folded row decoder.

On the embedded draft as ``build_engine`` prepares it (one torch thread, the engine's default on
two cores), every row holding a few hundred tokens of context:

* per batch size B: the median wall time of one step of B rows (one new token each) through
  the model's batched forward and through ``engine.draft_decode.RowDecoder`` — what decides
  ``drafters.ROW_DECODER_MAX_ROWS``;
* K = 4 one-row steps right after a 5-token verify of the target, as in a round (the verify
  streams the target's weights through the caches and pushes the draft's out), against the
  same steps back to back;
* the largest difference between the two paths' logits (float32 rounding, nothing more).

    python benchmarks/draft_step.py [--batches 1,2,4,8,12,16] [--repeats 300]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from spectest.engine.api import build_engine  # noqa: E402
from spectest.engine.policies import FixedK  # noqa: E402

WARMUP = 30  # steps run before the timed ones


def median_ms(fn, repeats: int, reset) -> float:
    times = []
    with torch.inference_mode():
        for i in range(repeats + WARMUP):
            reset()
            t0 = time.perf_counter()
            fn()
            if i >= WARMUP:
                times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", default="1,2,4,8,12,16")
    ap.add_argument("--repeats", type=int, default=300)
    args = ap.parse_args()
    batches = [int(b) for b in args.batches.split(",")]
    torch.set_num_threads(1)
    engine = build_engine("embedded", "auto", "draft-model", FixedK(4),
                          max_num_seqs=max(batches), max_model_len=2048)
    draft, decoder = engine.drafter.model, engine.drafter.row
    if decoder is None:
        print("draft_step: the draft has no row decoder here (not a float32 CPU model)")
        return 1
    cache = draft.new_cache(max(batches), 2048)
    gen = torch.Generator().manual_seed(0)
    with torch.inference_mode():
        for slot in range(max(batches)):  # contexts of 200 … 395 tokens
            draft(torch.randint(0, 2000, (1, 200 + 13 * slot), generator=gen), cache, [slot])
    lengths = cache.lengths.copy()

    def reset():
        cache.lengths[:] = lengths

    print(f"draft_step: {draft.config.num_hidden_layers}-layer draft, "
          f"{draft.config.hidden_size} wide, 1 thread; median of {args.repeats} steps")
    print(f"{'rows':>5} {'forward ms':>11} {'row decoder ms':>15} {'ratio':>6}")
    for B in batches:
        slots = np.arange(B)
        tokens = torch.randint(0, 2000, (B,), generator=gen)
        forward = median_ms(lambda: draft(tokens[:, None], cache, slots), args.repeats, reset)
        rows = median_ms(lambda: decoder.step(tokens, cache, slots), args.repeats, reset)
        print(f"{B:5d} {forward:11.3f} {rows:15.3f} {rows / forward:6.2f}")

    target = engine.target
    target_cache = target.new_cache(1, 2048)
    token = torch.tensor([5])
    with torch.inference_mode():
        target(torch.randint(0, 2000, (1, 300), generator=gen), target_cache, [0])

    def after_verify(steps: list[float], fn):
        target_cache.lengths[0] = 300
        target(torch.arange(5)[None], target_cache, [0])  # a 5-token verify
        reset()
        t0 = time.perf_counter()
        for _ in range(4):
            fn()
        steps.append(time.perf_counter() - t0)

    for name, fn in (("forward", lambda: draft(token[:, None], cache, [0])),
                     ("row decoder", lambda: decoder.step(token, cache, [0]))):
        cold: list[float] = []
        with torch.inference_mode():
            for _ in range(args.repeats + WARMUP):
                after_verify(cold, fn)
        hot = median_ms(lambda: [fn() for _ in range(4)], args.repeats, reset)
        print(f"4 one-row steps, {name}: {statistics.median(cold[WARMUP:]) * 1e3:.3f} ms right "
              f"after a target verify, {hot:.3f} ms back to back")
    with torch.inference_mode():
        reset()
        want = draft(token[:, None], cache, [0])[0, -1]
        reset()
        got = decoder.step(token, cache, [0])[0]
    print(f"largest logit difference, row decoder vs forward: "
          f"{(got - want).abs().max().item():.2e} (same argmax: "
          f"{bool(got.argmax() == want.argmax())})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
