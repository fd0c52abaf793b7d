"""The embedded draft's last training stage: distillation on the target's own outputs.

Owns: :func:`onpolicy_stage` — given a trained pair on disk, has the target continue prompts of
the training corpus with the bundled engine and fine-tunes the draft with forward KL to the
target's distributions over the tokens the target wrote, then rewrites the draft and its
figures. Also the pieces: the corpus prompts (:func:`corpus_prompts`, :func:`rag_prompts`) and
the target's continuations (:func:`target_rows`); the loss is ``train.distill_loss`` over the
tokens the target wrote.

Why: the earlier stages distil on corpus text, what people wrote. Serving, the draft predicts
what the *target* writes, and a small target's continuations (repetitive, template-like) are
a different distribution. On the target's own outputs the draft's greedy acceptance on held-out
aiohttp code went from 0.43 to 0.58, on the chat workload from 0.45 to 0.63 and on RAG from
0.54 to 0.65 (``benchmarks/onpolicy_draft.py``, docs/results.md).

Every prompt comes from the training split (held-out files stay unseen): code and prose windows,
chat documents cut where the assistant's turn begins, and long RAG conversations kept whole (so
the draft keeps copying from thousands of positions back). Half the short continuations are
greedy, half sampled at T = 0.8.

Does not know: the earlier stages (``train.py``), the card's wording (``card.py``).
"""

from __future__ import annotations

import json
import random
import time
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from spectest.engine.api import build_engine
from spectest.engine.loader import load_checkpoint
from spectest.engine.requests import GenerationRequest
from spectest.engine.sampling import SamplingParams
from spectest.files import write_atomic
from spectest.training import corpus as corpus_mod
from spectest.training.card import write_model_card
from spectest.training.train import (TrainConfig, encode_stream, evaluate, greedy_agreement,
                                     save_hf, train_lm)

ASSISTANT = "<|im_start|>assistant\n"


@dataclass(frozen=True)
class OnPolicyConfig:
    prompts: int = 2048  # short prompts: code windows, prose windows, chat turns (a third each)
    rag_prompts: int = 128  # long RAG conversations, whole
    context: int = 64  # prompt tokens kept in a short row
    gen: int = 96  # tokens the target writes per prompt
    max_rag_tokens: int = 3000
    steps: int = 300  # batches of 16 short rows; every third step one RAG row instead
    batch: int = 16
    lr: float = 1e-3
    warmup: int = 20

    @classmethod
    def quick(cls) -> "OnPolicyConfig":
        """Seconds long, for tests of the stage on TrainConfig.quick's pair."""
        return cls(prompts=12, rag_prompts=1, context=16, gen=16, steps=6, batch=4)


def corpus_prompts(tokenizer, docs: list[corpus_mod.Document], cfg: OnPolicyConfig,
                   seed: int) -> list[list[int]]:
    """``cfg.prompts`` training prompts (token ids): code windows, prose windows and chat
    documents cut at the assistant's turn (at most 4 × context tokens), in turn."""
    docs = [d for d in docs if not d.held_out]
    pools = ([d for d in docs if d.domain == "code" and ASSISTANT not in d.text],
             [d for d in docs if d.domain == "prose" and ASSISTANT not in d.text],
             [d for d in docs if ASSISTANT in d.text])
    rng = random.Random(seed)
    out: list[list[int]] = []
    for _ in range(100 * cfg.prompts):
        if len(out) == cfg.prompts:
            break
        kind = len(out) % 3
        text = rng.choice(pools[kind]).text
        if kind == 2:
            ids = tokenizer.encode(text[:text.index(ASSISTANT) + len(ASSISTANT)])
            if cfg.context <= len(ids) <= 4 * cfg.context:
                out.append(ids)
            continue
        ids = tokenizer.encode(text[:4000])
        if len(ids) > cfg.context + 8:
            start = rng.randrange(0, len(ids) - cfg.context)
            out.append(ids[start:start + cfg.context])
    return out


def rag_prompts(tokenizer, docs: list[corpus_mod.Document], cfg: OnPolicyConfig
                ) -> list[list[int]]:
    """``cfg.rag_prompts`` long RAG conversations of the training split, cut at the assistant's
    turn, whole (at most ``max_rag_tokens``)."""
    out: list[list[int]] = []
    for doc in docs:
        if len(out) == cfg.rag_prompts:
            break
        if doc.held_out or ASSISTANT not in doc.text:
            continue
        ids = tokenizer.encode(doc.text[:doc.text.index(ASSISTANT) + len(ASSISTANT)])
        if len(ids) <= cfg.max_rag_tokens:
            out.append(ids)
    return out


def target_rows(target_dir: Path, prompts: list[list[int]], gen: int, keep: int | None
                ) -> list[torch.Tensor]:
    """Per prompt, its last ``keep`` tokens (None: all) and the ``gen`` tokens the target wrote
    (every other prompt greedy, the rest at T = 0.8, seeded)."""
    if not prompts:
        return []
    engine = build_engine(str(target_dir), drafter="none", max_num_seqs=32,
                          max_waiting=len(prompts) + 1, device="cpu")
    seqs: dict[str, list[int]] = {}
    for i, prompt in enumerate(prompts):
        rid = uuid.uuid4().hex
        seqs[rid] = list(prompt)
        engine.submit(GenerationRequest(rid, tuple(prompt), SamplingParams(
            max_tokens=gen, temperature=0.0 if i % 2 == 0 else 0.8, seed=i, ignore_eos=True)),
            lambda o: seqs[o.request_id].extend(o.token_ids))
    engine.run_until_idle()
    return [torch.tensor(s[-(keep + gen):] if keep else s) for s in seqs.values()]


def distill(draft, target, rows: torch.Tensor, long_rows: list[torch.Tensor],
            cfg: OnPolicyConfig, seed: int) -> list[float]:
    """``cfg.steps`` steps of ``train.train_lm``'s distillation over the target's tokens only:
    batches of short rows [batch, context + gen]; every third step one long RAG row instead,
    when there are any. Returns the losses."""
    rng = torch.Generator().manual_seed(seed)

    def batches():
        for step in range(cfg.steps):
            if long_rows and step % 3 == 2:
                yield long_rows[int(torch.randint(0, len(long_rows), (1,), generator=rng))][None]
            else:
                yield rows[torch.randint(0, len(rows), (cfg.batch,), generator=rng)]
    for weight in draft.parameters():
        weight.requires_grad_(True)
    return train_lm(draft, batches(), cfg.steps, cfg.lr, cfg.warmup, "draft-onpolicy",
                    teacher=target, tail=cfg.gen)


def onpolicy_stage(out_dir: Path, train_cfg: TrainConfig, cfg: OnPolicyConfig,
                   log=print) -> dict:
    """Fine-tune ``out_dir/draft`` on ``out_dir/target``'s continuations; rewrite the draft,
    ``training_figures.json`` (``onpolicy``: what the stage did; the draft's held-out figures
    now describe the new draft) and the card. The corpus is rebuilt from ``train_cfg``, as
    ``train.train_pair`` built it."""
    out_dir = Path(out_dir)
    seed = train_cfg.seed
    started = time.time()
    docs = corpus_mod.build_documents(seed=seed, held_out_fraction=train_cfg.held_out_fraction,
                                      max_files=train_cfg.max_files)
    long_docs = corpus_mod.long_rag_documents(train_cfg.long_docs, seed,
                                              train_cfg.held_out_fraction,
                                              max_files=train_cfg.max_files)
    target = load_checkpoint(out_dir / "target")
    draft = load_checkpoint(out_dir / "draft")
    tok = target.tokenizer
    torch.manual_seed(seed)
    log(f"on-policy: the target continues {cfg.prompts} short and {cfg.rag_prompts} RAG prompts")
    rows = torch.stack(target_rows(out_dir / "target", corpus_prompts(tok, docs, cfg, seed),
                                   cfg.gen, cfg.context))
    long_rows = target_rows(out_dir / "target", rag_prompts(tok, long_docs, cfg), cfg.gen,
                            keep=None)
    gen_minutes = (time.time() - started) / 60
    log(f"on-policy: {len(rows)} + {len(long_rows)} continuations in {gen_minutes:.1f} min; "
        f"{cfg.steps} distillation steps")
    backend = tok.backend
    held = {dom: encode_stream(backend, [d for d in docs if d.held_out and d.domain == dom])
            for dom in ("code", "prose")}
    held_long = encode_stream(backend, [d for d in long_docs if d.held_out])
    t_model, d_model = target.model.float().eval(), draft.model.float().eval()

    def measured() -> dict:
        with torch.no_grad():
            return {"greedy_agreement": {k: round(greedy_agreement(t_model, d_model, v, train_cfg),
                                                  4) for k, v in held.items()},
                    "long_greedy_agreement": round(greedy_agreement(
                        t_model, d_model, held_long, train_cfg, long=True), 4),
                    "draft_heldout_loss": {k: round(evaluate(d_model, v, train_cfg), 4)
                                           for k, v in held.items()}}
    before = measured()
    losses = distill(d_model, t_model, rows, long_rows, cfg, seed)
    save_hf(d_model, backend, out_dir / "draft")
    d_model = load_checkpoint(out_dir / "draft").model.float().eval()  # the stored fp16 weights
    after = measured()
    head = lambda xs: round(sum(xs) / len(xs), 4)  # noqa: E731
    figures_path = out_dir / "training_figures.json"
    figures = json.loads(figures_path.read_text())
    figures["onpolicy"] = {
        "config": asdict(cfg), "short_rows": len(rows), "rag_rows": len(long_rows),
        "rag_tokens_median": int(sorted(len(r) for r in long_rows)[len(long_rows) // 2])
        if long_rows else 0,
        "kl_first": head(losses[:20]), "kl_last": head(losses[-20:]),
        "before": before, "minutes": round((time.time() - started) / 60, 1),
        "generation_minutes": round(gen_minutes, 1)}
    figures["greedy_agreement"] = after["greedy_agreement"]
    figures["draft_heldout_loss"] = after["draft_heldout_loss"]
    figures.setdefault("long_context", {})["greedy_agreement"] = after["long_greedy_agreement"]
    figures["draft_train_minutes"] = round(figures.get("draft_train_minutes", 0)
                                           + figures["onpolicy"]["minutes"], 1)
    figures["total_minutes"] = round(figures.get("total_minutes", 0)
                                     + figures["onpolicy"]["minutes"], 1)
    write_atomic(figures_path, json.dumps(figures, indent=2) + "\n")
    write_model_card(out_dir, figures)
    log(f"on-policy: done in {figures['onpolicy']['minutes']} min; agreement "
        f"{before['greedy_agreement']} → {after['greedy_agreement']}")
    return figures
