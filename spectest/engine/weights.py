"""What every checkpoint format ends in: named tensors → a checked :class:`Transformer`.

Owns: :class:`CheckpointError` (every problem with a checkpoint's files; the message names the
path and what is missing or wrong), :class:`LoadedModel` (a model, its tokenizer and name) and
:func:`build_model` — a model of a given config holding a dict of tensors named as Hugging Face
names them, checked by name and shape against the model's parameters and cast to a dtype.
Both readers use it: ``loader`` (HF checkpoint directories) and ``gguf_loader`` (GGUF files),
so neither imports the other for it.

Does not know: file formats, the forward pass, sampling or serving.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from spectest.engine.model import ModelConfig, Transformer
from spectest.engine.tokenizer import Tokenizer

# Non-parameter tensors some exporters write; they carry nothing the model needs.
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


class CheckpointError(ValueError):
    """A checkpoint that cannot be loaded; the message says which file and why."""


@dataclass(frozen=True)
class LoadedModel:
    model: Transformer  # eval mode, no grad
    tokenizer: Tokenizer
    name: str
    head_token_ids: tuple[int, ...] | None = None  # the draft head's vocabulary, where given


def build_model(cfg: ModelConfig, tensors: dict[str, torch.Tensor], dtype: torch.dtype,
                source: Path) -> Transformer:
    """A :class:`Transformer` holding ``tensors`` (names as HF's, with or without ``model.``).

    Raises :class:`CheckpointError` listing missing, unexpected and wrongly shaped tensors.
    """
    state = {}
    for name, tensor in tensors.items():
        if name.endswith(_IGNORED_SUFFIXES):
            continue
        state[name.removeprefix("model.")] = tensor
    if cfg.tie_word_embeddings:
        state.pop("lm_head.weight", None)  # the model shares embed_tokens.weight
    try:
        model = Transformer(cfg)
    except ValueError as exc:  # e.g. an unsupported rope_scaling type
        raise CheckpointError(f"{source}: {exc}") from None
    expected = {name: p.shape for name, p in model.state_dict().items()}
    if cfg.tie_word_embeddings:
        expected.pop("lm_head.weight")
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    wrong = [f"{n} {tuple(state[n].shape)} (expected {tuple(expected[n])})"
             for n in sorted(set(state) & set(expected)) if state[n].shape != expected[n]]
    problems = []
    if missing:
        problems.append("missing tensors: " + short_list(missing))
    if unexpected:
        problems.append("unexpected tensors: " + short_list(unexpected))
    if wrong:
        problems.append("shape mismatch: " + short_list(wrong))
    if problems:
        raise CheckpointError(f"{source}: " + "; ".join(problems))
    with torch.no_grad():
        for name, param in model.state_dict().items():
            if name in state:
                param.copy_(state[name])
        for param in model.parameters():  # parameters only: RoPE buffers stay fp32
            param.data = param.data.to(dtype)
    return model.eval().requires_grad_(False)


def short_list(items: list[str], limit: int = 8) -> str:
    """The first ``limit`` items, and how many more there are."""
    shown = ", ".join(items[:limit])
    return shown + (f", … ({len(items) - limit} more)" if len(items) > limit else "")
