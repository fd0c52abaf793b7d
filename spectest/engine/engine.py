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

The device: tensors live where the target's weights are (``engine.device``); the bookkeeping
(lengths, drafts per row, which rows are greedy) is the host's, so a round waits for the device
once — the fetch of the accept decision (accepted counts, next tokens, drafts, any logprobs) —
and a prefill once, for its first token. Per-request generators are made on the device.

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

import numpy as np
import torch

from spectest.engine import logprobs as lp
from spectest.engine.control import SpeculationControl, control_for
from spectest.engine.device import Placement, fetch
from spectest.engine.drafters import Drafter, DraftRow, NoDrafter
from spectest.engine.faults import DEFAULT_FAULT_AFTER, FAULTS, RoundContext, rules_for
from spectest.engine.penalties import Penalties, apply_penalties, position_counts
from spectest.engine.policies import Decision, FixedK, KPolicy
from spectest.engine.prefix_cache import PrefixCache, prefill_spans
from spectest.engine.requests import (GenerationRequest, RequestOutput, RequestStats,
                                      RoundRecord, RowRecord)
from spectest.engine.sampling import one_hot, probs_from_logits, sample_from
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
        self.target = target  # as engine.inference prepared it (build_engine), or as given
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
        self.place = Placement.of(target.embed_tokens)  # where the target's tensors live
        self.cache = target.new_cache(sc.max_num_seqs, sc.max_model_len)
        self.phase_sync = False  # profiling: wait for the device between a round's phases
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
        self.scheduler.submit(request, on_output, self.place.generator(request.params.seed),
                              StreamDecoder(self.tokenizer))

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
    def _pick(self, seq: Sequence, logits: torch.Tensor) -> torch.Tensor:
        """The target's token from one position's logits [V] (prefill's first token), as a
        device tensor [1]."""
        params = seq.request.params
        pen = self.rules.target_penalties(self._penalties([seq]))
        if pen is not None:
            logits = apply_penalties(logits[None, None], pen, pen.output_counts[:, None])[0, 0]
        if params.greedy:
            return logits.argmax(-1, keepdim=True)
        probs = probs_from_logits(logits[None, None],
                                  *self.rules.target_side([params]))[0]  # [1, V]
        return sample_from(probs, torch.rand(1, generator=seq.generator,
                                             device=self.place.device))

    def _penalties(self, seqs: list[Sequence]) -> Penalties | None:
        """The requests' logit bias and penalties for their committed tokens (None: none)."""
        return Penalties.of([s.request.params for s in seqs], [s.tokens for s in seqs],
                            [s.prompt_len for s in seqs], self.tokenizer.vocab_size,
                            self.place.device)

    # --- prefill ---------------------------------------------------------------------------
    def _prefill(self, seq: Sequence) -> None:
        """Compute the prompt into the slot's cache and emit the first token; or, for a
        sequence back from preemption, recompute every token it has but the last (the next
        round's first input) and emit nothing. One wait for the device, for the first token
        (and any logprobs asked for, in the same fetch)."""
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
        top_n = req.logprobs or 0
        wanted: list[torch.Tensor] = []
        if req.prompt_logprobs:  # position i scores prompt token i + 1
            wanted += lp.scored(logits[:-1], self.place.tokens(req.prompt_ids[1:]), top_n)
        if req.params.max_tokens == 0:
            prompt_lps = self._prompt_logprobs(req, fetch(*wanted)) if wanted else None
            seq.on_output(RequestOutput(req.request_id, (), "", prompt_logprobs=prompt_lps))
            self._finish(seq, "length")
            return
        first = self._pick(seq, logits[-1])  # [1]
        self._admit_drafter(seq, req.prompt_ids, hidden)
        if req.logprobs is not None:
            wanted += lp.scored(logits[-1:], first, top_n)
        host = fetch(first, *wanted)  # the prefill's one wait
        token = int(host[0][0])
        prompt_lps, rest = None, host[1:]
        if req.prompt_logprobs:
            prompt_lps, rest = self._prompt_logprobs(req, rest[:3]), rest[3:]
        lps = lp.records([token], *rest, top_n) if req.logprobs is not None else None
        seq.on_output(self._emit(seq, [token], lps, prompt_lps)[1])

    @staticmethod
    def _prompt_logprobs(req: GenerationRequest, host: list[np.ndarray]):
        """The prompt's logprobs (None for its first token) from fetched arrays."""
        return (None,) + lp.records(list(req.prompt_ids[1:]), *host, req.logprobs or 0)

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
                                self.rules.restored(hit, req.speculative, self.prefix.align))
        if ids is req.prompt_ids:
            seq.cached_tokens = hit
        out = self._chunked(ids, hit, seq.slot, prompt_logprobs)
        hidden = out[1][0] if self.feeds_features else None  # [T - hit, D]
        if hit and hidden is not None:
            hidden = torch.cat([PrefixCache.hidden(blocks), hidden])  # [T, D]
        if cached:
            self.prefix.store(req.cache_salt, ids, self.cache, seq.slot, hidden)
        return out, hidden

    def _chunked(self, ids: tuple[int, ...], start: int, slot: int, every_position: bool):
        """The target over ``ids[start:]`` in chunk-aligned forwards (:func:`prefill_spans`):
        warm logits equal cold ones bit for bit, so the prefix cache never changes what the
        model says (one forward over the whole prompt would round its positions differently
        from a forward over the part a hit leaves, and int8 weights turn that into whole
        quantization steps that flip greedy choices). Returns what one forward over them would: logits [1, T,
        V] (or [1, 1, V] unless ``every_position``), with hidden states when EAGLE reads them."""
        outs = []
        for lo, hi in prefill_spans(start, len(ids)):
            outs.append(self.target(self.place.tokens([ids[lo:hi]]), self.cache, [slot],
                                    last_only=not every_position,
                                    with_hidden=self.feeds_features))
        if len(outs) == 1:
            return outs[0]
        if not self.feeds_features:
            return torch.cat(outs, dim=1) if every_position else outs[-1]
        logits = torch.cat([o[0] for o in outs], dim=1) if every_position else outs[-1][0]
        return logits, torch.cat([o[1] for o in outs], dim=1)

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
    def _mark(self) -> float:
        """A phase boundary: the time now (after the device has caught up, when profiling)."""
        if self.phase_sync:
            self.place.synchronize()
        return time.perf_counter()

    def _round(self, seqs: list[Sequence]) -> None:
        B = len(seqs)
        place = self.place
        started, t_start = time.time(), self._mark()
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
                sampled_u[i] = torch.rand(2 * decision.k + 1, generator=seq.generator,
                                          device=place.device)
            if k > 0:
                rows.append(DraftRow(seq.slot, seq.tokens, k, p,
                                     sampled_u[i][:decision.k] if i in sampled_u else None,
                                     seq.prompt_len))
                row_of.append(i)

        t0 = self._mark()
        proposal = self.drafter.propose(rows, stop=self.policy.stop_rule()) if rows else None
        t1 = self._mark()

        lens = np.zeros(B, dtype=np.int64)  # drafts per row (host)
        if proposal is not None:
            lens[row_of] = proposal.lens
        K = int(lens.max()) if B else 0
        drafts = torch.zeros(B, K, dtype=torch.long, device=place.device)
        if K:
            proposed = place.to_device(proposal.tokens)[:, :K]
            if row_of == list(range(B)):
                drafts = proposed
            else:
                drafts[place.to_device(np.array(row_of))] = proposed
        slots = np.array([s.slot for s in seqs], dtype=np.int64)
        last = place.tokens([[s.tokens[-1]] for s in seqs])  # [B, 1]
        feed = torch.cat([last, drafts], dim=1) if K else last  # [B, K+1]
        start = self.cache.lengths[slots].copy()
        hidden = None
        if self.feeds_features:
            logits, hidden = self.target(feed, self.cache, slots, with_hidden=True)
        else:
            logits = self.target(feed, self.cache, slots)  # [B, K+1, V]
        t_model = self._mark()

        lens_dev = place.to_device(lens)
        n_acc, nxt = self._verify(seqs, proposal, row_of, drafts, lens, lens_dev, logits,
                                  sampled_u, decision.k)
        want_lp = [i for i, s in enumerate(seqs) if s.request.logprobs is not None]
        extra: tuple[torch.Tensor, ...] = ()
        if want_lp:
            idx = place.to_device(np.array(want_lp)) if len(want_lp) < B else None
            sel = (lambda t: t) if idx is None else (lambda t: t[idx])
            extra = lp.candidate_logprobs(
                sel(logits), sel(drafts), sel(n_acc), sel(nxt),
                max(seqs[i].request.logprobs for i in want_lp)).tensors()
        t_accept = self._mark()
        host = fetch(n_acc, nxt, drafts, *extra)  # the round's one wait for the device
        t2 = time.perf_counter()

        # bookkeeping, on the host
        accepted, bonus_tok, draft_ids = host[0].tolist(), host[1].tolist(), host[2].tolist()
        n_prev = np.array([len(s.tokens) for s in seqs], dtype=np.int64)
        self.cache.lengths[slots] = self.rules.committed(start, K, n_prev, host[0],
                                                         RoundContext(self.served, lens))
        proposed_k = lens.tolist()
        lp_rows = {i: j for j, i in enumerate(want_lp)}
        row_records, outputs = [], []
        for i, seq in enumerate(seqs):
            a, k_i = accepted[i], proposed_k[i]
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
            if i in lp_rows:
                j = lp_rows[i]
                lps = lp.assemble(new, a, host[3][j], host[4][j], host[5][j], host[6][j],
                                  seq.request.logprobs)
            emitted, out = self._emit(seq, new, lps)
            outputs.append((seq, out))
            row_records.append(RowRecord(seq.request.request_id, seq.request.tag, k_i, a,
                                         bool(k_i) and a == k_i, emitted,
                                         seq.request.speculative))
        self.policy.observe(int(lens.sum()), int(sum(accepted)))
        running, waiting = self.scheduler.counts()
        record = RoundRecord(self.rounds, started, B, decision.k, decision.reason, t1 - t0,
                             t2 - t1, tuple(row_records), self.drafter.name, running, waiting,
                             self.kv_usage(),
                             proposal.network_seconds if proposal is not None else 0.0,
                             proposal.error if proposal is not None else None,
                             target_seconds=t_model - t1, accept_seconds=t_accept - t_model,
                             sync_seconds=t2 - t_accept,
                             round_seconds=time.perf_counter() - t_start)
        self.rounds += 1
        try:  # observers first: a client that has its last token, then reads the server's
            for observer in self.observers:  # counters, finds that token counted
                observer(record)
        finally:
            for seq, out in outputs:
                seq.on_output(out)

    def _verify(self, seqs, proposal, row_of, drafts, lens, lens_dev, logits, sampled_u,
                k_chosen):
        """Accepted drafts and the next token per row [B], [B] (device): greedy rows by
        matching the target's argmax, sampled rows by rejection sampling (the rules say which
        is which, on the host)."""
        B, K = drafts.shape
        place = self.place
        params = [s.request.params for s in seqs]
        pen = self.rules.target_penalties(self._penalties(seqs), lens_dev)
        if pen is not None:  # position j sees the committed tokens and drafts[:, :j]
            logits = apply_penalties(logits, pen, position_counts(pen.output_counts, drafts))
        greedy = self.rules.greedy_rows(params, lens)  # [B] host
        if greedy.all():
            return verify_greedy(drafts, lens_dev, logits)
        s_rows = np.flatnonzero(~greedy)
        s_idx = None if len(s_rows) == B else place.to_device(s_rows)
        sel = (lambda t: t) if s_idx is None else (lambda t: t[s_idx])
        target_probs = probs_from_logits(sel(logits),
                                         *self.rules.target_side([params[i] for i in s_rows]))
        draft_probs = self._draft_probs(proposal, row_of, s_rows, sel(drafts),
                                        target_probs.shape[-1])
        u = torch.stack([sampled_u[i] for i in s_rows])  # [b, 2k+1]
        acc_u = u[:, k_chosen:k_chosen + K]
        n_s, next_s = self.rules.verify_sampled(sel(drafts), sel(lens_dev), draft_probs,
                                                target_probs, acc_u, u[:, -1])
        if s_idx is None:
            return n_s, next_s
        g_idx = place.to_device(np.flatnonzero(greedy))
        n_g, next_g = verify_greedy(drafts[g_idx], lens_dev[g_idx], logits[g_idx])
        n_acc = torch.empty(B, dtype=torch.long, device=place.device)
        nxt = torch.empty(B, dtype=torch.long, device=place.device)
        n_acc[g_idx], nxt[g_idx] = n_g, next_g
        n_acc[s_idx], nxt[s_idx] = n_s, next_s
        return n_acc, nxt

    def _draft_probs(self, proposal, row_of, s_rows, drafts, V) -> torch.Tensor:
        """Draft distributions for the sampled rows [b, K, V] (one-hot for n-gram drafts);
        ``drafts``: theirs [b, K]."""
        K = drafts.shape[1]
        out = one_hot(drafts, V)  # [b, K, V]
        if K and proposal is not None and proposal.probs is not None:
            where = {r: j for j, r in enumerate(row_of)}
            pairs = [(j, where[i]) for j, i in enumerate(s_rows.tolist()) if i in where]
            if pairs:
                dst = self.place.to_device(np.array([d for d, _ in pairs]))
                src = self.place.to_device(np.array([s for _, s in pairs]))
                out[dst] = self.place.to_device(proposal.probs)[src, :K].float()
        return out

    # --- outputs -----------------------------------------------------------------------------
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
