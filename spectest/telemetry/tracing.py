"""OpenTelemetry traces: a server span per request and a span per speculation round under it.

Owns: building a ``TracerProvider`` from the standard ``OTEL_*`` environment variables
(``OTEL_TRACES_EXPORTER=otlp|console|none``, default none; OTLP over HTTP reads
``OTEL_EXPORTER_OTLP_ENDPOINT`` itself) plus an optional JSON-lines file exporter for users
without a collector; :class:`RoundTracer`, the engine observer that turns each
:class:`~spectest.engine.requests.RoundRecord` into ``spec.round`` spans (with ``spec.draft``,
``spec.network`` — a disaggregated drafter's transport time — and ``spec.verify`` children)
under the spans of the requests that took part.

Does not know: HTTP routing or Prometheus. No global provider is installed: the server passes
the provider in, and a ``None`` provider means tracing is off at zero cost.
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Sequence

from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import (BatchSpanProcessor, ConsoleSpanExporter,
                                            SpanExporter, SpanExportResult)
from opentelemetry.sdk.util import ns_to_iso_str
from opentelemetry.trace import Span, SpanKind, set_span_in_context

# GenAI semantic-convention attribute names (shared/REFERENCE.md).
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


def span_record(span: ReadableSpan, resource: dict) -> dict:
    """The fields of ``ReadableSpan.to_json()``, built directly: the SDK's version indents,
    and re-serializes the resource for every span, several times slower — and the exporter
    competes with the engine thread for the GIL."""
    status = {"status_code": span.status.status_code.name}
    if span.status.description:
        status["description"] = span.status.description
    return {
        "name": span.name,
        "context": _context(span.context) if span.context else None,
        "kind": str(span.kind),
        "parent_id": f"0x{span.parent.span_id:016x}" if span.parent else None,
        "start_time": ns_to_iso_str(span.start_time) if span.start_time else None,
        "end_time": ns_to_iso_str(span.end_time) if span.end_time else None,
        "status": status,
        "attributes": dict(span.attributes or {}),
        "events": [{"name": e.name, "timestamp": ns_to_iso_str(e.timestamp),
                    "attributes": dict(e.attributes or {})} for e in span.events],
        "links": [{"context": _context(link.context), "attributes": dict(link.attributes or {})}
                  for link in span.links],
        "resource": resource,
    }


class JsonLinesExporter(SpanExporter):
    """One JSON object per finished span (``ReadableSpan.to_json``'s fields, on one line),
    appended to a file (flushed per batch)."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._file = open(self.path, "a", encoding="utf-8")
        self._resource: tuple[object, dict] = (None, {})  # one provider → one Resource

    def _resource_of(self, span: ReadableSpan) -> dict:
        if self._resource[0] is not span.resource:
            self._resource = (span.resource, json.loads(span.resource.to_json()))
        return self._resource[1]

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        lines = [json.dumps(span_record(span, self._resource_of(span)), separators=(",", ":"),
                            default=str) for span in spans]
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
    """Engine observer: per request in a round, ``spec.round`` → ``spec.draft``/``spec.verify``.

    The server registers each request's span (``register``) before submitting it and retires
    it (``unregister``) when the request ends; rows whose request has no span are skipped.
    A request's last tokens reach the server *before* the engine calls its observers for that
    round, so ``unregister`` only marks the span: it is dropped after the next round record
    has been traced, and the request's last round still gets its span.
    """

    def __init__(self, provider: TracerProvider):
        self.tracer = provider.get_tracer("spectest.engine")
        self._spans: dict[str, Context] = {}
        self._retired: set[str] = set()
        self._lock = threading.Lock()

    def register(self, request_id: str, span: Span) -> None:
        if not span.is_recording():  # sampled out (OTEL_TRACES_SAMPLER): no round spans
            return
        with self._lock:
            self._spans[request_id] = set_span_in_context(span)

    def unregister(self, request_id: str) -> None:
        with self._lock:
            if request_id in self._spans:
                self._retired.add(request_id)

    def __call__(self, record) -> None:
        with self._lock:
            retired, self._retired = self._retired, set()
            parents = {row.request_id: self._spans.get(row.request_id) for row in record.rows}
        try:
            self._trace(record, parents)
        finally:
            with self._lock:
                for request_id in retired:
                    self._spans.pop(request_id, None)

    def _trace(self, record, parents: dict[str, Context | None]) -> None:
        start = _ns(record.started_at)
        draft_end = start + _ns(record.draft_seconds)
        model_end = draft_end - _ns(record.network_seconds)  # the draft model's own part
        end = draft_end + _ns(record.verify_seconds)
        for row in record.rows:
            parent = parents[row.request_id]
            if parent is None:
                continue
            span = self.tracer.start_span("spec.round", context=parent, start_time=start,
                                          kind=SpanKind.INTERNAL, attributes={
                                              "spec.round.index": record.index,
                                              "spec.k_proposed": row.k_proposed,
                                              "spec.accepted": row.accepted,
                                              "spec.bonus": row.bonus,
                                              "spec.emitted": row.emitted,
                                              "spec.batch_size": record.batch_size,
                                              "spec.k_policy": record.k,
                                              "spec.policy_decision": record.decision,
                                              "spec.drafter": record.drafter,
                                              "spec.draft_ms": record.draft_seconds * 1e3,
                                              "spec.network_ms": record.network_seconds * 1e3,
                                              "spec.verify_ms": record.verify_seconds * 1e3})
            if record.draft_error is not None:
                span.set_attribute("spec.draft_error", record.draft_error)
            ctx = set_span_in_context(span)
            if row.k_proposed:
                self.tracer.start_span("spec.draft", context=ctx, start_time=start).end(model_end)
            if record.network_seconds > 0:  # a drafter in another process: the network term
                self.tracer.start_span("spec.network", context=ctx,
                                       start_time=model_end).end(draft_end)
            self.tracer.start_span("spec.verify", context=ctx,
                                   start_time=draft_end).end(end)
            span.end(end)
