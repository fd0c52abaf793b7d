"""Drafters: who proposes the K tokens the target verifies.

Owns: the :class:`Drafter` interface and three implementations — :class:`DraftModelDrafter`
(a small model with its own KV cache, sampling K tokens autoregressively with the request's
sampling parameters and returning their probabilities), :class:`NGramDrafter` (prompt lookup:
match the last n tokens against the sequence so far, propose what followed; deterministic,
one-hot probabilities), :class:`HybridDrafter` (prompt lookup first, a model drafter for the
rows where no suffix matches) and :class:`NoDrafter` (the target-only baseline, K = 0).

Does not know: the target, acceptance or scheduling. The engine tells a drafter how many of
the tokens it fed are still valid after verification (:meth:`Drafter.rewind`). A drafter with
``wants_features = True`` (``engine.eagle``) also gets the target's hidden states of every
committed position (``add_features``); :class:`DraftModelDrafter`'s two hooks
(``_first_logits``, ``_next_logits``) are what such a drafter replaces. A drafter that
lives in another process (``spectest.remote``) implements the same protocol; a drafter that
cannot draft this round returns an empty :class:`Proposal` with ``error`` set, and the round
runs without drafts.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable, Protocol

import torch
import torch.nn.functional as F

from spectest.engine.drafter_names import HYBRID
from spectest.engine.model import Transformer
from spectest.engine.penalties import Penalties, apply_penalties
from spectest.engine.sampling import SamplingParams, probs_from_logits, sample_from


@dataclass
class DraftRow:
    """One sequence asking for drafts this round, with the request's sampling parameters: a
    draft samples (and adjusts its logits, ``engine.penalties``) exactly as the target will."""

    slot: int
    tokens: list[int]  # prompt + output so far (the last one is not yet in any KV cache)
    k: int  # at most this many drafts
    params: SamplingParams
    uniforms: torch.Tensor | None = None  # [k] for sampled rows
    prompt_len: int = 0  # tokens[:prompt_len] is the prompt (penalties count the rest)

    @property
    def greedy(self) -> bool:
        return self.params.greedy

    @property
    def temperature(self) -> float:
        return 1.0 if self.params.greedy else self.params.temperature


@dataclass(frozen=True)
class Proposal:
    tokens: torch.Tensor  # [B, K] long, padded with 0 past lens
    lens: torch.Tensor  # [B] long
    probs: torch.Tensor | None  # [B, K, V] draft distributions; None = one-hot on tokens
    # A drafter in another process: the part of the drafting time spent outside the draft
    # model (transport, encoding, the other side's queue), and why it returned no drafts.
    network_seconds: float = 0.0
    error: str | None = None

    @staticmethod
    def empty(batch: int, error: str | None = None, network_seconds: float = 0.0) -> "Proposal":
        return Proposal(torch.zeros(batch, 0, dtype=torch.long),
                        torch.zeros(batch, dtype=torch.long), None, network_seconds, error)


# Confidence early exit: given the draft's max probability per row at this step [B], return
# True to stop drafting (the token at this step is then not proposed).
StopRule = Callable[[torch.Tensor], bool]


class Drafter(Protocol):
    name: str

    def admit(self, slot: int, prompt: list[int]) -> None: ...

    def release(self, slot: int) -> None: ...

    def propose(self, rows: list[DraftRow], stop: StopRule | None = None) -> Proposal: ...

    def rewind(self, slot: int, n_valid: int) -> None: ...


class NoDrafter:
    name = "none"

    def admit(self, slot, prompt):
        pass

    def release(self, slot):
        pass

    def propose(self, rows, stop=None):
        return Proposal.empty(len(rows))

    def rewind(self, slot, n_valid):
        pass


# shortest suffix n-gram that may propose drafts. 3, measured (greedy, batch 1, K = 4, 6 records
# a workload, benchmarks/engine_speedup.py's prompts): against 1, acceptance rises from
# 0.11 / 0.25 / 0.10 to 0.53 / 0.63 / 0.27 (chat / code / RAG) and the speedup from 1.00 / 1.27 /
# 0.93× to 1.11 / 1.35 / 1.09× on int8 SmolLM2; on the embedded pair, acceptance 0.32 / 0.28 /
# 0.20 → 0.64 / 0.69 / 0.58 at 1.34 / 1.32 / 1.18× → 1.31 / 1.31 / 1.23× (within run noise).
# A one-token match proposes on almost every round and is mostly wrong.
NGRAM_MIN = 3
# longest suffix tried first; 8 or 16 picked no better matches on RAG and cost more lookup
# time (benchmarks/engine_speedup.py --pair embedded --batches 1, greedy: RAG acceptance
# 0.58 / 0.58 / 0.61 and speedup 1.19 / 1.11 / 1.03× at 4 / 8 / 16)
NGRAM_MAX = 4


class NGramDrafter:
    """Prompt lookup decoding: the most recent earlier occurrence of the longest suffix match."""

    name = "ngram"

    def __init__(self, max_n: int = NGRAM_MAX, min_n: int = NGRAM_MIN):
        if not 1 <= min_n <= max_n:
            raise ValueError("need 1 <= min_n <= max_n")
        self.max_n, self.min_n = max_n, min_n

    def admit(self, slot, prompt):
        pass

    def release(self, slot):
        pass

    def rewind(self, slot, n_valid):
        pass

    def lookup(self, tokens: list[int], k: int) -> list[int]:
        seq = torch.tensor(tokens, dtype=torch.long)
        L = len(tokens)
        for n in range(min(self.max_n, L - 1), self.min_n - 1, -1):
            windows = seq[:L - 1].unfold(0, n, 1)  # [L-n, n] windows that have a successor
            hits = (windows == seq[L - n:]).all(dim=1).nonzero().flatten()
            if len(hits):
                start = int(hits[-1]) + n
                return tokens[start:start + k]
        return []

    def propose(self, rows, stop=None):
        found = [self.lookup(r.tokens, r.k) if r.k > 0 else [] for r in rows]
        K = max((len(f) for f in found), default=0)
        tokens = torch.zeros(len(rows), K, dtype=torch.long)
        for i, f in enumerate(found):
            tokens[i, :len(f)] = torch.tensor(f, dtype=torch.long)
        return Proposal(tokens, torch.tensor([len(f) for f in found], dtype=torch.long), None)


class DraftModelDrafter:
    """A small model sharing the target's tokenizer, with its own per-slot KV cache.

    A model whose head was cut to its most frequent tokens (``model.restrict_head``) drafts
    over those only: its logits are [B, T, N], ``model.head_ids`` maps them back to token ids,
    and a sampled row's distribution is 0 outside them (rejection sampling stays exact)."""

    name = "draft-model"

    def __init__(self, model: Transformer, n_slots: int, max_len: int):
        self.model = model
        self.cache = model.new_cache(n_slots, max_len)
        self.vocab_size = model.config.vocab_size
        self.head_ids = model.head_ids  # [N] or None (the whole vocabulary)

    def admit(self, slot: int, prompt: list[int]) -> None:
        self.cache.reset(slot)
        if prompt:  # the whole prompt in one call, as the target prefills it: a model
            # drafting for itself then holds the target's keys bit for bit (row-exact int8)
            with torch.inference_mode():
                self.model(torch.tensor([prompt]), self.cache, torch.tensor([slot]),
                           last_only=True, hidden_only=True)

    def release(self, slot: int) -> None:
        self.cache.reset(slot)

    def rewind(self, slot: int, n_valid: int) -> None:
        self.cache.lengths[slot] = min(int(self.cache.lengths[slot]), n_valid)

    def _token_ids(self, columns: torch.Tensor) -> torch.Tensor:
        return columns if self.head_ids is None else self.head_ids[columns]

    def _full_vocab(self, probs: torch.Tensor) -> torch.Tensor:
        """[b, N] over the head's tokens → [b, V] (0 for the tokens outside it)."""
        if self.head_ids is None:
            return probs
        return probs.new_zeros(probs.shape[0], self.vocab_size).index_copy_(1, self.head_ids,
                                                                              probs)

    @torch.inference_mode()
    def propose(self, rows: list[DraftRow], stop: StopRule | None = None) -> Proposal:
        B = len(rows)
        K = max((r.k for r in rows), default=0)
        if K == 0:
            return Proposal.empty(B)
        slots = torch.tensor([r.slot for r in rows])
        temperature = torch.tensor([r.temperature for r in rows])
        top_k = torch.tensor([r.params.top_k for r in rows])
        top_p = torch.tensor([r.params.top_p for r in rows])
        min_p = torch.tensor([r.params.min_p for r in rows])
        greedy = torch.tensor([r.greedy for r in rows])
        pen = Penalties.of([r.params for r in rows], [r.tokens for r in rows],
                           [r.prompt_len for r in rows], self.vocab_size)
        any_sampled = not bool(greedy.all())
        need_probs = any_sampled or stop is not None
        tokens = torch.zeros(B, K, dtype=torch.long)
        probs = torch.zeros(B, K, self.vocab_size) if any_sampled else None
        lens = torch.zeros(B, dtype=torch.long)
        logits = self._first_logits(rows, slots)  # [B, N]
        active = torch.arange(B)  # rows still drafting
        for step in range(K):
            if pen is not None:  # this step sees the committed tokens and the drafts so far
                mine = pen.select(active)
                counts = mine.output_counts + F.one_hot(
                    tokens[active, :step], self.vocab_size).float().sum(1)  # [b, V]
                logits = apply_penalties(logits[:, None], mine, counts[:, None],
                                         self.head_ids)[:, 0]  # [b, N]
            step_probs = None
            if need_probs:
                step_probs = probs_from_logits(logits[:, None], temperature[active],
                                               top_k[active], top_p[active],
                                               min_p[active])[:, 0]  # [b, N]
                if stop is not None and stop(step_probs.max(dim=-1).values):
                    break
            pick = logits.argmax(dim=-1)  # [b] columns of the head
            sampled = ~greedy[active]
            if bool(sampled.any()):
                u = torch.stack([rows[int(i)].uniforms[step] for i in active[sampled]])
                pick[sampled] = sample_from(step_probs[sampled], u)
            pick = self._token_ids(pick)  # [b] token ids
            tokens[active, step] = pick
            if probs is not None:
                probs[active, step] = self._full_vocab(step_probs)
            lens[active] += 1
            still = torch.tensor([rows[int(i)].k > step + 1 for i in active], dtype=torch.bool)
            if step == K - 1 or not bool(still.any()):
                break
            active, pick = active[still], pick[still]
            logits = self._next_logits(pick, slots, active)  # [b, N]
        return Proposal(tokens, lens, probs)

    def _first_logits(self, rows: list[DraftRow], slots: torch.Tensor) -> torch.Tensor:
        """Logits [B, N] for each row's first draft."""
        # A row that has not drafted for a while (speculation switched off, K = 0 rounds, no
        # draft prefill) is further behind: it catches up alone on all but its last token, so
        # that one long row neither widens nor overflows everyone's step-0 forward.
        for r in rows:
            seen = int(self.cache.lengths[r.slot])
            if seen >= len(r.tokens):  # admitted with every token: recompute the last one
                self.cache.lengths[r.slot] = seen = len(r.tokens) - 1
            if len(r.tokens) - seen > 2:
                self.model(torch.tensor([r.tokens[seen:-1]]), self.cache,
                           torch.tensor([r.slot]), last_only=True, hidden_only=True)
        # Step 0 feeds every committed token this cache has not seen (usually 1, or 2 after a
        # fully accepted round), right-padded; logits are read at each row's last real token.
        pending = [r.tokens[int(self.cache.lengths[r.slot]):] for r in rows]
        width = max(len(p) for p in pending)
        feed = torch.zeros(len(rows), width, dtype=torch.long)
        for i, p in enumerate(pending):
            feed[i, :len(p)] = torch.tensor(p)
        start = self.cache.lengths[slots].clone()
        n_pending = torch.tensor([len(p) for p in pending])
        logits = self.model(feed, self.cache, slots)  # [B, width, N]
        self.cache.lengths[slots] = start + n_pending
        return logits[torch.arange(len(rows)), n_pending - 1]  # [B, N]

    def _next_logits(self, pick: torch.Tensor, slots: torch.Tensor,
                     active: torch.Tensor) -> torch.Tensor:
        """Logits [b, N] for the next draft of the ``active`` rows, which drafted ``pick`` [b]."""
        return self.model(pick[:, None], self.cache, slots[active])[:, -1]


class HybridDrafter:
    """Prompt lookup where the sequence repeats itself, a model everywhere else.

    Each round, a row whose last ``min_n``+ tokens occurred earlier gets the n-gram's
    continuation (one-hot probabilities, as :class:`NGramDrafter`); the other rows go to the
    model drafter in one batch. Production systems pair them the same way (Arctic Inference's
    suffix decoding falls back to a model drafter): copied spans (code edits, quoted context)
    are accepted far more often than a small model's guesses, and a lookup costs microseconds.
    The model drafter skips the rounds it does not draft and catches up on the next one, as it
    does after speculation was switched off (its ``rewind`` / ``add_features`` keep its cache
    consistent whoever drafted). ``model_k`` caps the model's drafts below the round's K (a
    weak model pays at shorter rounds than a copied span does); None: no cap."""

    def __init__(self, lookup: NGramDrafter, model: Drafter, model_k: int | None = None):
        self.lookup, self.model, self.model_k = lookup, model, model_k
        self.name = HYBRID + model.name
        self.wants_features = bool(getattr(model, "wants_features", False))

    def admit(self, slot, prompt):
        self.model.admit(slot, prompt)

    def release(self, slot):
        self.model.release(slot)

    def rewind(self, slot, n_valid):
        self.model.rewind(slot, n_valid)

    def add_features(self, slot, features):
        self.model.add_features(slot, features)

    def propose(self, rows, stop=None):
        copied = self.lookup.propose(rows)  # [B, Kc]; lens 0 where no suffix recurs
        rest = (copied.lens == 0).nonzero().flatten()  # [b] rows the model drafts
        if not len(rest):
            return copied
        cap = self.model_k or max(r.k for r in rows)
        part = self.model.propose([replace(rows[i], k=min(rows[i].k, cap))
                                   for i in rest.tolist()], stop)
        K = max(copied.tokens.shape[1], part.tokens.shape[1])
        tokens = torch.zeros(len(rows), K, dtype=torch.long)
        tokens[:, :copied.tokens.shape[1]] = copied.tokens
        tokens[rest, :part.tokens.shape[1]] = part.tokens
        lens = copied.lens.clone()
        lens[rest] = part.lens
        probs = None
        if part.probs is not None:  # sampled rows drafted by the model: one tensor for all
            probs = torch.nn.functional.one_hot(tokens, part.probs.shape[-1]).float()
            probs[rest] = 0.0
            probs[rest, :part.probs.shape[1]] = part.probs
        return Proposal(tokens, lens, probs, part.network_seconds, part.error)
