"""Benchmark: the model pairs on this machine.

``--pair embedded`` (default): parameters, file sizes, held-out loss by domain, decode tokens/s
at batch 1 and 8 for each model (through the KV cache, the way the engine decodes), the cost
ratio c = T_draft / T_target, and the greedy per-token agreement of draft vs target on held-out
text split by domain (code / prose) — teacher-forced, so it is the per-token acceptance a greedy
speculative decoder sees.

``--pair smollm2``: SmolLM2-135M-Instruct as stored (fp32) and with ``--quantize int8``:
decode tokens/s at batch 1 and 8, the verify(K+1 = 5) / step(1) cost ratio at batch 1, what
int8 costs in quality (argmax agreement with fp32 and KL(fp32 ‖ int8) on int8 SmolLM2's own
held-out answers, teacher-forced), and — with the in-repo draft built (``--draft`` names
another) — its tokens/s, c, and greedy agreement with SmolLM2 on held-out prompts of each
workload (records ``spectest train-draft`` never trained on), as the engine drafts with it
(head cut to ``head_tokens.json``) and with its whole head; and with the EAGLE head built
(``spectest train-eagle``; ``--eagle`` names another) its step cost c, its first draft's
agreement with SmolLM2 and the mean accepted length of greedy 4-token chains on the same
held-out answers.
Targets: ≥ 40 tok/s at batch 1 on one thread, verify/step ≤ 1.4, agreement ≥ 0.6.

    python benchmarks/models.py [--pair embedded|smollm2] [--models spectest/models]
                                [--threads N] [--draft smollm2-draft] [--eagle smollm2-eagle]
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import time
from dataclasses import replace
from pathlib import Path

import torch
import torch.nn.functional as F

from spectest.engine.api import MODELS_DIR, prepare_draft, resolve_model_path
from spectest.engine.int8 import quantize_int8
from spectest.engine.loader import CheckpointError, load_checkpoint
from spectest.training import corpus, distill, teacher


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


@torch.inference_mode()
def step_and_verify_ms(model, k: int = 4, context: int = 128, rounds: int = 24):
    """Median ms of a one-token step and of a (k+1)-token verify at batch 1, same context."""
    cache = model.new_cache(1, context + 2 * (k + 1))
    model(torch.randint(0, model.config.vocab_size, (1, context)), cache, last_only=True)
    times: dict[int, list[float]] = {1: [], k + 1: []}
    for i in range(2 * rounds + 4):
        width = 1 if i % 2 else k + 1
        ids = torch.randint(0, model.config.vocab_size, (1, width))
        t0 = time.perf_counter()
        model(ids, cache)
        if i >= 4:
            times[width].append(time.perf_counter() - t0)
        cache.lengths -= width
    return (statistics.median(times[1]) * 1e3, statistics.median(times[k + 1]) * 1e3)


def held_out_answers(target, args) -> teacher.TeacherData:
    """int8 SmolLM2's greedy answers to ``--prompts`` held-out records per workload."""
    prompts = []
    for workload in teacher.WORKLOADS:
        prompts += teacher.workload_prompts(target.tokenizer, workload,
                                            held=True)[:args.prompts]
    return teacher.generate(target.model, prompts, target.tokenizer.eos_token_ids,
                            args.max_tokens, progress=lambda line: None)


def int8_fidelity(fp32, int8, answers: teacher.TeacherData) -> dict:
    """What int8 costs in quality: on the answer positions of ``answers`` (teacher-forced),
    the share where int8's argmax equals fp32's, and KL(fp32 ‖ int8) in nats (mean, p99)."""
    same, kls = 0, []
    for tokens, top_ids in zip(answers.tokens, answers.top_ids):
        n = len(top_ids)
        if n == 0:
            continue
        ids = tokens.long()[None, :-1]
        ref = fp32(ids)[0, -n:].float().log_softmax(-1)  # [n, V]
        got = int8(ids)[0, -n:].float().log_softmax(-1)
        same += int((ref.argmax(-1) == got.argmax(-1)).sum())
        kls.append((ref.exp() * (ref - got)).sum(-1))  # [n]
    kl = torch.cat(kls)
    return {"positions": len(kl), "argmax_agreement": round(same / len(kl), 4),
            "kl_mean": round(float(kl.mean()), 4),
            "kl_p99": round(float(kl.quantile(0.99)), 4)}


def smollm2_draft_report(target, answers, args) -> dict:
    """The in-repo draft beside int8 SmolLM2, as the engine drafts with it (``prepare_draft``:
    its head cut to ``head_tokens.json`` when it has one, int8): speed, c, and held-out
    agreement by workload — and, for comparison, with its whole 49k-token head."""
    try:
        full = load_checkpoint(resolve_model_path(args.draft))
    except CheckpointError as exc:
        return {"draft": f"not measured: {exc}"}
    params = sum(p.numel() for p in full.model.parameters())
    engine_draft = prepare_draft(replace(full, model=copy.deepcopy(full.model)), int8=True)
    quantize_int8(full.model)  # --quantize auto: int8 for the SmolLM2 pair, both models
    out = {"draft": {"path": str(resolve_model_path(args.draft)), "params": params,
                     "head_tokens": (len(full.head_token_ids) if full.head_token_ids
                                     else full.model.config.vocab_size)}}
    for name, model in (("", engine_draft.model), ("whole_head_", full.model)):
        step_ms, _ = step_and_verify_ms(model)
        out["draft"].update({f"{name}decode_tok_s_b1": round(decode_tokens_per_s(model, 1), 1),
                             f"{name}decode_tok_s_b8": round(decode_tokens_per_s(model, 8), 1),
                             f"{name}step_ms": round(step_ms, 2)})
        out[f"{name}heldout_agreement"] = distill.agreement(model, answers)
    return out


@torch.inference_mode()
def eagle_step_ms(drafter, context: int = 128, rounds: int = 48) -> float:
    """Median ms of one EAGLE drafting step at batch 1 (one pair through fc + the layer, then
    the cut head), after ``context`` cached pairs."""
    D = drafter.model.config.hidden_size
    cache, slot = drafter.model.new_cache(1, context + 8), torch.tensor([0])
    drafter.model(torch.randn(1, context, D), torch.randn(1, context, D), cache, slot)
    times = []
    for i in range(rounds + 4):
        feature, token = torch.randn(1, 1, D), torch.randint(0, 1000, (1, 1))
        t0 = time.perf_counter()
        guess = drafter.model(feature, drafter.embed(token), cache, slot)
        drafter.lm_head(guess).argmax(-1)
        if i >= 4:
            times.append(time.perf_counter() - t0)
        cache.lengths -= 1
    return statistics.median(times) * 1e3


def smollm2_eagle_report(target, answers, args) -> dict:
    """The EAGLE head beside int8 SmolLM2 as the engine drafts with it (int8, cut head): step
    cost, and on the held-out answers the first draft's agreement with SmolLM2 and greedy
    K = 4 chains' acceptance (``training.eagle.heldout_figures``, on int8 SmolLM2's features)."""
    from spectest.engine.eagle import EagleDrafter, load_eagle
    from spectest.training.eagle import heldout_figures
    from spectest.training.eagle_data import target_features
    try:
        head, head_ids = load_eagle(resolve_model_path(args.eagle), target.model)
    except CheckpointError as exc:
        return {"eagle": f"not measured: {exc}"}
    ids = torch.tensor(sorted(set(head_ids)))
    embed = target.model.embed_tokens
    features = target_features(target.model, answers, progress=lambda line: None)
    figures = heldout_figures(head, features, embed, embed.weight[ids].detach(), ids, k=4)
    drafter = EagleDrafter(copy.deepcopy(head), target.model, head_ids, 1, 256, int8=True)
    return {"eagle": {"params": sum(p.numel() for p in head.parameters()),
                      "head_tokens": len(ids), "step_ms": round(eagle_step_ms(drafter), 3),
                      "heldout": figures}}


def smollm2_report(args) -> dict:
    report: dict = {"threads": torch.get_num_threads()}
    fp32 = load_checkpoint(resolve_model_path("smollm2"))
    int8 = replace(fp32, model=copy.deepcopy(fp32.model))
    quantize_int8(int8.model)
    for quantize, lm in (("none", fp32), ("int8", int8)):
        step_ms, verify_ms = step_and_verify_ms(lm.model)
        report[f"target_{quantize}"] = {
            "decode_tok_s_b1": round(decode_tokens_per_s(lm.model, 1), 1),
            "decode_tok_s_b8": round(decode_tokens_per_s(lm.model, 8), 1),
            "step_ms": round(step_ms, 2), "verify5_ms": round(verify_ms, 2),
            "verify5_over_step": round(verify_ms / step_ms, 3)}
    answers = held_out_answers(int8, args)
    report["int8_vs_fp32"] = int8_fidelity(fp32.model, int8.model, answers)
    del fp32
    report.update(smollm2_draft_report(int8, answers, args))
    if isinstance(report.get("draft"), dict):
        c = report["draft"]["step_ms"] / report["target_int8"]["step_ms"]
        report["cost_ratio_c_b1"] = round(c, 3)
        agree = report["heldout_agreement"]
        c_whole = report["draft"]["whole_head_step_ms"] / report["target_int8"]["step_ms"]
        report["cost_ratio_c_b1_whole_head"] = round(c_whole, 3)
        report["summary"] = (f"; draft {report['draft']['params'] / 1e6:.1f}M params, "
                             f"head of {report['draft']['head_tokens']} tokens: "
                             f"{report['draft']['decode_tok_s_b1']} tok/s (b1), c = {c:.3f} "
                             f"(whole head: c = {c_whole:.3f}); "
                             "held-out greedy agreement " + ", ".join(
                                 f"{w} {v['agreement']} (n={v['tokens']})"
                                 for w, v in agree.items()) + " (target >= 0.6)")
    report.update(smollm2_eagle_report(int8, answers, args))
    if isinstance(report.get("eagle"), dict):
        e = report["eagle"]
        c = e["step_ms"] / report["target_int8"]["step_ms"]
        report["eagle_cost_ratio_c_b1"] = round(c, 3)
        report["summary"] = report.get("summary", "") + (
            f"; EAGLE head {e['params'] / 1e6:.1f}M params: c = {c:.3f}; held-out first-draft "
            "agreement " + ", ".join(f"{w} {v['first_draft_agreement']}"
                                     for w, v in e["heldout"].items())
            + " (target >= 0.6); accepted of 4 " + ", ".join(
                f"{w} {v['mean_accepted_k4']}" for w, v in e["heldout"].items()))
    print(json.dumps(report, indent=2))
    fp, q = report["target_none"], report["target_int8"]
    print(f"\nSUMMARY SmolLM2-135M on {report['threads']} thread(s): fp32 "
          f"{fp['decode_tok_s_b1']} tok/s (b1), {fp['decode_tok_s_b8']} (b8), verify5/step "
          f"{fp['verify5_over_step']}; int8 {q['decode_tok_s_b1']} tok/s (b1, target >= 40), "
          f"{q['decode_tok_s_b8']} (b8), verify5/step {q['verify5_over_step']} (target <= 1.4)"
          f"; int8 vs fp32 on {report['int8_vs_fp32']['positions']} held-out answer positions: "
          f"argmax agreement {report['int8_vs_fp32']['argmax_agreement']}, KL mean "
          f"{report['int8_vs_fp32']['kl_mean']} nats (p99 {report['int8_vs_fp32']['kl_p99']})"
          + report.get("summary", ""))
    return report


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pair", choices=("embedded", "smollm2"), default="embedded")
    ap.add_argument("--models", type=Path, default=MODELS_DIR)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--prompts", type=int, default=8,
                    help="--pair smollm2: held-out prompts per workload for agreement")
    ap.add_argument("--draft", default="smollm2-draft",
                    help="--pair smollm2: the draft to measure (a short name or a path)")
    ap.add_argument("--eagle", default="smollm2-eagle",
                    help="--pair smollm2: the EAGLE head to measure (a short name or a path)")
    ap.add_argument("--max-tokens", type=int, default=96,
                    help="--pair smollm2: SmolLM2 tokens generated per prompt")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.pair == "smollm2":
        smollm2_report(args)
        return
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
