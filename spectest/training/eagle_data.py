"""What an EAGLE head learns from: SmolLM2's token sequences and its features at every position.

Owns: :func:`target_features` — SmolLM2's (int8, as the engine serves it) final-norm hidden
state at every position of the teacher's sequences (prompt + SmolLM2's own greedy answer),
computed in length-sorted batches and kept in float16 — and :class:`FeatureData`, which saves
and loads them beside the token ids.

Does not know: the head or its training (``training.eagle``); where the sequences came from
(``training.teacher``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import torch

from spectest.training import teacher

BATCH_TOKENS = 6144  # padded tokens per forward


@dataclass
class FeatureData:
    """Per sequence: the token ids [L], the answer length, and SmolLM2's features [L, D]."""
    sources: list[str]
    tokens: list[torch.Tensor]  # [L] long
    answer_lens: list[int]
    features: list[torch.Tensor]  # [L, D] float16

    def save(self, path: Path) -> None:
        tmp = path.with_suffix(path.suffix + ".tmp")
        torch.save({"sources": self.sources, "tokens": self.tokens,
                    "answer_lens": self.answer_lens, "features": self.features}, tmp)
        tmp.replace(path)

    @classmethod
    def load(cls, path: Path) -> "FeatureData":
        raw = torch.load(path, weights_only=True)
        return cls(raw["sources"], raw["tokens"], raw["answer_lens"], raw["features"])

    @property
    def positions(self) -> int:
        return sum(len(t) for t in self.tokens)


@torch.inference_mode()
def target_features(model, data: teacher.TeacherData, max_len: int = 1024,
                    progress=print) -> FeatureData:
    """SmolLM2's final-norm hidden states over every sequence of ``data`` (the last
    ``max_len`` tokens of longer ones), in batches of similar length."""
    seqs = [t.long()[-max_len:] for t in data.tokens]
    order = sorted(range(len(seqs)), key=lambda i: len(seqs[i]))
    features: list[torch.Tensor | None] = [None] * len(seqs)
    started, done, i = time.perf_counter(), 0, 0
    while i < len(order):
        width = len(seqs[order[i]])
        j = i
        while j < len(order) and len(seqs[order[j]]) * (j - i + 1) <= BATCH_TOKENS:
            width = len(seqs[order[j]])
            j += 1
        j = max(j, i + 1)
        batch = torch.zeros(j - i, width, dtype=torch.long)
        for b, idx in enumerate(order[i:j]):
            batch[b, :len(seqs[idx])] = seqs[idx]
        hidden = model(batch, hidden_only=True)  # [b, width, D]; causal, right-padded
        for b, idx in enumerate(order[i:j]):
            features[idx] = hidden[b, :len(seqs[idx])].half().clone()
        done += sum(len(seqs[idx]) for idx in order[i:j])
        i = j
        elapsed = time.perf_counter() - started
        progress(f"eagle features: {done:,} positions, {done / elapsed:,.0f}/s, "
                 f"{elapsed:.0f} s")
    return FeatureData([p.source for p in data.prompts], seqs,
                       [min(len(a), len(s)) for a, s in zip(data.top_ids, seqs)], features)
