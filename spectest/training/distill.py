"""``spectest train-draft``: a draft model for SmolLM2-135M-Instruct, distilled from SmolLM2.

Owns: the recipe (:class:`DraftRecipe`), the draft's shape (SmolLM2's tokenizer and full
49,152-token vocabulary — llama-server refuses a draft whose vocabulary differs — at a narrow
width, with the embedding initialised from the top principal directions of SmolLM2's, tied to
the head), the training loop (forward KL to SmolLM2's top-k distribution at every answer
position, cross-entropy on prompt tokens, in bf16 autocast), the held-out greedy agreement,
the draft's ``head_tokens.json`` (SmolLM2's most frequent answer tokens: the rows of the head
spectest's engine drafts over), and writing the draft in Hugging Face layout, as GGUF
(``gguf_export``) and with a model card.

Does not know: serving or speculation. SmolLM2's answers come from ``training.teacher``.
Deterministic for a seed and thread count: prompts, initial weights and batches are seeded.
"""

from __future__ import annotations

import json
import math
import random
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from safetensors.torch import save_file

from spectest.engine.api import resolve_model_path
from spectest.engine.int8 import quantize_int8
from spectest.engine.loader import HEAD_TOKENS_FILE, LoadedModel, load_checkpoint
from spectest.engine.model import ModelConfig, Transformer
from spectest.training import teacher
from spectest.training.card import cpu_name, write_draft_card
from spectest.training.gguf_export import write_gguf


@dataclass(frozen=True)
class DraftRecipe:
    seed: int = 0
    hidden_size: int = 192
    intermediate_size: int = 768
    layers: int = 4
    heads: int = 3
    kv_heads: int = 1
    workload_prompts: int | None = None  # per workload (None: every training record)
    corpus_prompts: int = 300
    # extra chat prompts (``training.extra_prompts``): closed-book questions, questions over
    # passages, open-ended tasks, code tasks
    qa_prompts: int = 500
    passage_prompts: int = 150
    open_prompts: int = 400
    code_prompts: int = 250
    answer_tokens: int = 160
    top_k: int = 16
    teacher_batch: int = 24
    head_tokens: int = 8192  # the engine drafts over SmolLM2's most frequent answer tokens
    steps: int = 1400
    batch_size: int = 8
    seq_len: int = 640
    lr: float = 3e-3
    prompt_weight: float = 0.3  # cross-entropy on prompt tokens, beside the KL on answers
    prompt_positions: int = 48  # prompt positions per window that get the loss
    heldout_prompts: int = 16  # per workload, for the agreement figures
    heldout_tokens: int = 96

    @classmethod
    def quick(cls, seed: int = 0) -> "DraftRecipe":
        """A tiny recipe for tests: minutes become seconds, the pipeline is the same."""
        return cls(seed=seed, hidden_size=64, intermediate_size=128, layers=1, heads=1,
                   workload_prompts=2, corpus_prompts=2, qa_prompts=2, passage_prompts=1,
                   open_prompts=1, code_prompts=1, answer_tokens=8, teacher_batch=4,
                   head_tokens=512, steps=4,
                   batch_size=2, seq_len=128, heldout_prompts=1, heldout_tokens=8)


def draft_config(target: ModelConfig, r: DraftRecipe) -> ModelConfig:
    return ModelConfig(vocab_size=target.vocab_size, hidden_size=r.hidden_size,
                       intermediate_size=r.intermediate_size, num_hidden_layers=r.layers,
                       num_attention_heads=r.heads, num_key_value_heads=r.kv_heads,
                       head_dim=r.hidden_size // r.heads,
                       max_position_embeddings=target.max_position_embeddings,
                       rms_norm_eps=1e-5, rope_theta=target.rope_theta,
                       tie_word_embeddings=True)


def init_draft(target: Transformer, cfg: ModelConfig, seed: int) -> Transformer:
    """Random layers; the embedding is SmolLM2's projected onto its top principal directions,
    so token similarities survive the narrower width."""
    torch.manual_seed(seed)
    draft = Transformer(cfg)
    with torch.no_grad():
        for name, p in draft.named_parameters():
            if p.dim() == 2:
                std = 0.02 / math.sqrt(2 * cfg.num_hidden_layers) if name.endswith(
                    ("o_proj.weight", "down_proj.weight")) else 0.02
                p.normal_(0.0, std)
        emb = target.embed_tokens.weight.float()  # [V, D]
        centred = emb - emb.mean(0)
        _, vectors = torch.linalg.eigh(centred.T @ centred)  # ascending eigenvalues
        basis = vectors[:, -cfg.hidden_size:].flip(1)  # [D, d]
        draft.embed_tokens.weight.copy_(emb @ basis)
    return draft


# --- batches ------------------------------------------------------------------------------
def _example(data: teacher.TeacherData, i: int, seq_len: int, k: int):
    """One window ending at the sequence's end: inputs [S], next tokens [S], per-position
    teacher top-k ids/logprobs [S, k], answer mask [S] (padding: target −1)."""
    tokens = data.tokens[i].long()
    n_answer = len(data.top_ids[i])
    prompt_len = len(tokens) - n_answer
    start = max(0, len(tokens) - 1 - seq_len)
    inputs = tokens[start:-1]
    targets = tokens[start + 1:]
    S = len(inputs)
    top_ids = torch.zeros(S, k, dtype=torch.long)
    top_logp = torch.zeros(S, k)  # finite where unused: masked out of the loss
    answer = torch.zeros(S, dtype=torch.bool)
    # answer token a (a = 0..n_answer-1) sits at tokens[prompt_len + a]; it is predicted by
    # the logits at input position prompt_len + a - 1 - start
    for a in range(n_answer):
        pos = prompt_len + a - 1 - start
        if 0 <= pos < S:
            top_ids[pos], top_logp[pos] = data.top_ids[i][a].long(), data.top_logprobs[i][a].float()
            answer[pos] = True
    return inputs, targets, top_ids, top_logp, answer


def _batch(examples, seq_len: int, k: int):
    B = len(examples)
    inputs = torch.zeros(B, seq_len, dtype=torch.long)
    targets = torch.full((B, seq_len), -1, dtype=torch.long)
    top_ids = torch.zeros(B, seq_len, k, dtype=torch.long)
    top_logp = torch.zeros(B, seq_len, k)
    answer = torch.zeros(B, seq_len, dtype=torch.bool)
    for b, (x, y, ti, tl, ans) in enumerate(examples):
        n = len(x)
        inputs[b, :n], targets[b, :n], top_ids[b, :n], top_logp[b, :n], answer[b, :n] = \
            x, y, ti, tl, ans
    return inputs, targets, top_ids, top_logp, answer


def distill_loss(draft: Transformer, inputs, targets, top_ids, top_logp, answer,
                 prompt_weight: float, prompt_positions: int, generator: torch.Generator):
    """KL(teacher top-k ‖ draft) on answer positions + weighted CE on prompt positions.

    inputs/targets [B, S] (target −1 = padding); top_ids/top_logp [B, S, k]; answer [B, S].
    The 49,152-way head is the cost, so it runs only at answer positions and at
    ``prompt_positions`` randomly chosen prompt positions per row, in bf16.
    """
    hidden = draft(inputs, hidden_only=True)  # [B, S, D]
    prompt = (targets >= 0) & ~answer  # [B, S]
    keep = torch.rand(prompt.shape, generator=generator) * prompt  # [B, S]
    if prompt_positions > 0:
        cut = keep.topk(min(prompt_positions, keep.shape[1]), dim=1).values[:, -1:]  # [B, 1]
        prompt = prompt & (keep >= cut) & (keep > 0)
    else:
        prompt = torch.zeros_like(prompt)
    rows = answer | prompt
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = draft.lm_head(hidden[rows])  # [N, V]
    draft_logp = logits.float().log_softmax(-1)  # [N, V]
    is_answer = answer[rows]  # [N]
    teacher_probs = top_logp[rows].softmax(-1)  # [N, k], renormalised over the top k
    kd = -(teacher_probs * draft_logp.gather(-1, top_ids[rows])).sum(-1)  # [N]
    ce = -draft_logp.gather(-1, targets[rows].clamp(min=0)[:, None])[:, 0]  # [N]
    n_answer, n_prompt = is_answer.sum().clamp(min=1), (~is_answer).sum().clamp(min=1)
    return ((kd * is_answer).sum() / n_answer
            + prompt_weight * (ce * ~is_answer).sum() / n_prompt)


def warmup_cosine(opt, steps: int, warmup: int, floor: float):
    """Linear warm-up over ``warmup`` steps, then cosine decay to ``floor`` × the peak."""
    return torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / warmup) * (
        floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * min(1.0, s / max(1, steps))))))


def update(model, opt, sched, loss) -> None:
    """One optimiser step: backward, gradient norm clipped to 1, schedule advanced."""
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    sched.step()


def train(draft: Transformer, data: teacher.TeacherData, r: DraftRecipe, progress=print):
    rng = random.Random(f"spectest-draft:batches:{r.seed}")
    generator = torch.Generator().manual_seed(r.seed)
    opt = torch.optim.AdamW(draft.parameters(), lr=r.lr, betas=(0.9, 0.95), weight_decay=0.0)
    sched = warmup_cosine(opt, r.steps, warmup=max(1, r.steps // 20), floor=0.1)
    draft.train()
    started, losses = time.perf_counter(), []
    for step in range(r.steps):
        picks = [rng.randrange(len(data.tokens)) for _ in range(r.batch_size)]
        inputs, targets, top_ids, top_logp, answer = _batch(
            [_example(data, i, r.seq_len, r.top_k) for i in picks], r.seq_len, r.top_k)
        with torch.autocast("cpu", dtype=torch.bfloat16):  # AMX / AVX-512 bf16 where present
            loss = distill_loss(draft, inputs, targets, top_ids, top_logp, answer,
                                r.prompt_weight, r.prompt_positions, generator)
        update(draft, opt, sched, loss)
        losses.append(loss.item())
        if step % 25 == 0 or step == r.steps - 1:
            elapsed = time.perf_counter() - started
            eta = elapsed / (step + 1) * (r.steps - step - 1)
            progress(f"train-draft: step {step + 1}/{r.steps} loss "
                     f"{sum(losses[-25:]) / len(losses[-25:]):.3f}, {elapsed:.0f} s, "
                     f"~{eta:.0f} s left")
    return draft.eval().requires_grad_(False), time.perf_counter() - started


def head_token_ids(data: teacher.TeacherData, n: int, always: tuple[int, ...] = ()) -> list[int]:
    """The ``n`` tokens SmolLM2 answered with most often (ties by id), plus ``always`` (its
    end-of-turn tokens): the rows of the head the engine drafts over."""
    answers = torch.cat([t[len(t) - len(a):].long() for t, a in zip(data.tokens, data.top_ids)
                         if len(a)])
    counts = torch.bincount(answers)
    order = sorted(range(len(counts)), key=lambda i: (-int(counts[i]), i))
    keep = [i for i in order[:n] if counts[i] > 0]
    return sorted(set(keep) | set(always))


@torch.inference_mode()
def agreement(draft: Transformer, data: teacher.TeacherData,
              head_ids: list[int] | None = None) -> dict[str, dict]:
    """Per source: the share of SmolLM2's answer tokens the draft's argmax predicts, given
    the same prefix (teacher-forced: the per-token acceptance a greedy speculator sees).
    ``head_ids``: the argmax over those tokens only, as the engine drafts (a draft whose head
    was cut, ``model.restrict_head``, drafts over its own ``head_ids``)."""
    rows = None if head_ids is None else torch.tensor(head_ids)
    hits: dict[str, list[int]] = {}
    for prompt, tokens, top_ids in zip(data.prompts, data.tokens, data.top_ids):
        n_answer = len(top_ids)
        if n_answer == 0:
            continue
        tokens = tokens.long()
        logits = draft(tokens[None, :-1])[0, -n_answer:]  # [n_answer, V]
        if draft.head_ids is not None:  # a head already cut (model.restrict_head)
            guess = draft.head_ids[logits.argmax(-1)]
        else:
            guess = logits.argmax(-1) if rows is None else rows[logits[:, rows].argmax(-1)]
        same = (guess == tokens[-n_answer:]).tolist()
        h = hits.setdefault(prompt.source, [0, 0])
        h[0] += sum(same)
        h[1] += len(same)
    return {source: {"agreement": round(a / max(n, 1), 4), "tokens": n}
            for source, (a, n) in sorted(hits.items())}


def heldout_data(target: LoadedModel, r: DraftRecipe, progress=print) -> teacher.TeacherData:
    prompts = []
    for workload in teacher.WORKLOADS:
        prompts += teacher.workload_prompts(target.tokenizer, workload,
                                            held=True)[:r.heldout_prompts]
    return teacher.generate(target.model, prompts, target.tokenizer.eos_token_ids,
                            r.heldout_tokens, r.top_k, progress=progress)


def load_teacher() -> LoadedModel:
    """SmolLM2 as the engine runs it by default (int8); ``teacher.generate`` decodes batches
    with fused attention (``row_exact=False``)."""
    target = load_checkpoint(resolve_model_path("smollm2"))
    quantize_int8(target.model)
    return target


def training_prompts(tok, r: DraftRecipe) -> list[teacher.Prompt]:
    """The recipe's training prompts: the workloads' training records, corpus windows and
    the extra prompts (larger counts keep the smaller set's workload records, corpus
    windows, questions, passages and open tasks; its code tasks are drawn after the open
    tasks, so they differ)."""
    prompts = []
    for workload in teacher.WORKLOADS:
        prompts += teacher.workload_prompts(tok, workload, held=False)[:r.workload_prompts]
    prompts += teacher.corpus_prompts(tok, r.corpus_prompts, r.seed)
    prompts += teacher.rendered_extra_prompts(tok, {
        "qa": r.qa_prompts, "passages": r.passage_prompts, "open": r.open_prompts,
        "code": r.code_prompts}, r.seed)
    return prompts


def teacher_answers(target: LoadedModel, r: DraftRecipe, teacher_cache: Path | None = None,
                    progress=print) -> tuple[teacher.TeacherData, float]:
    """SmolLM2's answers to the recipe's training prompts and the seconds spent generating
    them. With ``teacher_cache``, answers it already holds (same record, same prompt tokens)
    are reused and only the missing ones generated; the cache is then rewritten with both,
    so ``train-draft`` and ``train-eagle`` (which asks for more prompts) share one file."""
    tok = target.tokenizer
    prompts = training_prompts(tok, r)
    have = teacher.TeacherData([], [], [], [])
    if teacher_cache is not None and teacher_cache.is_file():
        have = teacher.TeacherData.load(teacher_cache)
    known = {p.key for p in have.prompts}
    missing = list({p.key: p for p in prompts if p.key not in known}.values())
    seconds = 0.0
    if missing:
        progress(f"generating SmolLM2's answers to {len(missing)} prompts"
                 + (f" ({len(prompts) - len(missing)} reused from {teacher_cache})"
                    if len(missing) < len(prompts) else ""))
        g0 = time.perf_counter()
        new = teacher.generate(target.model, missing, tok.eos_token_ids, r.answer_tokens,
                               r.top_k, batch=r.teacher_batch, progress=progress)
        seconds = time.perf_counter() - g0
        have = have + new
        if teacher_cache is not None:
            teacher_cache.parent.mkdir(parents=True, exist_ok=True)
            have.save(teacher_cache)
    else:
        progress(f"SmolLM2's answers to all {len(prompts)} prompts from {teacher_cache}")
    where = {p.key: i for i, p in enumerate(have.prompts)}
    return have.pick([where[p.key] for p in prompts]), seconds


def train_smollm2_draft(out: Path, r: DraftRecipe, teacher_cache: Path | None = None,
                        progress=print) -> dict:
    t0 = time.perf_counter()
    target = load_teacher()
    tok = target.tokenizer
    data, gen_s = teacher_answers(target, r, teacher_cache, progress)
    held = heldout_data(target, r, progress)
    cfg = draft_config(target.model.config, r)
    draft = init_draft(target.model, cfg, r.seed)  # int8 keeps the embedding in float
    head_ids = head_token_ids(data, r.head_tokens, tuple(tok.eos_token_ids))
    held_answers = torch.cat([t[len(t) - len(a):].long() for t, a in
                              zip(held.tokens, held.top_ids)])
    coverage = float(torch.isin(held_answers, torch.tensor(head_ids)).float().mean())
    before = agreement(draft, held)
    draft, train_s = train(draft, data, r, progress)
    after = agreement(draft, held)
    after_head = agreement(draft, held, head_ids)
    figures = {
        "recipe": asdict(r), "threads": torch.get_num_threads(), "cpu": cpu_name(),
        "params": sum(p.numel() for p in draft.parameters()), "vocab_size": cfg.vocab_size,
        "train_prompts": len(data.prompts), "train_tokens": sum(len(t) for t in data.tokens),
        "answer_tokens": data.answer_tokens,
        "heldout_agreement": after, "heldout_agreement_before_training": before,
        "head_tokens": len(head_ids), "head_coverage_heldout": round(coverage, 4),
        "heldout_agreement_engine_head": after_head,
        "train_sources": {s: sum(1 for p in data.prompts if p.source == s)
                          for s in sorted({p.source for p in data.prompts})},
        "teacher_seconds": round(gen_s, 1), "train_seconds": round(train_s, 1),
        "total_seconds": round(time.perf_counter() - t0, 1),
    }
    save_draft(out, draft, target, figures, head_ids)
    progress(f"train-draft: wrote {out} — held-out agreement "
             + ", ".join(f"{s} {v['agreement']}" for s, v in after.items()))
    return figures


def save_draft(out: Path, draft: Transformer, target: LoadedModel, figures: dict,
               head_ids: list[int]) -> None:
    """HF layout + GGUF + model card, written to a temporary folder and moved into place."""
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    cfg = draft.config
    hf = cfg.to_hf("LlamaForCausalLM")
    hf.update({"bos_token_id": target.tokenizer.bos_token_id, "eos_token_id": 2,
               "torch_dtype": "float16"})
    (tmp / "config.json").write_text(json.dumps(hf, indent=2))
    state = {f"model.{k}" if k != "lm_head.weight" else k: v.half().contiguous()
             for k, v in draft.state_dict().items() if k != "lm_head.weight"}
    save_file(state, str(tmp / "model.safetensors"), metadata={"format": "pt"})
    tok = target.tokenizer
    tok.backend.save(str(tmp / "tokenizer.json"))
    (tmp / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": tok.token_text(1),
        "eos_token": tok.token_text(2), "unk_token": tok.token_text(0),
        "pad_token": tok.token_text(2), "chat_template": tok.chat_template,
        "model_max_length": cfg.max_position_embeddings}, indent=2))
    (tmp / "generation_config.json").write_text(json.dumps(
        {"bos_token_id": tok.bos_token_id, "eos_token_id": 2}, indent=2))
    write_gguf(tmp / "smollm2-draft.gguf", draft, resolve_model_path("smollm2"))
    finish_folder(tmp, out, head_ids, figures, write_draft_card)


def finish_folder(tmp: Path, out: Path, head_ids: list[int], figures: dict, write_card) -> None:
    """The head's token ids, file sizes, figures and card into ``tmp``, then ``tmp`` → ``out``
    in one rename (a reader never sees half a model)."""
    (tmp / HEAD_TOKENS_FILE).write_text(json.dumps({"token_ids": head_ids}))
    figures["files_mb"] = {f.name: round(f.stat().st_size / 1e6, 2)
                           for f in sorted(tmp.iterdir())}
    (tmp / "training_figures.json").write_text(json.dumps(figures, indent=2))
    write_card(tmp, figures)
    shutil.rmtree(out, ignore_errors=True)
    tmp.replace(out)
