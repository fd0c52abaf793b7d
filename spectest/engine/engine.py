"""The speculative engine: prefill, then draft → verify → accept → rewind rounds over a batch.

Owns: :class:`SpecEngine`, which holds the target model and its KV cache, a drafter, a K policy
and a scheduler, and runs one *round* at a time: every running sequence gets up to K drafts,
the target scores ``[last token, drafts…]`` for all rows in one forward, each row accepts its
own prefix (greedy matching or rejection sampling), both caches rewind to the accepted length,
and a :class:`RoundRecord` goes to every observer — before the round's outputs go to their
requests, so that counters read after a request's last token already include it. K = 0 rows (speculation off for a request,
or the baseline drafter) go through the same forward, so comparisons are fair. A
:class:`~spectest.engine.control.SpeculationControl` may switch speculation off for every row,
or change K and the K policy; the engine applies such a change at the start of a step (a round
boundary), and while it is off, admits requests without a draft prefill.

Cache invariant: at a round boundary the target cache of a slot holds every committed token but
the last; the last token is the first input of the next verify.

How the target samples, verifies and commits is a rules object chosen once at construction
(``engine.faults``): the exact rules, or — for the auditor's tests — rules with deliberate bugs
(``EngineConfig.faults``); the round itself has no fault branches.

With ``EngineConfig.prefix_cache_tokens`` a prefill first restores the longest cached prefix of
the prompt (``engine.prefix_cache``, keyed by the request's ``cache_salt``) and computes only
the rest. Sampling parameters that depend on the tokens so far (logit bias, penalties) adjust
the target's logits at every verified position for the history that position sees
(``engine.penalties``), as the draft adjusts its own.

Does not know: HTTP, Prometheus, OpenTelemetry (observers subscribe to round records and the
server reads per-request stats from the final output).
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Callable

import torch
import torch.nn.functional as F

from spectest.engine.control import SpeculationControl, control_for
from spectest.engine.drafters import Drafter, DraftRow, NoDrafter
from spectest.engine.faults import DEFAULT_FAULT_AFTER, FAULTS, RoundContext, rules_for
from spectest.engine.penalties import Penalties, apply_penalties, position_counts
from spectest.engine.policies import Decision, FixedK, KPolicy
from spectest.engine.prefix_cache import PrefixCache
from spectest.engine.requests import (GenerationRequest, RequestOutput, RequestStats,
                                      RoundRecord, RowRecord, TokenLogprob)
from spectest.engine.sampling import probs_from_logits, sample_from
from spectest.engine.scheduler import OutputCallback, Scheduler, SchedulerConfig, Sequence
from spectest.engine.tokenizer import StreamDecoder, Tokenizer
from spectest.engine.verify import verify_greedy

log = logging.getLogger("spectest.engine")
RoundObserver = Callable[[RoundRecord], None]
SWITCHED_OFF = Decision(0, "speculation switched off at runtime")


@dataclass(frozen=True)
class EngineConfig:
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    faults: frozenset[str] = frozenset()  # names of engine.faults.FAULTS: deliberate bugs
    lossy_threshold: float = 0.1
    fault_after: int = DEFAULT_FAULT_AFTER  # requests before decay-after-requests starts
    prefix_cache_tokens: int = 0  # prompt KV kept for reuse (0: no prefix caching)

    def __post_init__(self):
        unknown = set(self.faults) - set(FAULTS)
        if unknown:
            raise ValueError(f"unknown fault(s) {sorted(unknown)}; known: {sorted(FAULTS)}")


class SpecEngine:
    def __init__(self, target, tokenizer: Tokenizer, drafter: Drafter,
                 policy: KPolicy | None = None, config: EngineConfig = EngineConfig(),
                 model_name: str = "target", observers: tuple[RoundObserver, ...] = (),
                 control: SpeculationControl | None = None):
        self.target = target
        self.tokenizer = tokenizer
        self.drafter = drafter
        self.policy = policy or FixedK(4)
        self.config = config
        self.model_name = model_name
        self.observers: list[RoundObserver] = list(observers)
        sc = config.scheduler
        self.scheduler = Scheduler(sc)
        self.control = control or control_for(self.policy, max(1, sc.spec_slots - 1),
                                              can_draft=not isinstance(drafter, NoDrafter))
        self.speculating = self.control.settings().enabled
        self.cache = target.new_cache(sc.max_num_seqs, sc.max_model_len)
        self.eos_ids = frozenset(tokenizer.eos_token_ids)
        # an EAGLE-style drafter reads the target's final-norm hidden states (engine.eagle)
        self.feeds_features = bool(getattr(drafter, "wants_features", False))
        self.rounds = 0
        self.served = 0  # requests finished (for the decay-after-requests fault)
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self.rules = rules_for(config.faults, config.lossy_threshold, config.fault_after)
        self.prefix = (PrefixCache(config.prefix_cache_tokens)
                       if config.prefix_cache_tokens else None)

    # --- public API ------------------------------------------------------------------------
    def submit(self, request: GenerationRequest, on_output: OutputCallback) -> None:
        """Queue a request; raises CapacityError / QueueFullError. Thread-safe."""
        seq = self.scheduler.submit(request, on_output)
        seq.decoder = StreamDecoder(self.tokenizer)

    def cancel(self, request_id: str) -> None:
        """Free the request's slot at the next round boundary. Thread-safe."""
        self.scheduler.cancel(request_id)

    def add_observer(self, observer: RoundObserver) -> None:
        self.observers.append(observer)

    def start(self) -> None:
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name="spectest-engine", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        with self.scheduler.lock:
            self.scheduler.wakeup.notify_all()
        if self._thread:
            self._thread.join(timeout)
            self._thread = None

    def kv_usage(self) -> float:
        """Positions in use over what the running sequences may hold (the budget, if set)."""
        room = min(self.cache.n_slots * self.cache.max_len, self.config.scheduler.budget)
        return self.cache.used_positions() / room

    def run_until_idle(self) -> None:
        """Step on the caller's thread until nothing is queued or running (no thread mode)."""
        while self.step():
            pass

    # --- the loop --------------------------------------------------------------------------
    def _loop(self) -> None:
        while not self._stop.is_set():
            if not self.step():
                self.scheduler.wait_for_work(0.05)
        for seq in list(self.scheduler.running.values()) + list(self.scheduler.waiting):
            self._finish(seq, "abort", error="server shutting down")

    @torch.inference_mode()
    def step(self) -> bool:
        change = self.control.apply(self.rounds)  # a round boundary: runtime settings land here
        if change is not None:
            self.speculating = change.new.enabled
            self.policy = change.policy or self.policy
        admitted, cancelled, preempted = self.scheduler.schedule()
        for seq in cancelled:
            self._release(seq)
            seq.on_output(RequestOutput(seq.request.request_id, (), "", finished=True,
                                        finish_reason="abort", stats=self._stats(seq)))
        for seq in preempted:  # back in the queue: its KV goes, its tokens stay
            self.cache.reset(seq.slot)
            self.drafter.release(seq.slot)
        for seq in admitted:
            try:
                self._prefill(seq)
            except Exception as exc:  # a bad request must not take the engine down
                log.exception("prefill failed for %s", seq.request.request_id)
                self._finish(seq, "error", error=f"prefill failed: {exc}")
        # in slot order: packed slots 0..B-1 let attention read a view of the KV cache
        running = sorted((s for s in self.scheduler.running.values() if not s.finished),
                         key=lambda s: s.slot)
        if running:
            try:
                self._round(running)
            except Exception as exc:
                log.exception("round failed")
                for seq in running:
                    if not seq.finished:
                        self._finish(seq, "error", error=f"engine round failed: {exc}")
        return bool(admitted or cancelled or preempted or running)

    # --- the target's sampling -----------------------------------------------------------
    def _pick(self, seq: Sequence, logits: torch.Tensor) -> int:
        """The target's token from one position's logits [V] (prefill's first token)."""
        params = seq.request.params
        pen = self.rules.target_penalties(self._penalties([seq]))
        if pen is not None:
            logits = apply_penalties(logits[None, None], pen, pen.output_counts[:, None])[0, 0]
        if params.greedy:
            return int(logits.argmax())
        probs = probs_from_logits(logits[None, None],
                                  *self.rules.target_side([params]))[0]  # [1, V]
        return int(sample_from(probs, torch.rand(1, generator=seq.generator)))

    def _penalties(self, seqs: list[Sequence]) -> Penalties | None:
        """The requests' logit bias and penalties for their committed tokens (None: none)."""
        return Penalties.of([s.request.params for s in seqs], [s.tokens for s in seqs],
                            [s.prompt_len for s in seqs], self.tokenizer.vocab_size)

    # --- prefill ---------------------------------------------------------------------------
    def _prefill(self, seq: Sequence) -> None:
        """Compute the prompt into the slot's cache and emit the first token; or, for a
        sequence back from preemption, recompute every token it has but the last (the next
        round's first input) and emit nothing."""
        t0 = time.perf_counter()
        req = seq.request
        resume = seq.resume
        ids = tuple(seq.tokens[:-1]) if resume else req.prompt_ids
        out, hidden = self._fill(seq, ids, req.prompt_logprobs and not resume)
        seq.prefill_seconds += time.perf_counter() - t0
        if resume:
            seq.resume = False
            self._admit_drafter(seq, ids, hidden)
            return
        logits = (out[0] if self.feeds_features else out)[0]  # [T or 1, V]
        prompt_lps = None
        if req.prompt_logprobs:
            logprobs = F.log_softmax(logits[:-1].float(), dim=-1)  # [T-1, V]
            prompt_lps = (None,) + tuple(
                self._logprob(logprobs[i], req.prompt_ids[i + 1], req.logprobs or 0)
                for i in range(len(req.prompt_ids) - 1))
        if req.params.max_tokens == 0:
            seq.on_output(RequestOutput(req.request_id, (), "", prompt_logprobs=prompt_lps))
            self._finish(seq, "length")
            return
        first = self._pick(seq, logits[-1])
        self._admit_drafter(seq, req.prompt_ids, hidden)
        lps = None
        if req.logprobs is not None:
            lps = (self._logprob(F.log_softmax(logits[-1].float(), -1), first, req.logprobs),)
        seq.on_output(self._emit(seq, [first], lps, prompt_lps)[1])

    def _fill(self, seq: Sequence, ids: tuple[int, ...], prompt_logprobs: bool):
        """Run the target over ``ids`` into the slot's (emptied) cache, restoring the longest
        cached prefix first where the prefix cache holds one. Returns the model's output (the
        last position's logits, or every position's for ``prompt_logprobs``) and the hidden
        states of all of ``ids`` [T, D] (None unless an EAGLE drafter reads them)."""
        req = seq.request
        self.cache.reset(seq.slot)
        cached = self.prefix is not None and not prompt_logprobs
        blocks = self.prefix.match(req.cache_salt, ids) if cached else []
        hit = len(blocks) * self.prefix.block if blocks else 0
        if hit:
            PrefixCache.restore(self.cache, seq.slot, blocks,
                                self.rules.restored(hit, req.speculative, self.prefix.block))
        if ids is req.prompt_ids:
            seq.cached_tokens = hit
        out = self.target(torch.tensor([ids[hit:]]), self.cache, torch.tensor([seq.slot]),
                          last_only=not prompt_logprobs, with_hidden=self.feeds_features)
        hidden = out[1][0] if self.feeds_features else None  # [T - hit, D]
        if hit and hidden is not None:
            hidden = torch.cat([PrefixCache.hidden(blocks), hidden])  # [T, D]
        if cached:
            self.prefix.store(req.cache_salt, ids, self.cache, seq.slot, hidden)
        return out, hidden

    def _admit_drafter(self, seq: Sequence, ids, hidden) -> None:
        """The drafter takes the sequence on with ``ids`` computed (all its tokens but the
        last); while speculation is off it skips that, and catches up when it comes back."""
        if self.speculating:
            self.drafter.admit(seq.slot, list(ids))
        else:
            self.drafter.release(seq.slot)
        if self.feeds_features:  # the hidden states of ``ids`` [T, D], for an EAGLE head
            self.drafter.add_features(seq.slot, hidden)

    # --- one round -------------------------------------------------------------------------
    def _round(self, seqs: list[Sequence]) -> None:
        B = len(seqs)
        started = time.time()
        decision = self.policy.choose(B) if self.speculating else SWITCHED_OFF
        max_len = self.config.scheduler.max_model_len
        rows: list[DraftRow] = []
        row_of: list[int] = []
        sampled_u: dict[int, torch.Tensor] = {}
        for i, seq in enumerate(seqs):
            p = seq.request.params
            k = 0
            if seq.request.speculative:
                k = max(0, min(decision.k, p.max_tokens - seq.generated - 1,
                               max_len - len(seq.tokens) - 1))
            if not p.greedy:  # fixed draw count per round → reproducible from the seed
                sampled_u[i] = torch.rand(2 * decision.k + 1, generator=seq.generator)
            if k > 0:
                rows.append(DraftRow(seq.slot, seq.tokens, k, p,
                                     sampled_u[i][:decision.k] if i in sampled_u else None,
                                     seq.prompt_len))
                row_of.append(i)

        t0 = time.perf_counter()
        proposal = self.drafter.propose(rows, stop=self.policy.stop_rule()) if rows else None
        t1 = time.perf_counter()

        K = int(proposal.lens.max()) if proposal is not None and len(rows) else 0
        drafts = torch.zeros(B, K, dtype=torch.long)
        lens = torch.zeros(B, dtype=torch.long)
        if K:
            idx = torch.tensor(row_of)
            drafts[idx] = proposal.tokens[:, :K]
            lens[idx] = proposal.lens
        slots = torch.tensor([s.slot for s in seqs])
        feed = torch.cat([torch.tensor([[s.tokens[-1]] for s in seqs]), drafts], dim=1)
        start = self.cache.lengths[slots].clone()
        hidden = None
        if self.feeds_features:
            logits, hidden = self.target(feed, self.cache, slots, with_hidden=True)
        else:
            logits = self.target(feed, self.cache, slots)  # [B, K+1, V]

        n_acc, nxt = self._verify(seqs, proposal, row_of, drafts, lens, logits, sampled_u,
                                  decision.k)
        t2 = time.perf_counter()

        # bookkeeping: the tensors cross to Python once, not one element at a time per row
        n_prev = torch.tensor([len(s.tokens) for s in seqs])
        self.cache.lengths[slots] = self.rules.committed(start, K, n_prev, n_acc,
                                                         RoundContext(self.served, lens))
        accepted, proposed, bonus_tok = n_acc.tolist(), lens.tolist(), nxt.tolist()
        draft_ids = drafts.tolist()
        row_records, outputs = [], []
        for i, seq in enumerate(seqs):
            a, k_i = accepted[i], proposed[i]
            self.drafter.rewind(seq.slot, len(seq.tokens) + a)
            if hidden is not None:  # the features of the committed positions [a + 1, D]
                self.drafter.add_features(seq.slot, hidden[i, :a + 1])
            if k_i:
                seq.drafts += 1
                seq.draft_tokens += k_i
                seq.accepted_tokens += a
                per_pos = seq.accepted_per_pos
                if len(per_pos) < k_i:
                    per_pos += [0] * (k_i - len(per_pos))
                for pos in range(a):
                    per_pos[pos] += 1
                seq.steps.append((k_i, a))
            new = draft_ids[i][:a] + [bonus_tok[i]]
            lps = None
            if seq.request.logprobs is not None:
                row_lp = F.log_softmax(logits[i, :a + 1].float(), dim=-1)  # [a+1, V]
                lps = tuple(self._logprob(row_lp[j], t, seq.request.logprobs)
                            for j, t in enumerate(new))
            emitted, out = self._emit(seq, new, lps)
            outputs.append((seq, out))
            row_records.append(RowRecord(seq.request.request_id, seq.request.tag, k_i, a,
                                         bool(k_i) and a == k_i, emitted,
                                         seq.request.speculative))
        self.policy.observe(int(lens.sum()), int(n_acc.sum()))
        running, waiting = self.scheduler.counts()
        record = RoundRecord(self.rounds, started, B, decision.k, decision.reason, t1 - t0,
                             t2 - t1, tuple(row_records), self.drafter.name, running, waiting,
                             self.kv_usage(),
                             proposal.network_seconds if proposal is not None else 0.0,
                             proposal.error if proposal is not None else None)
        self.rounds += 1
        try:  # observers first: a client that has its last token, then reads the server's
            for observer in self.observers:  # counters, finds that token counted
                observer(record)
        finally:
            for seq, out in outputs:
                seq.on_output(out)

    def _verify(self, seqs, proposal, row_of, drafts, lens, logits, sampled_u, k_chosen):
        """Accepted drafts and the next token per row [B], [B]: greedy rows by matching the
        target's argmax, sampled rows by rejection sampling (the rules say which is which)."""
        B, K = drafts.shape
        n_acc = torch.zeros(B, dtype=torch.long)
        nxt = torch.zeros(B, dtype=torch.long)
        pen = self.rules.target_penalties(self._penalties(seqs), lens)
        if pen is not None:  # position j sees the committed tokens and drafts[:, :j]
            logits = apply_penalties(logits, pen, position_counts(pen.output_counts, drafts))
        greedy = self.rules.greedy_rows([s.request.params for s in seqs], lens)
        if bool(greedy.any()):
            g = greedy.nonzero().flatten()
            n_acc[g], nxt[g] = verify_greedy(drafts[g], lens[g], logits[g])
        if not bool(greedy.all()):
            s_idx = (~greedy).nonzero().flatten()
            params = [seqs[int(i)].request.params for i in s_idx]
            target_probs = probs_from_logits(logits[s_idx], *self.rules.target_side(params))
            draft_probs = self._draft_probs(proposal, row_of, s_idx, drafts, K,
                                            target_probs.shape[-1])
            u = torch.stack([sampled_u[int(i)] for i in s_idx])  # [b, 2k+1]
            acc_u = u[:, k_chosen:k_chosen + K] if K else u[:, :0]
            n_acc[s_idx], nxt[s_idx] = self.rules.verify_sampled(
                drafts[s_idx], lens[s_idx], draft_probs, target_probs, acc_u, u[:, -1])
        return n_acc, nxt

    @staticmethod
    def _draft_probs(proposal, row_of, s_idx, drafts, K, V) -> torch.Tensor:
        """Draft distributions for the sampled rows [b, K, V] (one-hot for n-gram drafts)."""
        out = F.one_hot(drafts[s_idx], V).float() if K else torch.zeros(len(s_idx), 0, V)
        if K and proposal is not None and proposal.probs is not None:
            where = {r: j for j, r in enumerate(row_of)}
            for j, i in enumerate(s_idx.tolist()):
                if i in where:
                    out[j] = proposal.probs[where[i], :K]
        return out

    # --- outputs -----------------------------------------------------------------------------
    def _logprob(self, logprobs: torch.Tensor, token: int, top_n: int) -> TokenLogprob:
        top = ()
        if top_n:
            values, ids = logprobs.topk(top_n)
            top = tuple(zip(ids.tolist(), values.tolist()))
        return TokenLogprob(int(token), float(logprobs[token]), top)

    def _emit(self, seq: Sequence, new: list[int], lps,
              prompt_lps=None) -> tuple[int, RequestOutput]:
        """Append tokens, apply stop rules, build the delta for the caller to send. Returns
        the tokens actually emitted and the output."""
        p = seq.request.params
        now = time.perf_counter()
        reason = None
        kept = []
        for tok in new:
            kept.append(tok)
            if (tok in p.stop_token_ids) or (tok in self.eos_ids and not p.ignore_eos):
                reason = "stop"
                break
            if seq.generated + len(kept) >= p.max_tokens:
                reason = "length"
                break
        if lps is not None:
            lps = lps[:len(kept)]
        seq.tokens.extend(kept)
        if not seq.first_token_at:
            seq.first_token_at = now
        seq.last_token_at = now
        text = seq.decoder.delta(seq.tokens[seq.prompt_len:])
        if p.stop:
            text, reason = _stop_strings(seq, text, p.stop, reason)
        seq.text += text
        out = RequestOutput(seq.request.request_id, tuple(kept), text, lps, prompt_lps,
                            finished=reason is not None, finish_reason=reason)
        if reason is not None:
            self._release(seq)
            out = RequestOutput(out.request_id, out.token_ids, out.text, out.logprobs,
                                out.prompt_logprobs, True, reason, self._stats(seq))
        return len(kept), out

    def _release(self, seq: Sequence) -> None:
        if not seq.finished:
            self.served += 1
        self.scheduler.finish(seq)
        if seq.slot >= 0:
            self.cache.reset(seq.slot)
            self.drafter.release(seq.slot)

    def _finish(self, seq: Sequence, reason: str, error: str | None = None) -> None:
        self._release(seq)
        seq.on_output(RequestOutput(seq.request.request_id, (), "", finished=True,
                                    finish_reason=reason, stats=self._stats(seq), error=error))

    def _stats(self, seq: Sequence) -> RequestStats:
        now = time.perf_counter()
        admitted = seq.admitted_at or now
        first = seq.first_token_at or now
        return RequestStats(
            prompt_tokens=seq.prompt_len, completion_tokens=max(0, seq.generated),
            arrival_time=seq.arrival, queue_time=admitted - seq.arrival,
            prefill_time=seq.prefill_seconds, ttft=first - seq.arrival,
            decode_time=(seq.last_token_at or first) - first, e2e=now - seq.arrival,
            drafts=seq.drafts, draft_tokens=seq.draft_tokens,
            accepted_tokens=seq.accepted_tokens, accepted_per_pos=tuple(seq.accepted_per_pos),
            speculative=seq.request.speculative, steps=tuple(seq.steps),
            cached_tokens=seq.cached_tokens, preemptions=seq.preemptions)


def _stop_strings(seq: Sequence, text: str, stops: tuple[str, ...],
                  reason: str | None) -> tuple[str, str | None]:
    """The text to emit now and the finish reason, with ``stops`` applied: output ends just
    before the first stop string, and text that could still turn out to begin one is held
    back (``seq.held``) until it does not — else a stop string split over two rounds would
    leak its first characters (one token a round does that; a round of several tokens, not)."""
    full = seq.held + text  # nothing emitted before this can begin a stop string
    hits = [i for i in (full.find(stop) for stop in stops) if i >= 0]
    if hits:
        seq.held = ""
        return full[:min(hits)], "stop"
    if reason is not None:  # finished otherwise: what was held goes out
        seq.held = ""
        return full, reason
    hold = max((k for stop in stops for k in range(1, min(len(stop), len(full) + 1))
                if full.endswith(stop[:k])), default=0)
    seq.held = full[len(full) - hold:] if hold else ""
    return full[:len(full) - hold], None
