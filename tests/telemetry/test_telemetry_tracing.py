"""``telemetry.tracing``: exporter choice from OTEL_* variables, the JSON-lines file exporter,
and the ``RoundTracer`` engine observer, fed synthetic round records.

Proves: tracing is off (``None``, zero cost) unless an exporter is asked for; unsupported
exporters are refused with a readable error; ``--trace-file`` writes one parseable JSON object
per span and appends across runs; a round becomes one ``spec.round`` span under the request's
span over the measured times, with draft, network and verify milliseconds as attributes; the
server's background mode gives the same spans after a flush and drops (and counts) the oldest
rounds when its queue is full; rows of
unregistered requests are skipped; and a request unregistered before its last round is traced
(the engine reports the round after the server has seen the request's last tokens) still gets
that round, while later rounds no longer attach to it; file records equal the SDK's own
``to_json`` output; requests whose trace is sampled out cost no round spans; round spans,
handed to the processors without ``start_span``, carry the request's trace, fresh span ids,
the provider's resource and the engine's scope, and encode for OTLP.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.util import ns_to_iso_str
from opentelemetry.trace import (NonRecordingSpan, SpanContext, SpanKind, Status, StatusCode,
                                 set_span_in_context)

from spectest.engine.requests import RoundRecord, RowRecord
from spectest.telemetry.tracing import (IsoTime, JsonLinesExporter, RoundTracer,
                                        build_tracer_provider)


def test_tracing_is_off_by_default():
    assert build_tracer_provider(environ={}) is None
    assert build_tracer_provider(environ={"OTEL_TRACES_EXPORTER": "none"}) is None
    assert build_tracer_provider(environ={"OTEL_TRACES_EXPORTER": "console",
                                          "OTEL_SDK_DISABLED": "true"}) is None


@pytest.mark.parametrize("choice", ["console", "otlp", "otlp_proto_http", " Console "])
def test_supported_exporters_build_a_provider(choice):
    provider = build_tracer_provider(environ={"OTEL_TRACES_EXPORTER": choice,
                                              "OTEL_SERVICE_NAME": "svc"})
    try:
        assert isinstance(provider, TracerProvider)
        assert provider.resource.attributes["service.name"] == "svc"
    finally:
        provider.shutdown()  # nothing was recorded: no export is attempted


def test_unsupported_exporter_is_refused_readably():
    with pytest.raises(ValueError, match="zipkin.*otlp, console, none"):
        build_tracer_provider(environ={"OTEL_TRACES_EXPORTER": "zipkin"})


def test_trace_file_gets_one_json_object_per_span_and_appends(tmp_path):
    path = tmp_path / "sub" / "spans.jsonl"
    for run in range(2):
        provider = build_tracer_provider("svc", path, environ={})
        tracer = provider.get_tracer("t")
        with tracer.start_as_current_span(f"outer {run}", kind=SpanKind.SERVER,
                                          attributes={"a": run}):
            tracer.start_span("inner").end()
        provider.shutdown()
    spans = [json.loads(line) for line in path.read_text().splitlines()]
    assert [s["name"] for s in spans] == ["inner", "outer 0", "inner", "outer 1"]
    assert spans[0]["parent_id"] == spans[1]["context"]["span_id"]
    assert spans[3]["attributes"] == {"a": 1} and spans[3]["kind"] == "SpanKind.SERVER"
    assert spans[3]["resource"]["attributes"]["service.name"] == "svc"


def test_json_lines_exporter_writes_complete_lines(tmp_path):
    exporter = JsonLinesExporter(tmp_path / "x.jsonl")
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    for i in range(3):
        provider.get_tracer("t").start_span(f"s{i}", attributes={"text": "a\nb"}).end()
    provider.shutdown()
    lines = (tmp_path / "x.jsonl").read_text().split("\n")
    assert lines[-1] == "" and [json.loads(x)["name"] for x in lines[:-1]] == ["s0", "s1", "s2"]


@pytest.fixture
def traced():
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield provider, exporter, RoundTracer(provider)
    provider.shutdown()


def record(rows, index=0, started=1000.0, draft=0.004, verify=0.010) -> RoundRecord:
    return RoundRecord(index, started, len(rows), 4, "fixed", draft, verify, tuple(rows),
                       "draft-model", len(rows), 0, 0.1)


def row(rid, k=4, accepted=2) -> RowRecord:
    return RowRecord(rid, "chat", k, accepted, k > 0 and accepted == k, accepted + 1, True)


def test_round_spans_hang_under_the_request_span(traced):
    provider, exporter, tracer = traced
    request = provider.get_tracer("server").start_span("chat m", kind=SpanKind.SERVER)
    tracer.register("a", request)
    tracer(record([row("a", 4, 4), row("not-traced", 4, 1)]))
    tracer(record([row("a", 0, 0)], index=1, started=1001.0))
    tracer.unregister("a")
    tracer(record([], index=2, started=1002.0))  # the next record retires it: its run closes
    request.end()
    spans = exporter.get_finished_spans()
    rounds = [s for s in spans if s.name.startswith("spec.")]
    assert len(rounds) == 2  # the unregistered request's row is skipped
    assert all(r.parent.span_id == request.context.span_id for r in rounds)
    first = rounds[0]
    assert first.attributes["spec.k_proposed"] == 4 and first.attributes["spec.accepted"] == 4
    assert first.attributes["spec.bonus"] is True and first.attributes["spec.batch_size"] == 2
    assert first.attributes["spec.draft_ms"] == pytest.approx(4.0)
    assert first.attributes["spec.verify_ms"] == pytest.approx(10.0)
    assert "spec.network_ms" not in first.attributes  # co-located: no network term
    assert first.start_time == 1000 * 10**9
    assert first.end_time - first.start_time == pytest.approx(14e6, abs=2)
    # one span per request per round: draft, network and verify are attributes, not children
    assert [s.name for s in spans if s.name != "chat m"] == ["spec.round", "spec.decode"]
    assert rounds[1].attributes["spec.k_proposed"] == 0 and rounds[1].attributes["spec.rounds"] == 1


def test_rounds_without_drafts_become_one_decode_span_per_run(traced):
    """A plain decode step per span would be a span per token (issue 13: telemetry ≤ 2 %)."""
    provider, exporter, tracer = traced
    request = provider.get_tracer("server").start_span("chat m", kind=SpanKind.SERVER)
    tracer.register("a", request)
    for i in range(5):  # five plain rounds, one round that drafts, two plain rounds
        tracer(record([row("a", 0, 0)], index=i, started=1000.0 + i))
    tracer(record([row("a", 4, 1)], index=5, started=1005.0))
    tracer(record([row("a", 0, 0)], index=6, started=1006.0))
    tracer(record([row("a", 0, 0)], index=7, started=1007.0))
    tracer.unregister("a")
    tracer(record([], index=8, started=1008.0))
    spans = [s for s in exporter.get_finished_spans() if s.name.startswith("spec.")]
    assert [s.name for s in spans] == ["spec.decode", "spec.round", "spec.decode"]
    first, _, last = spans
    assert first.attributes["spec.rounds"] == 5 and first.attributes["spec.emitted"] == 5
    assert first.attributes["spec.round.index"] == 0
    assert first.attributes["spec.verify_ms"] == pytest.approx(50.0)
    assert first.start_time == 1000 * 10**9 and first.end_time == 1004 * 10**9 + 14 * 10**6
    assert last.attributes["spec.rounds"] == 2 and last.attributes["spec.round.index"] == 6
    assert all(s.parent.span_id == request.context.span_id for s in spans)


def test_a_remote_drafters_network_term_and_failure_are_on_the_round_span(traced):
    provider, exporter, tracer = traced
    request = provider.get_tracer("server").start_span("chat m", kind=SpanKind.SERVER)
    tracer.register("a", request)
    rec = record([row("a")])
    tracer(replace(rec, network_seconds=0.0015))
    tracer(replace(rec, index=1, network_seconds=0.0004, draft_error="draft server down"))
    # a failed round drafted nothing, but it is a round worth its own span, not a plain one
    tracer(replace(rec, index=2, rows=(row("a", 0, 0),), draft_error="draft server down"))
    first, second, third = [s for s in exporter.get_finished_spans() if s.name == "spec.round"]
    assert first.attributes["spec.network_ms"] == pytest.approx(1.5)
    assert "spec.draft_error" not in first.attributes
    assert second.attributes["spec.draft_error"] == "draft server down"
    assert third.attributes["spec.draft_error"] == "draft server down"
    assert third.attributes["spec.k_proposed"] == 0


def test_in_the_background_the_same_spans_arrive_after_a_flush():
    """The server's mode: spans are built off the engine thread, from the recorded times."""
    spans = {}
    for background in (False, True):
        exporter = InMemorySpanExporter()
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        tracer = RoundTracer(provider, background=background)
        request = provider.get_tracer("server").start_span("chat m")
        tracer.register("a", request)
        for i in range(50):
            tracer(record([row("a", 4, i % 5)], index=i, started=1000.0 + i))
        tracer.unregister("a")
        tracer(record([row("a")], index=50, started=1050.0))  # the last round still counts
        tracer(record([row("a")], index=51, started=1051.0))  # a stray one does not
        assert tracer.flush(10)
        tracer.shutdown()
        spans[background] = [(s.attributes["spec.round.index"], s.start_time, s.end_time,
                              s.attributes["spec.accepted"], s.parent.span_id)
                             for s in exporter.get_finished_spans() if s.name == "spec.round"]
        provider.shutdown()
    assert len(spans[True]) == 51
    assert [x[:4] for x in spans[True]] == [x[:4] for x in spans[False]]


def test_a_full_queue_drops_the_oldest_rounds_and_counts_them():
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = RoundTracer(provider, background=True, max_pending=4)
    request = provider.get_tracer("server").start_span("chat m")
    tracer.register("a", request)
    release, real = threading.Event(), tracer._trace

    def slow(record, parents, retired):  # the worker is stuck on round 0 while 1–9 arrive
        release.wait(10)
        real(record, parents, retired)
    tracer._trace = slow
    tracer(record([row("a")], index=0))
    assert wait_for(lambda: tracer._busy)
    for i in range(1, 10):
        tracer(record([row("a")], index=i))
    release.set()
    assert tracer.flush(10)
    tracer.shutdown()
    traced_rounds = [s.attributes["spec.round.index"] for s in exporter.get_finished_spans()
                     if s.name == "spec.round"]
    assert tracer.dropped == 5 and traced_rounds == [0, 6, 7, 8, 9]


def wait_for(condition, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.005)
    return False


def test_last_round_is_traced_even_when_unregistered_first(traced):
    provider, exporter, tracer = traced
    request = provider.get_tracer("server").start_span("text_completion m")
    tracer.register("a", request)
    tracer.unregister("a")  # the server saw the last tokens before the engine's observer ran
    request.end()
    tracer(record([row("a")]))  # that last round
    tracer(record([row("a")], index=1))  # a stray later record must not attach any more
    tracer.unregister("never-registered")
    rounds = [s for s in exporter.get_finished_spans() if s.name == "spec.round"]
    assert [r.attributes["spec.round.index"] for r in rounds] == [0]
    assert tracer._spans == {} and not tracer._retired  # nothing kept


def test_file_records_have_exactly_the_sdk_json_fields(tmp_path):
    """The exporter builds records itself (fast); they must equal ``ReadableSpan.to_json()``."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("t")
    parent = tracer.start_span("parent", kind=SpanKind.SERVER, attributes={"x": [1, 2]})
    child = tracer.start_span("child", context=set_span_in_context(parent),
                              attributes={"s": "v", "b": True, "f": 0.5})
    child.add_event("evt", {"k": 1})
    child.set_status(Status(StatusCode.ERROR, "boom"))
    child.end()
    parent.end()
    spans = exporter.get_finished_spans()
    file = JsonLinesExporter(tmp_path / "x.jsonl")
    file.export(spans)
    file.shutdown()
    lines = (tmp_path / "x.jsonl").read_text().splitlines()
    assert [json.loads(line) for line in lines] == [json.loads(s.to_json()) for s in spans]


def test_sampled_out_requests_get_no_round_spans(traced):
    provider, exporter, tracer = traced
    sampled_out = NonRecordingSpan(SpanContext(0x1, 0x2, is_remote=False))
    tracer.register("a", sampled_out)
    tracer(record([row("a")]))
    assert exporter.get_finished_spans() == ()


@settings(max_examples=3000, deadline=None)
@given(st.one_of(
    st.integers(min_value=0, max_value=4_102_444_800 * 10**9),  # up to 2100
    # half a microsecond either side of a rounding edge, and the last instants of a second
    st.integers(min_value=1_700_000_000, max_value=1_900_000_000).flatmap(
        lambda sec: st.integers(min_value=-2_000, max_value=2_000).map(
            lambda d: sec * 10**9 + (999_999_500 if d % 2 else 500) + d))))
def test_iso_time_is_the_sdk_timestamp(ns):
    iso = IsoTime()
    assert iso(ns) == ns_to_iso_str(ns)
    assert iso(ns + 1_000) == ns_to_iso_str(ns + 1_000)  # the cached second, reused or not


def test_round_spans_are_whole_sdk_spans_for_any_exporter(traced):
    """Round spans skip ``start_span`` (a fifth of the cost): they must still be what an
    exporter expects — the request's trace, a fresh span id, the provider's resource, the
    engine's instrumentation scope — and encode for OTLP like any SDK span."""
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
    provider, exporter, tracer = traced
    request = provider.get_tracer("server").start_span("chat m", kind=SpanKind.SERVER)
    tracer.register("a", request)
    for i in range(3):
        tracer(record([row("a")], index=i))
    tracer(record([row("a", 0, 0)], index=3))
    tracer.unregister("a")
    tracer(record([], index=4))
    request.end()
    rounds = [s for s in exporter.get_finished_spans() if s.name.startswith("spec.")]
    assert [s.name for s in rounds] == ["spec.round"] * 3 + ["spec.decode"]
    ids = {s.context.span_id for s in rounds} | {request.context.span_id}
    assert len(ids) == 5 and 0 not in ids
    for span in rounds:
        assert span.context.trace_id == request.context.trace_id
        assert span.context.trace_flags == request.context.trace_flags
        assert span.parent.span_id == request.context.span_id
        assert span.resource is provider.resource
        assert span.instrumentation_scope.name == "spectest.engine"
        assert span.kind == SpanKind.INTERNAL and span.status.status_code == StatusCode.UNSET
    encoded = encode_spans(rounds)
    otlp = encoded.resource_spans[0].scope_spans[0]
    assert otlp.scope.name == "spectest.engine" and len(otlp.spans) == 4
    first = {a.key: a.value for a in otlp.spans[0].attributes}
    assert first["spec.accepted"].int_value == 2 and first["spec.bonus"].bool_value is False
