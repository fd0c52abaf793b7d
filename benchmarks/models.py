"""Benchmark: the embedded target/draft pair on this machine.

Prints parameters, file sizes, held-out loss by domain, decode tokens/s at batch 1 and 8 for
each model (through the KV cache, the way the engine decodes), the cost ratio
c = T_draft / T_target, and the greedy per-token agreement of draft vs target on held-out text
split by domain (code / prose) — teacher-forced, so it is the per-token acceptance a greedy
speculative decoder sees.

    python benchmarks/models.py [--models spectest/models] [--threads N]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from spectest.engine.api import MODELS_DIR
from spectest.engine.loader import load_checkpoint
from spectest.training import corpus


def held_out_streams(tokenizer, max_tokens: int = 60_000) -> dict[str, torch.Tensor]:
    docs = corpus.build_documents(seed=0)
    eos = tokenizer.encode(corpus.EOS)[0]
    out = {}
    for domain in ("code", "prose"):
        ids: list[int] = []
        for d in docs:
            if d.held_out and d.domain == domain:
                ids += tokenizer.encode(d.text) + [eos]
        out[domain] = torch.tensor(ids[:max_tokens])
    return out


@torch.inference_mode()
def loss_and_agreement(target, draft, stream, window=256, batch=8):
    n = (len(stream) - 1) // window // batch * batch
    chunks = stream[:n * window + 1]
    losses, agree, total = {"target": [], "draft": []}, 0, 0
    for i in range(0, n, batch):
        rows = torch.stack([chunks[(i + j) * window:(i + j) * window + window + 1]
                            for j in range(batch)])
        inputs, labels = rows[:, :-1], rows[:, 1:]
        t_logits, d_logits = target(inputs), draft(inputs)
        losses["target"].append(F.cross_entropy(t_logits.flatten(0, 1), labels.flatten()).item())
        losses["draft"].append(F.cross_entropy(d_logits.flatten(0, 1), labels.flatten()).item())
        same = t_logits.argmax(-1) == d_logits.argmax(-1)
        agree += int(same.sum())
        total += same.numel()
    return ({k: sum(v) / len(v) for k, v in losses.items()}, agree / total, total)


@torch.inference_mode()
def decode_tokens_per_s(model, batch: int, steps: int = 64, context: int = 128) -> float:
    cache = model.new_cache(batch, context + steps + 8)
    ids = torch.randint(0, model.config.vocab_size, (batch, context))
    model(ids, cache, last_only=True)
    tok = torch.randint(0, model.config.vocab_size, (batch, 1))
    for _ in range(5):  # warm-up
        model(tok, cache, last_only=True)
    cache.lengths -= 5
    t0 = time.perf_counter()
    for _ in range(steps):
        tok = model(tok, cache, last_only=True).argmax(-1)
    return batch * steps / (time.perf_counter() - t0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", type=Path, default=MODELS_DIR)
    ap.add_argument("--threads", type=int, default=None)
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    target = load_checkpoint(args.models / "target")
    draft = load_checkpoint(args.models / "draft")
    report = {"threads": torch.get_num_threads()}
    for name, m in (("target", target), ("draft", draft)):
        files = sorted((args.models / name).iterdir())
        report[name] = {
            "params": sum(p.numel() for p in m.model.parameters()),
            "layers": m.model.config.num_hidden_layers,
            "hidden": m.model.config.hidden_size,
            "file_mb": round(sum(f.stat().st_size for f in files) / 1e6, 2),
            "decode_tok_s_b1": round(decode_tokens_per_s(m.model, 1), 1),
            "decode_tok_s_b8": round(decode_tokens_per_s(m.model, 8), 1),
        }
    for b in (1, 8):
        c = report["target"][f"decode_tok_s_b{b}"] / report["draft"][f"decode_tok_s_b{b}"]
        report[f"cost_ratio_c_b{b}"] = round(c, 3)
    report["vocab_size"] = target.model.config.vocab_size
    for domain, stream in held_out_streams(target.tokenizer).items():
        losses, agreement, n = loss_and_agreement(target.model, draft.model, stream)
        report[f"heldout_{domain}"] = {"tokens": n, "target_loss": round(losses["target"], 4),
                                       "draft_loss": round(losses["draft"], 4),
                                       "greedy_agreement": round(agreement, 4)}
    print(json.dumps(report, indent=2))
    t, d = report["target"], report["draft"]
    print(f"\nSUMMARY target {t['params'] / 1e6:.2f}M params {t['file_mb']} MB, draft "
          f"{d['params'] / 1e6:.2f}M params {d['file_mb']} MB; c(b1) = "
          f"{report['cost_ratio_c_b1']} (target {t['decode_tok_s_b1']} vs draft "
          f"{d['decode_tok_s_b1']} tok/s), c(b8) = {report['cost_ratio_c_b8']}; greedy "
          f"agreement code {report['heldout_code']['greedy_agreement']}, prose "
          f"{report['heldout_prose']['greedy_agreement']}")


if __name__ == "__main__":
    main()
