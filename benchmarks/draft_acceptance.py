"""Benchmark: greedy acceptance of one or more drafts for the embedded target, side by side.

For each draft folder: greedy speculative decoding with the bundled engine (K = 4, 128 tokens,
batch 1) on held-out aiohttp source (never trained on), the bundled chat workload and the
bundled RAG workload; printed per workload: acceptance (accepted / drafted, a 95 % bootstrap
interval over requests), mean accepted length and the requests behind them.

Made to compare the draft before and after its on-policy stage (``spectest train-demo-models
--onpolicy-only``, ``spectest/training/onpolicy.py``), e.g. the previous draft from git:

    git worktree add /tmp/before <commit before the stage>
    python benchmarks/draft_acceptance.py --drafts /tmp/before/spectest/models/draft,spectest/models/draft
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "benchmarks")]

from default_config import held_out_code  # noqa: E402
from engine_speedup import prompts_for, run  # noqa: E402
from speedup_figures import acceptance_interval  # noqa: E402
from spectest.engine.api import MODELS_DIR, build_engine  # noqa: E402
from spectest.engine.loader import load_checkpoint  # noqa: E402
from spectest.engine.policies import FixedK  # noqa: E402


def acceptance(draft_dir: str, prompts: list[list[int]]) -> str:
    engine = build_engine("embedded", draft=draft_dir, drafter="draft-model", policy=FixedK(4),
                          max_num_seqs=8, device="cpu")
    _, _, _, stats = run(engine, prompts, 128, 0.0)
    drafted = sum(s.draft_tokens for s in stats)
    accepted = sum(s.accepted_tokens for s in stats)
    drafts = sum(s.drafts for s in stats)
    lo, hi = acceptance_interval(stats)
    return (f"{accepted / drafted:.3f} ({lo:.3f}–{hi:.3f}), mean accepted length "
            f"{1 + accepted / drafts:.2f}, {len(stats)} requests")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--drafts", default=str(MODELS_DIR / "draft"),
                    help="comma-separated draft folders (default: the shipped draft)")
    ap.add_argument("--code-prompts", type=int, default=24)
    ap.add_argument("--chat-prompts", type=int, default=12)
    ap.add_argument("--rag-prompts", type=int, default=8)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    tok = load_checkpoint(MODELS_DIR / "target").tokenizer
    workloads = {"held-out aiohttp code": [tok.encode(t) for t in held_out_code(args.code_prompts)],
                 "chat workload": prompts_for(tok, "chat", args.chat_prompts, 1024),
                 "rag workload": prompts_for(tok, "rag", args.rag_prompts, 3000)}
    print("== greedy acceptance, K = 4, 128 tokens, batch 1 ==")
    for draft in args.drafts.split(","):
        print(draft, flush=True)
        for name, prompts in workloads.items():
            print(f"  {name}: {acceptance(draft, prompts)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
