"""EAGLE drafting: a one-layer head that drafts from the target's own hidden states.

Owns: :class:`EagleHead` — EAGLE-1's draft (Li et al., 2024): at position i it reads the
target's final-norm feature f_i beside the embedding of the next token x_{i+1}, mixes them
(``fc``: 2D → D), runs one decoder layer of the target's shape over its own KV cache, and
outputs a guess of f_{i+1}; the target's own (tied) LM head, cut to its most frequent tokens,
turns that guess into the next token's logits. Drafting more than one token feeds the head its
own guesses. :class:`EagleDrafter` runs it in the engine; :func:`load_eagle` /
:func:`eagle_state` read and write its checkpoint (``config.json`` with ``"eagle"``,
``model.safetensors``: ``fc.*`` and ``layers.0.*``, ``head_tokens.json``).

Cache invariant (as the target's): after a round, the head's cache holds one entry per pair
(f_i, x_{i+1}) whose feature came from the target — every committed position but the last —
and the features the target computed in the round's verify wait in ``pending`` until the next
``propose`` feeds them. Guessed features never stay in the cache past a round (``rewind``).

Does not know: the target model's file, sampling rules beyond the base drafter's, or the
engine, which hands it features (:meth:`EagleDrafter.add_features`) after every prefill and
verify. A draft's tokens outside the cut head get probability 0, so rejection sampling stays
exact; greedy output is the target's whatever the head proposes.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
import numpy as np
from safetensors.torch import load_file
from torch import nn

from spectest.engine.attention import attention_inputs, group_mask, host_slots
from spectest.engine.device import Placement
from spectest.engine.drafters import DraftModelDrafter, DraftRow, Proposal, StopRule
from spectest.engine.int8 import Int8Linear, linear_int8, quantize_layer_int8
from spectest.engine.kv_cache import KVCache
from spectest.engine.loader import HEAD_TOKENS_FILE, CheckpointError
from spectest.engine.model import (DecoderLayer, ModelConfig, Rotary, Transformer, freeze_layer,
                                   rope_inv_freq)

EAGLE_KEY = "eagle"  # config.json marker: {"eagle": {"feature": "final-norm", "target": …}}


class EagleHead(Rotary, nn.Module):
    """fc + one decoder layer; ``config`` is the target's shape with one layer."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.config = cfg
        self.fc = nn.Linear(2 * cfg.hidden_size, cfg.hidden_size, bias=True)
        self.layers = nn.ModuleList([DecoderLayer(cfg)])
        self.register_buffer("inv_freq", rope_inv_freq(cfg), persistent=False)
        self._rope_len = 0

    def new_cache(self, n_slots: int, max_len: int) -> KVCache:
        cfg = self.config
        weight = self.fc.weight if isinstance(self.fc, nn.Linear) else None
        return KVCache(1, n_slots, max_len, cfg.num_key_value_heads, cfg.head_dim,
                       dtype=weight.dtype if weight is not None else torch.float32,
                       device=self.inv_freq.device)

    def forward(self, features: torch.Tensor, embeds: torch.Tensor, cache: KVCache,
                slots) -> torch.Tensor:
        """Guessed next features [B, T, D] for pairs (features [B, T, D], embeddings of the
        tokens that follow [B, T, D]) appended after each row's cached pairs (``slots`` [B]:
        host)."""
        B, T, _ = features.shape
        slots = host_slots(slots, B)
        inputs, start = attention_inputs(1, cache, slots, B, T, False, features.device)
        x = self.fc(torch.cat([features, embeds], dim=-1))  # [B, T, D]
        rope = self.rope(inputs.positions, inputs.need, x.dtype, inputs.first)
        cfg = self.config
        mask = group_mask(inputs.mask, cfg.num_attention_heads // cfg.num_key_value_heads,
                          x.dtype)
        x = self.layers[0](x, rope, inputs.writers[0], mask)
        cache.lengths[slots] = start + T
        return x


def eagle_config(target: ModelConfig) -> ModelConfig:
    return ModelConfig(**{**target.__dict__, "num_hidden_layers": 1})


def is_eagle_checkpoint(path: str | Path) -> bool:
    cfg = Path(path) / "config.json"
    return cfg.is_file() and EAGLE_KEY in json.loads(cfg.read_text())


def load_eagle(path: str | Path, target: Transformer) -> tuple[EagleHead, tuple[int, ...]]:
    """The head in ``path`` (made for ``target``'s shape) and its head token ids."""
    path = Path(path)
    if not is_eagle_checkpoint(path):
        raise CheckpointError(f"{path}: not an EAGLE head (config.json has no {EAGLE_KEY!r})")
    cfg = eagle_config(target.config)
    hf = json.loads((path / "config.json").read_text())
    if (hf["hidden_size"], hf["vocab_size"]) != (cfg.hidden_size, cfg.vocab_size):
        raise CheckpointError(f"{path}: an EAGLE head for hidden size {hf['hidden_size']} / "
                              f"vocabulary {hf['vocab_size']}; the target has "
                              f"{cfg.hidden_size} / {cfg.vocab_size}")
    head = EagleHead(cfg)
    state = {k: v.float() for k, v in load_file(str(path / "model.safetensors")).items()}
    head.load_state_dict(state)
    ids = json.loads((path / HEAD_TOKENS_FILE).read_text())["token_ids"]
    return head.eval().requires_grad_(False), tuple(ids)


def eagle_state(head: EagleHead) -> dict[str, torch.Tensor]:
    return {k: v.detach().half().contiguous() for k, v in head.state_dict().items()}


class EagleDrafter(DraftModelDrafter):
    """Drafts with an :class:`EagleHead` over the target's embedding and cut LM head."""

    name = "eagle"
    wants_features = True  # the engine passes the target's hidden states (add_features)

    def __init__(self, head: EagleHead, target: Transformer, head_ids: tuple[int, ...],
                 n_slots: int, max_len: int, int8: bool = False):
        self.model = head
        self.place = Placement.of(target.embed_tokens)
        self.embed = target.embed_tokens  # [V, D], float (int8 models keep it)
        self.head_ids = self.place.tokens(sorted(set(head_ids)))  # [N]
        lm = nn.Linear(head.config.hidden_size, len(self.head_ids), bias=False,
                       device=self.place.device, dtype=self.place.dtype)
        with torch.no_grad():  # SmolLM2's head is tied to its (float) embedding
            if target.config.tie_word_embeddings:
                weight = target.embed_tokens.weight
            elif isinstance(target.lm_head, Int8Linear):
                weight = target.lm_head.dequantized()
            else:
                weight = target.lm_head.weight
            lm.weight.copy_(weight[self.head_ids])
        self.lm_head: nn.Module = lm
        if int8:
            quantize_layer_int8(head.layers[0])
            head.fc = linear_int8(head.fc)
            self.lm_head = linear_int8(lm)
        freeze_layer(head.layers[0])  # fused projections, plain calls (model.LayerPlan)
        self.vocab_size = target.config.vocab_size
        self.cache = head.new_cache(n_slots, max_len)
        self.pending: dict[int, list[torch.Tensor]] = {}  # slot → features [n, D] not fed yet
        self.trusted = np.zeros(n_slots, dtype=np.int64)  # cached pairs from the target (host)
        self._guess: torch.Tensor | None = None  # [B, D] last guessed features, per row

    def admit(self, slot: int, prompt: list[int]) -> None:
        self.release(slot)  # the prompt's features come with add_features

    def release(self, slot: int) -> None:
        self.cache.reset(slot)
        self.trusted[slot] = 0
        self.pending[slot] = []

    def add_features(self, slot: int, features: torch.Tensor) -> None:
        """The target's features [n, D] for the next ``n`` committed positions."""
        self.pending.setdefault(slot, []).append(features.to(self.place.dtype))

    def rewind(self, slot: int, n_valid: int) -> None:
        self.cache.lengths[slot] = min(n_valid, int(self.trusted[slot]))

    @torch.inference_mode()
    def propose(self, rows: list[DraftRow], stop: StopRule | None = None) -> Proposal:
        ready = [i for i, r in enumerate(rows) if self._fed_through(r) == len(r.tokens) - 1]
        if len(ready) == len(rows):
            return super().propose(rows, stop)
        # a row whose features do not reach its last token (never happens in the engine's
        # order; kept safe) drafts nothing this round
        B = len(rows)
        part = super().propose([rows[i] for i in ready], stop) if ready else Proposal.empty(0)
        K = part.tokens.shape[1]
        tokens = torch.zeros(B, K, dtype=torch.long, device=self.place.device)
        lens = np.zeros(B, dtype=np.int64)
        probs = None if part.probs is None else part.probs.new_zeros(B, K, self.vocab_size)
        if ready and K:
            idx = self.place.to_device(np.array(ready))
            tokens[idx] = self.place.to_device(part.tokens)
            lens[ready] = part.lens
            if probs is not None:
                probs[idx] = part.probs
        return Proposal(tokens, lens, probs)

    def _fed_through(self, row: DraftRow) -> int:
        return int(self.trusted[row.slot]) + sum(len(f) for f in self.pending.get(row.slot, []))

    def _pairs(self, slot: int, tokens: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """The pending features [n, D] and the embeddings of the tokens after them [n, D]."""
        features = torch.cat(self.pending[slot]) if self.pending[slot] else \
            torch.zeros(0, self.model.config.hidden_size, device=self.place.device,
                        dtype=self.place.dtype)
        self.pending[slot] = []
        start = int(self.trusted[slot])
        nxt = self.place.tokens(tokens[start + 1:start + 1 + len(features)])
        return features, self.embed(nxt)

    def _first_logits(self, rows: list[DraftRow], slots: np.ndarray) -> torch.Tensor:
        pairs = [self._pairs(r.slot, r.tokens) for r in rows]
        # a long backlog (a prompt) goes in alone, all but its last pair
        for r, (feats, embeds) in zip(rows, pairs):
            self.cache.lengths[r.slot] = self.trusted[r.slot]
            if len(feats) > 2:
                self.model(feats[None, :-1], embeds[None, :-1], self.cache, [r.slot])
        fresh = [1 if len(f) > 2 else len(f) for f, _ in pairs]  # pairs for the batch call
        width = max(fresh)
        n_new = np.array(fresh, dtype=np.int64)
        if all(n == width for n in fresh):  # no padding: one stack each
            feats = torch.stack([f[len(f) - width:] for f, _ in pairs])  # [B, width, D]
            embeds = torch.stack([e[len(e) - width:] for _, e in pairs])
        else:
            D = self.model.config.hidden_size
            feats = torch.zeros(len(rows), width, D, device=self.place.device,
                                dtype=self.place.dtype)
            embeds = torch.zeros_like(feats)
            for i, ((f, e), n) in enumerate(zip(pairs, fresh)):
                feats[i, :n], embeds[i, :n] = f[len(f) - n:], e[len(e) - n:]
        start = self.cache.lengths[slots].copy()
        guess = self.model(feats, embeds, self.cache, slots)  # [B, width, D]
        self.cache.lengths[slots] = start + n_new
        self.trusted[slots] = start + n_new
        if width == 1:
            self._guess = guess[:, 0]  # [B, D]
        else:
            self._guess = guess[torch.arange(len(rows), device=guess.device),
                                self.place.to_device(n_new - 1)]  # [B, D]
        return self.lm_head(self._guess)  # [B, N]

    def _next_logits(self, pick: torch.Tensor, slots: np.ndarray,
                     active_dev: torch.Tensor | None) -> torch.Tensor:
        guess_in = self._guess if active_dev is None else self._guess[active_dev]
        guess = self.model(guess_in[:, None], self.embed(pick)[:, None],
                           self.cache, slots)[:, 0]  # [b, D]
        if active_dev is None:
            self._guess = guess
        else:
            self._guess = self._guess.index_copy(0, active_dev, guess)
        return self.lm_head(guess)  # [b, N]

