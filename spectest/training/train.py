"""Train the embedded target/draft pair: BPE tokenizer, target LM, draft distilled from target.

Owns: the recipe (`TrainConfig`), the training loops (next-token cross-entropy for the target
and the draft's warm start; forward KL to the target's logits for the draft's distillation),
the context extension (both models continue on 4,096-token windows, half of them long
multi-passage RAG conversations, after training on 512-token ones — the usual way long-context
models are made, since attention over long windows costs more per step), held-out evaluation,
and writing both models in Hugging Face layout with a model card.

Does not know: serving or speculation. Deterministic for a given seed and thread count:
documents, tokenizer merges, initial weights and batch sampling all come from the seed.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import save_file
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from spectest.engine.model import ModelConfig, Transformer
from spectest.training import corpus as corpus_mod
from spectest.training.card import write_model_card


@dataclass(frozen=True)
class TrainConfig:
    seed: int = 0
    vocab_size: int = 2048
    seq_len: int = 512
    batch_size: int = 8
    target: ModelConfig = field(default_factory=lambda: ModelConfig(
        vocab_size=2048, hidden_size=256, intermediate_size=768, num_hidden_layers=8,
        num_attention_heads=4, num_key_value_heads=2, head_dim=64,
        max_position_embeddings=4096, rope_theta=10000.0, rms_norm_eps=1e-5))
    draft: ModelConfig = field(default_factory=lambda: ModelConfig(
        vocab_size=2048, hidden_size=128, intermediate_size=384, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=1, head_dim=64,
        max_position_embeddings=4096, rope_theta=10000.0, rms_norm_eps=1e-5,
        tie_word_embeddings=True))
    target_steps: int = 1100
    draft_steps: int = 2500
    distill_steps: int = 800
    long_seq_len: int = 4096  # context extension: windows of this length, batch 1
    long_steps: int = 200  # target
    long_distill_steps: int = 120  # draft (distillation, as its last phase)
    long_lr: float = 1e-3
    long_docs: int = 400  # long RAG conversations (corpus.long_rag_documents)
    lr: float = 3e-3
    draft_lr: float = 4e-3
    warmup: int = 50
    eval_batches: int = 16
    held_out_fraction: float = 0.03
    max_files: int | None = None  # tests: a small corpus

    @classmethod
    def quick(cls, seed: int = 0) -> "TrainConfig":
        """A minutes-long recipe on a slice of the corpus, for tests of reproducibility."""
        small_t = replace(cls().target, num_hidden_layers=2, hidden_size=64, head_dim=32,
                          intermediate_size=128, vocab_size=512)
        small_d = replace(cls().draft, hidden_size=32, head_dim=16, intermediate_size=64,
                          vocab_size=512)
        return cls(seed=seed, vocab_size=512, seq_len=64, batch_size=8, target=small_t,
                   draft=small_d, target_steps=30, draft_steps=20, distill_steps=20,
                   long_seq_len=128, long_steps=6, long_distill_steps=4, long_docs=12,
                   eval_batches=4, max_files=40, held_out_fraction=0.25)


def log(msg: str) -> None:
    print(f"[train {time.strftime('%H:%M:%S')}] {msg}", flush=True)


# --- tokenizer ------------------------------------------------------------------------------
def train_tokenizer(texts: list[str], vocab_size: int) -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=list(corpus_mod.SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(texts, trainer=trainer)
    return tok


def encode_stream(tok: Tokenizer, docs: list[corpus_mod.Document]) -> torch.Tensor:
    """All documents as one token stream, separated by <|endoftext|>."""
    eos = tok.token_to_id(corpus_mod.EOS)
    ids: list[int] = []
    for enc in tok.encode_batch([d.text for d in docs]):
        ids.extend(enc.ids)
        ids.append(eos)
    return torch.tensor(ids, dtype=torch.int16 if tok.get_vocab_size() < 2**15 else torch.int32)


def batches(stream: torch.Tensor, seq_len: int, batch_size: int, gen: torch.Generator):
    """Endless random windows [B, T+1] from the stream."""
    while True:
        starts = torch.randint(0, len(stream) - seq_len - 1, (batch_size,), generator=gen)
        yield torch.stack([stream[s:s + seq_len + 1] for s in starts.tolist()]).long()


def long_batches(streams: list[torch.Tensor], seq_len: int, gen: torch.Generator):
    """Endless single windows [1, T+1], taken from each stream in turn."""
    each = [batches(s, seq_len, 1, gen) for s in streams]
    while True:
        for data in each:
            yield next(data)


def lr_at(step: int, total: int, peak: float, warmup: int) -> float:
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


def init_weights(model: Transformer, std: float = 0.02) -> Transformer:
    """GPT-style init: N(0, std) matrices and embeddings, zero biases, unit norms."""
    for name, p in model.named_parameters():
        if p.dim() >= 2:
            torch.nn.init.normal_(p, std=std)
        elif name.endswith("bias"):
            torch.nn.init.zeros_(p)
    return model


def _optimizer(model: Transformer, lr: float) -> torch.optim.Optimizer:
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    return torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                              {"params": no_decay, "weight_decay": 0.0}],
                             lr=lr, betas=(0.9, 0.95))


def distill_loss(model: Transformer, teacher: Transformer, inputs: torch.Tensor,
                 tail: int | None = None) -> torch.Tensor:
    """Forward KL(teacher ‖ model), batch-mean over the positions of inputs [B, T] — or over
    the last ``tail`` of them only (predicting position t reads the logits at t − 1)."""
    keep = slice(-tail, None) if tail else slice(None)  # log-softmax only the kept positions
    with torch.autocast("cpu", dtype=torch.bfloat16):
        model_logprobs = F.log_softmax(model(inputs)[:, keep].float(), -1)  # [B, tail or T, V]
        with torch.no_grad():
            teacher_logprobs = F.log_softmax(teacher(inputs)[:, keep].float(), -1)
        return F.kl_div(model_logprobs.flatten(0, 1), teacher_logprobs.flatten(0, 1),
                        log_target=True, reduction="batchmean")


def train_lm(model: Transformer, data, steps: int, lr: float, warmup: int, name: str,
             teacher: Transformer | None = None, tail: int | None = None) -> list[float]:
    """Cross-entropy training on ``data`` (windows [B, T+1]), or forward-KL distillation when a
    ``teacher`` is given (over the last ``tail`` positions only, if given)."""
    opt = _optimizer(model, lr)
    model.train()
    losses = []
    t0 = time.time()
    for step in range(steps):
        for group in opt.param_groups:
            group["lr"] = lr_at(step, steps, lr, warmup)
        chunk = next(data)
        inputs, targets = chunk[:, :-1], chunk[:, 1:]
        if teacher is None:
            with torch.autocast("cpu", dtype=torch.bfloat16):
                logits = model(inputs)  # [B, T, V]
                loss = F.cross_entropy(logits.float().flatten(0, 1), targets.flatten())
        else:
            loss = distill_loss(model, teacher, inputs, tail)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(loss.item())
        if step % 50 == 0 or step == steps - 1:
            rate = (step + 1) / (time.time() - t0)
            eta = (steps - step - 1) / rate
            log(f"{name} step {step + 1}/{steps} loss {loss.item():.3f} "
                f"({rate:.2f} steps/s, eta {eta / 60:.1f} min)")
    model.eval()
    return losses


def _eval_windows(stream: torch.Tensor, cfg: TrainConfig, long: bool, seed: int):
    """The fixed held-out windows: ``eval_batches`` batches of the short shape, or as many
    single long windows as hold the same number of tokens (at least 2)."""
    gen = torch.Generator().manual_seed(seed)
    if not long:
        return [next(batches(stream, cfg.seq_len, cfg.batch_size, gen))
                for _ in range(cfg.eval_batches)]
    n = max(2, cfg.eval_batches * cfg.batch_size * cfg.seq_len // cfg.long_seq_len)
    return [next(batches(stream, cfg.long_seq_len, 1, gen)) for _ in range(n)]


@torch.no_grad()
def evaluate(model: Transformer, stream: torch.Tensor, cfg: TrainConfig,
             long: bool = False) -> float:
    """Mean held-out next-token cross-entropy (nats/token) on fixed windows."""
    return position_losses(model, stream, cfg, long, parts=1)[0]


@torch.no_grad()
def position_losses(model: Transformer, stream: torch.Tensor, cfg: TrainConfig,
                    long: bool = False, parts: int = 4) -> list[float]:
    """Held-out cross-entropy (nats/token) in ``parts`` equal spans of window positions: a model
    that uses its context has lower loss late in the window than early."""
    windows = _eval_windows(stream, cfg, long, 1234)
    totals = torch.zeros(parts)
    for chunk in windows:
        losses = F.cross_entropy(model(chunk[:, :-1]).transpose(1, 2), chunk[:, 1:],
                                 reduction="none")  # [B, T]
        totals += torch.stack([span.mean() for span in losses.chunk(parts, dim=1)])
    return (totals / len(windows)).tolist()


@torch.no_grad()
def greedy_agreement(target: Transformer, draft: Transformer, stream: torch.Tensor,
                     cfg: TrainConfig, long: bool = False) -> float:
    """Share of held-out positions where draft and target argmax agree (teacher forcing)."""
    agree = n = 0
    for chunk in _eval_windows(stream, cfg, long, 4321):
        inputs = chunk[:, :-1]
        same = target(inputs).argmax(-1) == draft(inputs).argmax(-1)
        agree += int(same.sum())
        n += same.numel()
    return agree / n


# --- export ---------------------------------------------------------------------------------
def save_hf(model: Transformer, tok: Tokenizer, out: Path, dtype=torch.float16) -> None:
    """Hugging Face layout: config.json, model.safetensors, tokenizer files. Atomic per dir."""
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    cfg = model.config
    eos = tok.token_to_id(corpus_mod.EOS)
    im_end = tok.token_to_id(corpus_mod.IM_END)
    hf_cfg = cfg.to_hf() | {"bos_token_id": eos, "eos_token_id": [im_end, eos],
                            "torch_dtype": str(dtype).removeprefix("torch.")}
    (tmp / "config.json").write_text(json.dumps(hf_cfg, indent=2) + "\n")
    (tmp / "generation_config.json").write_text(json.dumps(
        {"bos_token_id": eos, "eos_token_id": [im_end, eos]}, indent=2) + "\n")
    state = {}
    for name, tensor in model.state_dict().items():
        if cfg.tie_word_embeddings and name == "lm_head.weight":
            continue
        hf_name = name if name.startswith("lm_head") else f"model.{name}"
        state[hf_name] = tensor.detach().to(dtype).contiguous()
    save_file(state, str(tmp / "model.safetensors"), metadata={"format": "pt"})
    tok.save(str(tmp / "tokenizer.json"))
    (tmp / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": None, "eos_token": corpus_mod.IM_END, "pad_token": corpus_mod.EOS,
        "unk_token": None, "model_max_length": cfg.max_position_embeddings,
        "add_bos_token": False, "clean_up_tokenization_spaces": False,
        "chat_template": corpus_mod.CHAT_TEMPLATE,
    }, indent=2) + "\n")
    (tmp / "special_tokens_map.json").write_text(json.dumps(
        {"eos_token": corpus_mod.IM_END, "pad_token": corpus_mod.EOS}, indent=2) + "\n")
    if out.exists():
        shutil.rmtree(out)
    os.replace(tmp, out)


def _roundtrip(model: Transformer, dtype) -> Transformer:
    """The model as it will be loaded: weights through the storage dtype and back to fp32."""
    copy = Transformer(model.config)
    copy.load_state_dict({k: v.to(dtype).float() for k, v in model.state_dict().items()})
    return copy.eval()


def train_pair(out_dir: Path, cfg: TrainConfig = TrainConfig(), threads: int | None = None,
               doc_root: Path = corpus_mod.DOC_ROOT) -> dict:
    """The whole recipe. Writes ``out_dir/target``, ``out_dir/draft`` and returns figures."""
    if threads:
        torch.set_num_threads(threads)
    torch.manual_seed(cfg.seed)
    started = time.time()
    log("assembling corpus")
    docs = corpus_mod.build_documents(seed=cfg.seed, held_out_fraction=cfg.held_out_fraction,
                                      doc_root=doc_root, max_files=cfg.max_files)
    train_docs = [d for d in docs if not d.held_out]
    log(f"{len(docs)} documents, {sum(len(d.text) for d in docs) / 1e6:.1f} MB; "
        "training the tokenizer")
    tok = train_tokenizer([d.text for d in train_docs], cfg.vocab_size)
    train_stream = encode_stream(tok, train_docs)
    held = {dom: encode_stream(tok, [d for d in docs if d.held_out and d.domain == dom])
            for dom in ("code", "prose")}
    long_docs = corpus_mod.long_rag_documents(cfg.long_docs, cfg.seed, cfg.held_out_fraction,
                                              doc_root, cfg.max_files)
    long_stream = encode_stream(tok, [d for d in long_docs if not d.held_out])
    held_long = encode_stream(tok, [d for d in long_docs if d.held_out])
    log(f"train stream {len(train_stream) / 1e6:.2f}M tokens, long RAG "
        f"{len(long_stream) / 1e6:.2f}M; held-out "
        + ", ".join(f"{k} {len(v) / 1e3:.0f}k" for k, v in held.items())
        + f", long {len(held_long) / 1e3:.0f}k")
    target_cfg = replace(cfg.target, vocab_size=tok.get_vocab_size())
    draft_cfg = replace(cfg.draft, vocab_size=tok.get_vocab_size())

    gen = torch.Generator().manual_seed(cfg.seed)
    target = init_weights(Transformer(target_cfg))
    t0 = time.time()
    target_losses = train_lm(target, batches(train_stream, cfg.seq_len, cfg.batch_size, gen),
                             cfg.target_steps, cfg.lr, cfg.warmup, "target")
    long_before = position_losses(target, held_long, cfg, long=True)
    log(f"target loss by quarter of a {cfg.long_seq_len}-token held-out window before the "
        f"context extension: {[round(x, 3) for x in long_before]}")
    long_data = long_batches([train_stream, long_stream], cfg.long_seq_len, gen)
    train_lm(target, long_data, cfg.long_steps, cfg.long_lr, cfg.warmup // 2, "target-long")
    target_minutes = (time.time() - t0) / 60
    target = _roundtrip(target, torch.float16)

    torch.manual_seed(cfg.seed + 1)
    draft = init_weights(Transformer(draft_cfg))
    t0 = time.time()
    draft_losses = train_lm(draft, batches(train_stream, cfg.seq_len, cfg.batch_size, gen),
                            cfg.draft_steps, cfg.draft_lr, cfg.warmup, "draft")
    agreement_plain = {k: greedy_agreement(target, draft, v, cfg) for k, v in held.items()}
    log(f"draft agreement before distillation: {agreement_plain}")
    distill_losses = train_lm(draft, batches(train_stream, cfg.seq_len, cfg.batch_size, gen),
                              cfg.distill_steps, cfg.draft_lr / 2, cfg.warmup, "draft-distill",
                              teacher=target)
    long_data = long_batches([train_stream, long_stream], cfg.long_seq_len, gen)
    train_lm(draft, long_data, cfg.long_distill_steps, cfg.long_lr, cfg.warmup // 2,
             "draft-distill-long", teacher=target)
    draft_minutes = (time.time() - t0) / 60
    draft = _roundtrip(draft, torch.float16)

    figures = {
        "seed": cfg.seed,
        "corpus_mb": round(sum(len(d.text) for d in docs) / 1e6, 2),
        "train_tokens": len(train_stream),
        "held_out_tokens": {k: len(v) for k, v in held.items()},
        "target_params": sum(p.numel() for p in target.parameters()),
        "draft_params": sum(p.numel() for p in draft.parameters()),
        "target_heldout_loss": {k: round(evaluate(target, v, cfg), 4) for k, v in held.items()},
        "draft_heldout_loss": {k: round(evaluate(draft, v, cfg), 4) for k, v in held.items()},
        "greedy_agreement_before_distill": {k: round(v, 4) for k, v in agreement_plain.items()},
        "greedy_agreement": {k: round(greedy_agreement(target, draft, v, cfg), 4)
                             for k, v in held.items()},
        "long_context": {
            "window": cfg.long_seq_len,
            "held_out_tokens": len(held_long),
            "target_loss_by_quarter_before_extension": [round(x, 4) for x in long_before],
            "target_loss_by_quarter": [round(x, 4) for x in
                                       position_losses(target, held_long, cfg, long=True)],
            "greedy_agreement": round(greedy_agreement(target, draft, held_long, cfg,
                                                       long=True), 4),
        },
        "target_final_train_loss": round(sum(target_losses[-20:]) / len(target_losses[-20:]), 4),
        "draft_final_distill_loss": round(sum(distill_losses[-20:]) / len(distill_losses[-20:]), 4),
        "draft_final_train_loss": round(sum(draft_losses[-20:]) / len(draft_losses[-20:]), 4),
        "target_train_minutes": round(target_minutes, 1),
        "draft_train_minutes": round(draft_minutes, 1),
        "total_minutes": round((time.time() - started) / 60, 1),
        "threads": torch.get_num_threads(),
        "recipe": {k: v for k, v in asdict(cfg).items() if k not in ("target", "draft")},
    }
    out_dir.mkdir(parents=True, exist_ok=True)
    save_hf(target, tok, out_dir / "target")
    save_hf(draft, tok, out_dir / "draft")
    (out_dir / "training_figures.json").write_text(json.dumps(figures, indent=2) + "\n")
    write_model_card(out_dir, figures)
    log(f"done in {figures['total_minutes']} min: {json.dumps(figures)}")
    return figures
