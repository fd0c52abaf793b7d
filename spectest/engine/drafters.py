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

from array import array
from dataclasses import dataclass, replace
from typing import Callable, Protocol

import numpy as np
import torch

from spectest.engine.device import Placement, to_device
from spectest.engine.draft_decode import row_decoder
from spectest.engine.drafter_names import HYBRID
from spectest.engine.model import Transformer
from spectest.engine.penalties import Penalties, apply_penalties
from spectest.engine.prefix_cache import prefill_spans
from spectest.engine.sampling import SamplingParams, one_hot, probs_from_logits, sample_from


@dataclass
class DraftRow:
    """One sequence asking for drafts this round, with the request's sampling parameters: a
    draft samples (and adjusts its logits, ``engine.penalties``) exactly as the target will."""

    slot: int
    tokens: list[int]  # prompt + output so far (the last one is not yet in any KV cache)
    k: int  # at most this many drafts
    params: SamplingParams
    uniforms: torch.Tensor | None = None  # [k] for sampled rows (on the engine's device)
    prompt_len: int = 0  # tokens[:prompt_len] is the prompt (penalties count the rest)

    @property
    def greedy(self) -> bool:
        return self.params.greedy

    @property
    def temperature(self) -> float:
        return 1.0 if self.params.greedy else self.params.temperature


@dataclass(frozen=True)
class Proposal:
    tokens: torch.Tensor | np.ndarray  # [B, K] long, padded with 0 past lens (device or host)
    lens: np.ndarray  # [B] int64, on the host: how many drafts each row proposes
    probs: torch.Tensor | None  # [B, K, V] draft distributions; None = one-hot on tokens
    # A drafter in another process: the part of the drafting time spent outside the draft
    # model (transport, encoding, the other side's queue), and why it returned no drafts.
    network_seconds: float = 0.0
    error: str | None = None

    @staticmethod
    def empty(batch: int, error: str | None = None, network_seconds: float = 0.0) -> "Proposal":
        return Proposal(np.zeros((batch, 0), dtype=np.int64), np.zeros(batch, dtype=np.int64),
                        None, network_seconds, error)


# Confidence early exit: given the draft's max probability per row at this step [B], return
# True to stop drafting (the token at this step is then not proposed). It reads the device:
# one host wait per draft step, the price of deciding on the draft's confidence.
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
    """Prompt lookup decoding: the most recent earlier occurrence of the longest suffix match.

    A host-side search (the tokens are the host's): the sequence as packed 32-bit ids, searched
    from the end with ``bytes.rfind`` — no tensor, no device."""

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
        L = len(tokens)
        if L < 2:
            return []
        haystack = array("i", tokens[:L - 1]).tobytes()  # windows that have a successor
        for n in range(min(self.max_n, L - 1), self.min_n - 1, -1):
            needle = array("i", tokens[L - n:]).tobytes()
            end = len(haystack)
            while (at := haystack.rfind(needle, 0, end)) >= 0:
                if at % 4 == 0:  # on a token boundary (a match may straddle two ids)
                    start = at // 4 + n
                    return tokens[start:start + k]
                end = at + len(needle) - 1
        return []

    def propose(self, rows, stop=None):
        found = [self.lookup(r.tokens, r.k) if r.k > 0 else [] for r in rows]
        K = max((len(f) for f in found), default=0)
        tokens = np.zeros((len(rows), K), dtype=np.int64)
        for i, f in enumerate(found):
            tokens[i, :len(f)] = f
        return Proposal(tokens, np.array([len(f) for f in found], dtype=np.int64), None)


# batch sizes up to which a draft model's one-token steps run on engine.draft_decode's
# RowDecoder (one attention call a row) rather than the model's batched forward. Measured
# (benchmarks/draft_step.py, embedded draft, one thread): 0.68 / 0.54 / 0.71 / 0.84 of the
# forward's time at 1 / 2 / 4 / 8 rows, 0.94 at 12, 1.05 at 16
ROW_DECODER_MAX_ROWS = 8


class DraftModelDrafter:
    """A small model sharing the target's tokenizer, with its own per-slot KV cache.

    A model whose head was cut to its most frequent tokens (``model.restrict_head``) drafts
    over those only: its logits are [B, T, N], ``model.head_ids`` maps them back to token ids,
    and a sampled row's distribution is 0 outside them (rejection sampling stays exact).

    Drafting reads nothing back from the device: the rows' lengths and how many drafts each
    makes are the host's, the picked tokens stay on the device until the engine fetches the
    round's result (a confidence stop rule is the exception: it reads the draft's confidence
    at every step)."""

    name = "draft-model"

    def __init__(self, model: Transformer, n_slots: int, max_len: int):
        self.model = model
        self.place = Placement.of(model)
        self.cache = model.new_cache(n_slots, max_len)
        self.vocab_size = model.config.vocab_size
        self.head_ids = model.head_ids  # [N] or None (the whole vocabulary)
        # one-token steps of up to ROW_DECODER_MAX_ROWS rows on folded weights (CPU float32
        # models; engine.draft_decode)
        self.row = row_decoder(model)

    def admit(self, slot: int, prompt: list[int]) -> None:
        self.cache.reset(slot)
        # the prompt in the forwards the target prefills it in: a model drafting for itself
        # then holds the target's keys bit for bit (row-exact int8)
        with torch.inference_mode():
            for lo, hi in prefill_spans(0, len(prompt)):
                self.model(self.place.tokens([prompt[lo:hi]]), self.cache, [slot],
                           last_only=True, hidden_only=True)

    def release(self, slot: int) -> None:
        self.cache.reset(slot)

    def rewind(self, slot: int, n_valid: int) -> None:
        self.cache.lengths[slot] = min(int(self.cache.lengths[slot]), n_valid)

    def _row_steps(self, rows: int) -> bool:
        """Whether one-token steps of ``rows`` rows run on the folded row decoder."""
        return self.row is not None and rows <= ROW_DECODER_MAX_ROWS

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
        place = self.place
        slots = np.array([r.slot for r in rows], dtype=np.int64)
        ks = np.array([r.k for r in rows], dtype=np.int64)
        greedy = np.array([r.greedy for r in rows], dtype=np.bool_)
        temperature = np.array([r.temperature for r in rows], dtype=np.float32)
        top_k = np.array([r.params.top_k for r in rows], dtype=np.int64)
        top_p = np.array([r.params.top_p for r in rows], dtype=np.float32)
        min_p = np.array([r.params.min_p for r in rows], dtype=np.float32)
        pen = Penalties.of([r.params for r in rows], [r.tokens for r in rows],
                           [r.prompt_len for r in rows], self.vocab_size, place.device)
        any_sampled = not greedy.all()
        need_probs = any_sampled or stop is not None
        uniforms = _uniforms(rows, K, place.device) if any_sampled else None  # [B, K]
        columns: list[torch.Tensor] = []  # per step: [B] token ids (0 where a row stopped)
        step_dists: list[torch.Tensor] = []  # per step: [B, V] draft distributions
        logits = self._first_logits(rows, slots)  # [B, N]
        active = np.arange(B)  # rows still drafting (host)
        active_dev = None  # the same on the device, None while every row drafts
        active_slots = slots
        last_steps = set(ks.tolist())  # steps after which some row stops
        for step in range(K):
            if pen is not None:  # this step sees the committed tokens and the drafts so far
                mine = pen if active_dev is None else pen.select(active_dev)
                counts = mine.output_counts
                if step:
                    drafted = torch.stack(columns, dim=1)  # [B, step]
                    if active_dev is not None:
                        drafted = drafted[active_dev]
                    counts = counts + one_hot(drafted, self.vocab_size).sum(1)
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
            if any_sampled:
                sampled = ~greedy[active]
                if sampled.any():
                    u = uniforms[:, step] if active_dev is None else uniforms[active_dev, step]
                    drawn = sample_from(step_probs, u)
                    pick = drawn if sampled.all() else torch.where(
                        place.to_device(sampled), drawn, pick)
            pick = self._token_ids(pick)  # [b] token ids
            columns.append(self._scatter(pick, active_dev, B))
            if any_sampled:
                step_dists.append(self._scatter(self._full_vocab(step_probs), active_dev, B))
            if step == K - 1:
                break
            if step + 1 in last_steps:  # some rows have drafted all they may
                still = ks[active] > step + 1
                if not still.any():
                    break
                active = active[still]
                pick = pick[place.to_device(np.flatnonzero(still))]
                active_dev = place.to_device(active)
                active_slots = slots[active]
            logits = self._next_logits(pick, active_slots, active_dev)  # [b, N]
        if not columns:
            return Proposal.empty(B)
        tokens = torch.stack(columns, dim=1)  # [B, k]
        probs = torch.stack(step_dists, dim=1) if any_sampled else None  # [B, k, V]
        # a row drafted one token a step until its own k (or the stop rule ended every row)
        return Proposal(tokens, np.minimum(ks, len(columns)), probs)

    @staticmethod
    def _scatter(values: torch.Tensor, active_dev: torch.Tensor | None, B: int) -> torch.Tensor:
        """A step's per-active-row values [b, ...] as [B, ...] (zeros where a row stopped)."""
        if active_dev is None:
            return values
        out = values.new_zeros((B,) + tuple(values.shape[1:]))
        return out.index_copy_(0, active_dev, values)

    def _first_logits(self, rows: list[DraftRow], slots: np.ndarray) -> torch.Tensor:
        """Logits [B, N] for each row's first draft."""
        # A row that has not drafted for a while (speculation switched off, K = 0 rounds, no
        # draft prefill) is further behind: it catches up alone on all but its last token, so
        # that one long row neither widens nor overflows everyone's step-0 forward.
        lengths = self.cache.lengths
        for r in rows:
            seen = int(lengths[r.slot])
            if seen >= len(r.tokens):  # admitted with every token: recompute the last one
                lengths[r.slot] = seen = len(r.tokens) - 1
            if len(r.tokens) - seen > 2:
                self.model(self.place.tokens([r.tokens[seen:-1]]), self.cache, [r.slot],
                           last_only=True, hidden_only=True)
        # Step 0 feeds every committed token this cache has not seen (usually 1, or 2 after a
        # fully accepted round), right-padded; logits are read at each row's last real token.
        pending = [r.tokens[int(lengths[r.slot]):] for r in rows]
        width = max(len(p) for p in pending)
        n_pending = np.array([len(p) for p in pending], dtype=np.int64)
        if width == 1:
            feed = self.place.tokens(pending)  # [B, 1]
        else:
            feed = np.zeros((len(rows), width), dtype=np.int64)
            for i, p in enumerate(pending):
                feed[i, :len(p)] = p
            feed = self.place.tokens(feed)
        if width == 1 and self._row_steps(len(rows)):
            return self.row.step(feed, self.cache, slots)  # [B, N]
        start = lengths[slots].copy()
        logits = self.model(feed, self.cache, slots)  # [B, width, N]
        lengths[slots] = start + n_pending
        if width == 1:
            return logits[:, 0]
        last = self.place.to_device(n_pending - 1)
        return logits[torch.arange(len(rows), device=logits.device), last]  # [B, N]

    def _next_logits(self, pick: torch.Tensor, slots: np.ndarray,
                     active_dev: torch.Tensor | None) -> torch.Tensor:
        """Logits [b, N] for the next draft of the rows still drafting (their ``slots`` [b];
        their indices on the device, or None for all rows), which drafted ``pick`` [b]."""
        if self._row_steps(len(slots)):
            return self.row.step(pick, self.cache, slots)
        return self.model(pick[:, None], self.cache, slots)[:, -1]


def _uniforms(rows: list[DraftRow], K: int, device: torch.device) -> torch.Tensor:
    """The rows' uniforms as one [B, K] tensor (zeros where a row has none: greedy rows)."""
    out = []
    for r in rows:
        u = r.uniforms[:K] if r.uniforms is not None else torch.zeros(0, device=device)
        out.append(u if len(u) == K else torch.cat([u, u.new_zeros(K - len(u))]))
    return torch.stack(out)


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
        copied = self.lookup.propose(rows)  # [B, Kc] host; lens 0 where no suffix recurs
        rest = np.flatnonzero(copied.lens == 0)  # [b] rows the model drafts (host)
        if not len(rest):
            return copied
        cap = self.model_k or max(r.k for r in rows)
        part = self.model.propose([replace(rows[i], k=min(rows[i].k, cap))
                                   for i in rest.tolist()], stop)
        lens = copied.lens.copy()
        lens[rest] = part.lens
        if len(rest) == len(rows):
            return Proposal(part.tokens, lens, part.probs, part.network_seconds, part.error)
        device = part.tokens.device if isinstance(part.tokens, torch.Tensor) else \
            torch.device("cpu")
        K = max(copied.tokens.shape[1], part.tokens.shape[1])
        padded = np.zeros((len(rows), K), dtype=np.int64)
        padded[:, :copied.tokens.shape[1]] = copied.tokens
        tokens = to_device(padded, device)
        rest_dev = to_device(rest, device)
        if part.tokens.shape[1]:
            tokens[rest_dev, :part.tokens.shape[1]] = to_device(part.tokens, device)
        probs = None
        if part.probs is not None:  # sampled rows drafted by the model: one tensor for all
            probs = one_hot(tokens, part.probs.shape[-1])
            probs[rest_dev] = 0.0
            probs[rest_dev, :part.probs.shape[1]] = part.probs
        return Proposal(tokens, lens, probs, part.network_seconds, part.error)
