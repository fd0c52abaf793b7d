"""OpenTelemetry traces: a server span per request and a span per speculation round under it.

Owns: building a ``TracerProvider`` from the standard ``OTEL_*`` environment variables
(``OTEL_TRACES_EXPORTER=otlp|console|none``, default none; OTLP over HTTP reads
``OTEL_EXPORTER_OTLP_ENDPOINT`` itself) plus an optional JSON-lines file exporter for users
without a collector; :class:`RoundTracer`, the engine observer that turns each
:class:`~spectest.engine.requests.RoundRecord` into one ``spec.round`` span per request it
drafted for, under that request's span, carrying the round's phases as attributes
(``spec.draft_ms``, ``spec.network_ms`` — a disaggregated drafter's transport time —
``spec.verify_ms``) and the request's own share (K proposed, accepted, emitted); a request's
consecutive rounds without drafts become one ``spec.decode`` span.

Does not know: HTTP routing or Prometheus. No global provider is installed: the server passes
the provider in, and a ``None`` provider means tracing is off at zero cost.
"""

from __future__ import annotations

import json
import math
import os
import threading
import time
from collections import deque
from pathlib import Path
from typing import Callable, Sequence

import orjson
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import (BatchSpanProcessor, ConsoleSpanExporter,
                                            SpanExporter, SpanExportResult)
from opentelemetry.sdk.util import ns_to_iso_str
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import Span, SpanContext, SpanKind

# OpenTelemetry's GenAI semantic-convention attribute names (docs/metrics.md lists them).
OPERATION = "gen_ai.operation.name"
REQUEST_MODEL = "gen_ai.request.model"
TEMPERATURE = "gen_ai.request.temperature"
TOP_P = "gen_ai.request.top_p"
TOP_K = "gen_ai.request.top_k"
MAX_TOKENS = "gen_ai.request.max_tokens"
SEED = "gen_ai.request.seed"
INPUT_TOKENS = "gen_ai.usage.input_tokens"
OUTPUT_TOKENS = "gen_ai.usage.output_tokens"
FINISH_REASONS = "gen_ai.response.finish_reasons"
RESPONSE_ID = "gen_ai.response.id"
RESPONSE_MODEL = "gen_ai.response.model"


def _context(ctx) -> dict[str, str]:
    return {"trace_id": f"0x{ctx.trace_id:032x}", "span_id": f"0x{ctx.span_id:016x}",
            "trace_state": repr(ctx.trace_state)}


class IsoTime:
    """``ns_to_iso_str`` (the SDK's span timestamps, ``2026-11-23T23:46:45.147283Z``), same
    string for every input, at a fifth of its cost: the date and time of day are formatted once
    per second, the microseconds computed as ``datetime.fromtimestamp`` rounds them (half to
    even, of the float seconds)."""

    def __init__(self):
        self._second, self._prefix = None, ""

    def __call__(self, nanoseconds: int) -> str:
        frac, whole = math.modf(nanoseconds / 1e9)
        micro = round(frac * 1e6)
        if micro >= 1_000_000:
            whole, micro = whole + 1, micro - 1_000_000
        if whole != self._second:
            self._second = whole
            self._prefix = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(whole))
        return f"{self._prefix}.{micro:06d}Z"


def span_record(span: ReadableSpan, resource: dict | None,
                iso: Callable[[int], str] = ns_to_iso_str) -> dict:
    """The fields of ``ReadableSpan.to_json()``, built directly: the SDK's version indents,
    and re-serializes the resource for every span, several times slower — and the exporter
    competes with the engine thread for the GIL. ``resource`` None: left out (the file exporter
    appends its serialized form)."""
    status = {"status_code": span.status.status_code.name}
    if span.status.description:
        status["description"] = span.status.description
    record = {
        "name": span.name,
        "context": _context(span.context) if span.context else None,
        "kind": str(span.kind),
        "parent_id": f"0x{span.parent.span_id:016x}" if span.parent else None,
        "start_time": iso(span.start_time) if span.start_time else None,
        "end_time": iso(span.end_time) if span.end_time else None,
        "status": status,
        "attributes": dict(span.attributes or {}),
        "events": [{"name": e.name, "timestamp": iso(e.timestamp),
                    "attributes": dict(e.attributes or {})} for e in span.events],
        "links": [{"context": _context(link.context), "attributes": dict(link.attributes or {})}
                  for link in span.links],
    }
    if resource is not None:
        record["resource"] = resource
    return record


def _dumps(record: dict) -> str:
    """Compact JSON (orjson: a fifth of ``json``'s time per span record); what orjson refuses
    (a lone surrogate in an attribute) goes through ``json``."""
    try:
        return orjson.dumps(record, default=str).decode()
    except TypeError:
        return json.dumps(record, separators=(",", ":"), default=str)


class JsonLinesExporter(SpanExporter):
    """One JSON object per finished span (``ReadableSpan.to_json``'s fields, on one line),
    appended to a file (flushed per batch)."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._file = open(self.path, "a", encoding="utf-8")
        self._resource: tuple[object, str] = (None, "")  # one provider → one Resource
        self._iso = IsoTime()

    def _resource_json(self, span: ReadableSpan) -> str:
        """``,"resource":{…}}`` — serialized once, appended to every record."""
        if self._resource[0] is not span.resource:
            resource = json.loads(span.resource.to_json())
            self._resource = (span.resource, ',"resource":' + _dumps(resource) + "}")
        return self._resource[1]

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        iso = self._iso
        lines = [_dumps(span_record(span, None, iso))[:-1] + self._resource_json(span)
                 for span in spans]
        with self._lock:
            self._file.write("".join(line + "\n" for line in lines))
            self._file.flush()
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        with self._lock:
            self._file.close()


def build_tracer_provider(service_name: str = "spectest",
                          trace_file: Path | None = None,
                          environ: dict | None = None) -> TracerProvider | None:
    """A provider per the OTEL_* env vars and ``trace_file``; None when tracing is off."""
    env = os.environ if environ is None else environ
    choice = env.get("OTEL_TRACES_EXPORTER", "none").strip().lower()
    if env.get("OTEL_SDK_DISABLED", "").lower() == "true":
        choice = "none"
    exporters: list[SpanExporter] = []
    for name in filter(None, (c.strip() for c in choice.split(","))):
        if name == "none":
            continue
        if name == "console":
            exporters.append(ConsoleSpanExporter())
        elif name in ("otlp", "otlp_proto_http"):
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
            exporters.append(OTLPSpanExporter())
        else:
            raise ValueError(f"OTEL_TRACES_EXPORTER={name!r} is not supported "
                             "(otlp, console, none)")
    if trace_file:
        exporters.append(JsonLinesExporter(trace_file))
    if not exporters:
        return None
    resource = Resource.create({"service.name": env.get("OTEL_SERVICE_NAME", service_name)})
    provider = TracerProvider(resource=resource)
    for exporter in exporters:
        provider.add_span_processor(BatchSpanProcessor(exporter, schedule_delay_millis=500))
    return provider


def _ns(seconds: float) -> int:
    return int(seconds * 1e9)


class RoundTracer:
    """Engine observer: one ``spec.round`` span per request in a round that drafted for it, its
    phases as attributes; a request's consecutive rounds *without* drafts (speculation off for
    it, K = 0 from the policy, the last token) become one ``spec.decode`` span covering them,
    with their count (``spec.rounds``) and summed attributes — a span per plain decode step
    would be a span per token, which made tracing cost a large share of a speculation-off
    server's throughput (docs/results.md).

    The server registers each request's span (``register``) before submitting it and retires
    it (``unregister``) when the request ends; rows whose request has no span are skipped.
    ``unregister`` only marks the span: it is dropped after the next round record has been
    seen, so the request's last round gets its span (and its open ``spec.decode`` run is
    closed) whether its last tokens reached the server before the engine called its observers
    for that round or after (the engine calls them first).

    With ``background`` (the server's choice) the engine thread only snapshots the parents
    and queues the record; a worker thread wakes every ``interval`` seconds and builds the
    spans with the recorded timestamps — in batches, so it takes the GIL a few times a second
    instead of once a round. ``flush`` has it drain the queue now; ``shutdown`` drains it,
    closes the open runs and stops the worker. Past ``max_pending`` queued rounds the oldest
    are dropped and counted (``dropped``).
    """

    def __init__(self, provider: TracerProvider, background: bool = False,
                 max_pending: int = 4096, interval: float = 0.2):
        tracer = provider.get_tracer("spectest.engine")
        self._processor, self._ids = tracer.span_processor, tracer.id_generator
        self._resource, self._scope = tracer.resource, InstrumentationScope("spectest.engine")
        self._spans: dict[str, SpanContext] = {}
        self._retired: dict[str, float] = {}  # request id → when it was unregistered
        self._lock = threading.Lock()
        self.max_pending, self.dropped, self.interval = max_pending, 0, interval
        self._pending: deque = deque()
        self._runs: dict[str, _PlainRun] = {}  # request id → its open run of plain rounds
        self._work = threading.Condition()
        self._busy = self._stopping = self._flushing = False
        self._worker = None
        if background:
            self._worker = threading.Thread(target=self._drain, name="spectest-round-spans",
                                            daemon=True)
            self._worker.start()

    def register(self, request_id: str, span: Span) -> None:
        if not span.is_recording():  # sampled out (OTEL_TRACES_SAMPLER): no round spans
            return
        with self._lock:
            self._spans[request_id] = span.get_span_context()

    def unregister(self, request_id: str) -> None:
        with self._lock:
            if request_id in self._spans:
                self._retired[request_id] = time.monotonic()

    def __call__(self, record) -> None:
        with self._lock:
            retired, self._retired = self._retired, {}
            parents = {row.request_id: self._spans.get(row.request_id) for row in record.rows}
            for request_id in retired:
                self._spans.pop(request_id, None)
        if self._worker is None:
            self._trace(record, parents, retired)
            return
        with self._work:  # no notify: the worker comes by every `interval` seconds
            if len(self._pending) >= self.max_pending:
                self._pending.popleft()
                self.dropped += 1
            self._pending.append((record, parents, retired))

    def flush(self, timeout: float = 10.0) -> bool:
        """Wait until every queued round has its spans; False on timeout. Runs of plain
        rounds of requests still going stay open."""
        if self._worker is None:
            return True
        with self._work:
            self._flushing = True
            self._work.notify_all()
            done = self._work.wait_for(lambda: not self._pending and not self._busy, timeout)
            self._flushing = False
            return done

    def shutdown(self, timeout: float = 10.0) -> None:
        if self._worker is not None:
            with self._work:
                self._stopping = True
                self._work.notify_all()
            self._worker.join(timeout)
        for request_id in list(self._runs):
            self._close_run(request_id)

    def _drain(self) -> None:
        while True:
            with self._work:
                self._work.wait_for(lambda: self._stopping or self._flushing, self.interval)
                if not self._pending and self._stopping:
                    return
                batch = list(self._pending)
                self._pending.clear()
                self._busy = True
            idle = self._idle_retired()
            try:
                for record, parents, retired in batch:
                    self._trace(record, parents, retired)
                for request_id in idle:
                    self._close_run(request_id)
            finally:
                with self._work:
                    self._busy = False
                    self._work.notify_all()

    def _idle_retired(self) -> list[str]:
        """Requests unregistered an interval ago with no round record since (the server went
        idle): their last round was observed long ago, so their open runs can close now."""
        old = time.monotonic() - self.interval
        with self._lock:
            idle = [rid for rid, at in self._retired.items() if at <= old]
            for request_id in idle:
                del self._retired[request_id]
                self._spans.pop(request_id, None)
        return idle

    def _emit(self, name: str, parent: SpanContext, start: int, end: int,
              attributes: dict) -> None:
        """A finished INTERNAL span under ``parent``, handed straight to the provider's span
        processors as a ``ReadableSpan``: what ``start_span(...).end()`` delivers, at a fifth
        of its cost (5.9 µs against 26 µs a span, measured: no sampler call — a round span
        follows its request span's decision, made at ``register`` —, no attribute
        re-validation of these fixed int/float/bool/str sets, no span lock, no ``on_start``,
        which no exporting processor uses)."""
        context = SpanContext(parent.trace_id, self._ids.generate_span_id(), is_remote=False,
                              trace_flags=parent.trace_flags, trace_state=parent.trace_state)
        self._processor.on_end(ReadableSpan(
            name, context, parent, self._resource, attributes, kind=SpanKind.INTERNAL,
            start_time=start, end_time=end, instrumentation_scope=self._scope))

    def _trace(self, record, parents: dict[str, SpanContext | None], retired=()) -> None:
        """One ``spec.round`` span per traced request that drafted in the round (or whose
        drafter failed: the error is worth its own span); rows without drafts extend the
        request's run of plain rounds. The phases are attributes (draft,
        network, verify milliseconds), not child spans: three spans per request per round cost
        3× as much, and the round's start and end still bound them on the timeline."""
        start = _ns(record.started_at)
        end = start + _ns(record.draft_seconds + record.verify_seconds)
        # Each attribute costs every span ~1.3 µs to create and export: what is the same for a
        # whole request (the drafter: ``spectest.drafter`` on the request's span) or only
        # sometimes set (network time, a drafter failure) is left out when it says nothing.
        common = None
        for row in record.rows:
            parent = parents[row.request_id]
            if parent is None:
                continue
            if not row.k_proposed and record.draft_error is None:
                run = self._runs.get(row.request_id)
                if run is None:
                    run = self._runs[row.request_id] = _PlainRun(parent, record.index, start)
                run.add(record, row, end)
                continue
            self._close_run(row.request_id)
            if common is None:
                common = {"spec.round.index": record.index, "spec.batch_size": record.batch_size,
                          "spec.k_policy": record.k, "spec.draft_ms": record.draft_seconds * 1e3,
                          "spec.verify_ms": record.verify_seconds * 1e3}
                if record.network_seconds > 0:  # a drafter in another process (--draft-url)
                    common["spec.network_ms"] = record.network_seconds * 1e3
                if record.draft_error is not None:
                    common["spec.draft_error"] = record.draft_error
            self._emit("spec.round", parent, start, end,
                       {**common, "spec.k_proposed": row.k_proposed,
                        "spec.accepted": row.accepted, "spec.bonus": row.bonus,
                        "spec.emitted": row.emitted})
        for request_id in retired:
            self._close_run(request_id)

    def _close_run(self, request_id: str) -> None:
        run = self._runs.pop(request_id, None)
        if run is not None:
            self._emit("spec.decode", run.parent, run.start, run.end, run.attributes())


class _PlainRun:
    """A request's consecutive rounds without drafts, summed into one ``spec.decode`` span."""

    __slots__ = ("parent", "first_index", "start", "end", "rounds", "emitted", "batch_size",
                 "draft_s", "verify_s", "k_policy")

    def __init__(self, parent: SpanContext, first_index: int, start: int):
        self.parent, self.first_index, self.start, self.end = parent, first_index, start, start
        self.rounds = self.emitted = self.batch_size = self.k_policy = 0
        self.draft_s = self.verify_s = 0.0

    def add(self, record, row, end: int) -> None:
        self.end = end
        self.rounds += 1
        self.emitted += row.emitted
        self.batch_size = max(self.batch_size, record.batch_size)
        self.k_policy = record.k
        self.draft_s += record.draft_seconds
        self.verify_s += record.verify_seconds

    def attributes(self) -> dict:
        return {"spec.round.index": self.first_index, "spec.rounds": self.rounds,
                "spec.batch_size": self.batch_size, "spec.k_policy": self.k_policy,
                "spec.k_proposed": 0, "spec.accepted": 0, "spec.bonus": False,
                "spec.emitted": self.emitted, "spec.draft_ms": self.draft_s * 1e3,
                "spec.verify_ms": self.verify_s * 1e3}
