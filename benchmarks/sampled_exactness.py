"""Benchmark-style check: does a drafter's *sampled* output follow target-only sampling?

In-process, on int8 SmolLM2 (``--model``), N sampled continuations of one prompt with the
drafter against N with speculation off (same engine settings, batch 8, seeds 0..N-1), and a
two-sample χ² test of the continuations' prefixes of length 2..5 (prefixes seen fewer than 10
times pooled into one cell). Under exact speculative sampling each p-value is uniform: one
below 0.01 happens 1 % of the time by chance. This is the direct check behind the README's
note on the auditor's sampled test (whose null — the baseline's echo scores — is not what int8
decoding samples from):

    python benchmarks/sampled_exactness.py --drafter ngram+eagle --prompt code --temperature 0.9
    python benchmarks/sampled_exactness.py --drafter ngram+eagle --prompt chat \\
        --temperature 0.5 --top-k 20 --top-p 0.95
"""

from __future__ import annotations

import argparse
import collections

import torch
from scipy import stats

from spectest.engine.api import build_engine
from spectest.engine.policies import FixedK
from spectest.engine.requests import GenerationRequest
from spectest.engine.sampling import SamplingParams

PROMPTS = {  # code: its suffix recurs, so prompt lookup drafts; chat: the head drafts more
    "code": "def add(a, b):\n    return a + b\n\ndef mul(a, b):\n    return a * b\n\n"
            "def add(a, b):\n    return",
    "chat": "<|im_start|>user\nGive me three tips for a job interview, and repeat the word "
            "interview.<|im_end|>\n<|im_start|>assistant\n",
}


def sample(args, drafter: str, speculative: bool) -> list[tuple[int, ...]]:
    engine = build_engine(args.model, drafter=drafter, policy=FixedK(args.k), max_num_seqs=8,
                          max_model_len=256, max_waiting=args.n)
    ids = tuple(engine.tokenizer.encode(PROMPTS[args.prompt]))
    out = collections.defaultdict(list)
    for i in range(args.n):
        params = SamplingParams(max_tokens=5, temperature=args.temperature, top_k=args.top_k,
                                top_p=args.top_p, seed=i, ignore_eos=True)
        engine.submit(GenerationRequest(f"r{i}", ids, params, speculative=speculative),
                      lambda o: out[o.request_id].extend(o.token_ids))
    engine.run_until_idle()
    return [tuple(out[f"r{i}"]) for i in range(args.n)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--drafter", default="ngram+eagle")
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--prompt", choices=sorted(PROMPTS), default="code")
    ap.add_argument("--n", type=int, default=1500, help="continuations per arm")
    ap.add_argument("--temperature", type=float, default=0.9)
    ap.add_argument("--top-k", type=int, default=0)
    ap.add_argument("--top-p", type=float, default=1.0)
    args = ap.parse_args()
    torch.set_num_threads(2)
    spec = sample(args, args.drafter, True)
    base = sample(args, "none", False)
    for length in range(2, 6):
        a = collections.Counter(s[:length] for s in spec)
        b = collections.Counter(s[:length] for s in base)
        keys = [k for k in set(a) | set(b) if a[k] + b[k] >= 10]
        rest = [args.n - sum(a[k] for k in keys), args.n - sum(b[k] for k in keys)]
        table = [[a[k] for k in keys], [b[k] for k in keys]]
        if sum(rest):
            table = [table[0] + [rest[0]], table[1] + [rest[1]]]
        _, p, _, _ = stats.chi2_contingency(table)
        print(f"{args.drafter} vs target-only, {args.n} each, prefix length {length}: "
              f"{len(table[0])} cells, p = {p:.3g}", flush=True)


if __name__ == "__main__":
    main()
