"""Prometheus collectors for the bundled engine, built from the one name table.

Owns: :class:`ServingMetrics` — every collector of :mod:`spectest.telemetry.names` on an
injected ``CollectorRegistry``, and the three ways data reaches them: ``observe_round`` (a
:class:`~spectest.engine.requests.RoundRecord` observer: spec-decode counters with vLLM's
semantics, accepted-length histogram, K gauge, draft/verify time), ``observe_request`` (request
timings and token counts when a request finishes; a remote drafter's network time and
failed rounds come with the round record), ``set_load`` (running/waiting/KV gauges) and
``observe_speculation`` (the runtime switch: enabled and configured-K gauges, switch counter).
Rounds and token gaps — the per-round and per-token events, on the engine thread — are queued
and folded into the collectors in a batch when the registry is collected (a collector
registered ahead of the others calls ``flush``) or when the queue is full, so a scrape always
sees every round observed before it.

Does not know: HTTP or the engine's internals. Label values are fixed sets: ``workload`` comes
from the server's bounded tag map, never from a request id or prompt text.
"""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from spectest.telemetry import names as N

_KINDS = {"counter": Counter, "gauge": Gauge, "histogram": Histogram}


@dataclass(frozen=True)
class _EngineSeries:
    """The engine-labelled children, looked up once (``labels()`` costs microseconds, and
    these move every round)."""
    rounds: Counter
    k: Gauge
    draft_time: Histogram
    verify_time: Histogram
    running: Gauge
    waiting: Gauge
    kv_usage: Gauge
    speculation_enabled: Gauge
    speculation_k: Gauge
    speculation_switches: Counter
    network_time: Histogram
    draft_errors: Counter


@dataclass(frozen=True)
class _WorkloadSeries:
    """One workload's per-round and per-token children, looked up once per workload."""
    drafts: Counter
    draft_tokens: Counter
    accepted: Counter
    accepted_length: Histogram
    itl: Histogram
    per_pos_metric: Counter
    labels: dict
    per_pos: list = field(default_factory=list)

    def position(self, pos: int):
        while len(self.per_pos) <= pos:
            self.per_pos.append(self.per_pos_metric.labels(**self.labels,
                                                           position=str(len(self.per_pos))))
        return self.per_pos[pos]


def _collector(spec: N.MetricSpec, registry: CollectorRegistry):
    kwargs = {"registry": registry, "labelnames": spec.labels}
    if spec.kind == "histogram":
        kwargs["buckets"] = spec.buckets
    return _KINDS[spec.kind](spec.name, spec.help, **kwargs)


class _FlushFirst:
    """Registered before every other collector: collecting the registry (a scrape,
    ``get_sample_value``) first folds the queued rounds into the collectors."""

    def __init__(self, flush):
        self._flush = flush

    def describe(self):
        return []

    def collect(self):
        self._flush()
        return []


class ServingMetrics:
    def __init__(self, registry: CollectorRegistry, model_name: str, drafter: str,
                 max_pending: int = 256):
        self.registry = registry
        self._pending: deque = deque()
        self._fold_lock = threading.Lock()
        self.max_pending = max_pending
        registry.register(_FlushFirst(self.flush))
        self.model_name, self.drafter = model_name, drafter
        self.c = {spec.name: _collector(spec, registry) for spec in N.ALL}
        engine = {"model_name": model_name, "drafter": drafter}
        for spec in (N.RUNNING, N.WAITING, N.KV_USAGE, N.SPEC_K):
            self.c[spec.name].labels(**engine).set(0)
        self._engine_labels = engine
        self._engine = _EngineSeries(*(self._m(spec).labels(**engine) for spec in (
            N.SPEC_ROUNDS, N.SPEC_K, N.SPEC_DRAFT_TIME, N.SPEC_VERIFY_TIME, N.RUNNING,
            N.WAITING, N.KV_USAGE, N.SPECULATION_ENABLED, N.SPECULATION_K,
            N.SPECULATION_SWITCHES, N.SPEC_NETWORK_TIME, N.SPEC_DRAFT_ERRORS)))
        self._workloads: dict[str, _WorkloadSeries] = {}
        self._precreate()

    def _precreate(self, max_positions: int = 8) -> None:
        """Series that are only sometimes hit exist at zero from start-up, so rates, panels
        and absent() alerts see them before the first event."""
        for workload in N.WORKLOADS:
            labels = self.request_labels(workload)
            for spec in (N.SPEC_NUM_DRAFTS, N.SPEC_NUM_DRAFT_TOKENS,
                         N.SPEC_NUM_ACCEPTED_TOKENS, N.PROMPT_TOKENS, N.GENERATION_TOKENS):
                self._m(spec).labels(**labels)
            for pos in range(max_positions):
                self._m(N.SPEC_NUM_ACCEPTED_PER_POS).labels(**labels, position=str(pos))
            for reason in N.FINISHED_REASONS:
                self._m(N.REQUEST_SUCCESS).labels(**labels, finished_reason=reason)
            for mode in ("true", "false"):
                self._m(N.SPEC_REQUESTS).labels(**labels, speculative=mode)
        for code in ("400", "401", "404", "429", "500", "503"):
            self._m(N.REQUEST_ERRORS).labels(**self._engine_labels, code=code)
        self._m(N.SPEC_ROUNDS).labels(**self._engine_labels)
        for spec in (N.PREEMPTIONS, N.PREFIX_CACHE_QUERIES, N.PREFIX_CACHE_HITS):
            self._m(spec).labels(**self._engine_labels)

    def _m(self, spec: N.MetricSpec):
        return self.c[spec.name]

    def request_labels(self, workload: str) -> dict[str, str]:
        return {"model_name": self.model_name, "drafter": self.drafter, "workload": workload}

    def workload_of(self, tag: str) -> str:
        return tag if tag in N.WORKLOADS else "other"

    def _series(self, workload: str) -> _WorkloadSeries:
        series = self._workloads.get(workload)
        if series is None:  # at most len(N.WORKLOADS) of these
            labels = self.request_labels(workload)
            series = _WorkloadSeries(*(self._m(spec).labels(**labels) for spec in (
                N.SPEC_NUM_DRAFTS, N.SPEC_NUM_DRAFT_TOKENS, N.SPEC_NUM_ACCEPTED_TOKENS,
                N.SPEC_ACCEPTED_LENGTH, N.ITL)), self._m(N.SPEC_NUM_ACCEPTED_PER_POS), labels)
            self._workloads[workload] = series
        return series

    # --- per round (engine thread) -----------------------------------------------------------
    def observe_round(self, record) -> None:
        """Queue the round; it reaches the collectors at the next collection of the registry
        (a scrape) or once ``max_pending`` events are queued. Folding a round into a dozen
        children costs 3–8 µs warm and 30+ µs on the engine thread between two forwards,
        whose caches the model has just flushed; folded in a batch, the same work is warm."""
        self._pending.append(record)
        if len(self._pending) >= self.max_pending:
            self.flush()

    def flush(self) -> None:
        """Fold every queued round and token gap into the collectors (any thread)."""
        with self._fold_lock:
            pending, last = self._pending, None
            while pending:
                event = pending.popleft()
                if type(event) is tuple:  # (workload, seconds): a token gap
                    self._series(event[0]).itl.observe(event[1])
                else:
                    self._fold_round(event)
                    last = event
            if last is not None:
                self.set_load(last.running, last.waiting, last.kv_usage)

    def _fold_round(self, record) -> None:
        e = self._engine
        e.rounds.inc()
        e.k.set(record.k)
        if any(row.k_proposed for row in record.rows):
            e.draft_time.observe(record.draft_seconds)
        if record.network_seconds > 0:
            e.network_time.observe(record.network_seconds)
        if record.draft_error is not None:
            e.draft_errors.inc()
        e.verify_time.observe(record.verify_seconds)
        for row in record.rows:
            if not row.k_proposed:
                continue
            w = self._series(self.workload_of(row.tag))
            w.drafts.inc()
            w.draft_tokens.inc(row.k_proposed)
            w.accepted.inc(row.accepted)
            w.accepted_length.observe(row.accepted + 1)
            for pos in range(row.k_proposed):
                # every proposed position's series exists, so rates exist even when zero
                child = w.position(pos)
                if pos < row.accepted:
                    child.inc()

    def observe_speculation(self, enabled: bool, k: int, switched: bool = False) -> None:
        """The runtime speculation settings now in force; ``switched``: a change just landed."""
        e = self._engine
        e.speculation_enabled.set(1 if enabled else 0)
        e.speculation_k.set(k)
        if switched:
            e.speculation_switches.inc()

    def set_load(self, running: int, waiting: int, kv_usage: float) -> None:
        e = self._engine
        e.running.set(running)
        e.waiting.set(waiting)
        e.kv_usage.set(kv_usage)

    # --- per request -------------------------------------------------------------------------
    def observe_token_gap(self, workload: str, seconds: float) -> None:
        """Queued like a round (the server calls it on the engine thread, per output)."""
        self._pending.append((workload, seconds))
        if len(self._pending) >= self.max_pending:
            self.flush()

    def observe_first_token(self, workload: str, seconds: float) -> None:
        self._m(N.TTFT).labels(**self.request_labels(workload)).observe(seconds)

    def observe_request(self, workload: str, stats, finish_reason: str) -> None:
        labels = self.request_labels(workload)
        self._m(N.PROMPT_TOKENS).labels(**labels).inc(stats.prompt_tokens)
        self._m(N.PREFIX_CACHE_QUERIES).labels(**self._engine_labels).inc(stats.prompt_tokens)
        self._m(N.PREFIX_CACHE_HITS).labels(**self._engine_labels).inc(stats.cached_tokens)
        if stats.preemptions:
            self._m(N.PREEMPTIONS).labels(**self._engine_labels).inc(stats.preemptions)
        self._m(N.GENERATION_TOKENS).labels(**labels).inc(stats.completion_tokens)
        self._m(N.E2E).labels(**labels).observe(stats.e2e)
        self._m(N.QUEUE).labels(**labels).observe(stats.queue_time)
        self._m(N.PREFILL).labels(**labels).observe(stats.prefill_time)
        self._m(N.DECODE).labels(**labels).observe(stats.decode_time)
        if stats.completion_tokens > 1:
            self._m(N.TPOT).labels(**labels).observe(
                stats.decode_time / (stats.completion_tokens - 1))
        reason = finish_reason if finish_reason in N.FINISHED_REASONS else "error"
        self._m(N.REQUEST_SUCCESS).labels(**labels, finished_reason=reason).inc()
        self._m(N.SPEC_REQUESTS).labels(
            **labels, speculative="true" if stats.speculative else "false").inc()
        if stats.draft_tokens:
            self._m(N.SPEC_REQUEST_ACCEPTANCE).labels(**labels).observe(
                stats.accepted_tokens / stats.draft_tokens)

    def observe_error(self, status: int) -> None:
        self._m(N.REQUEST_ERRORS).labels(**self._engine_labels, code=str(status)).inc()
