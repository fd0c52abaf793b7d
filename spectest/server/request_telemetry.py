"""One request's telemetry — its Prometheus series and its server span — behind a few calls.

Owns: :class:`Telemetry` (one per server: the serving metrics, the tracer and round tracer,
the drafter's name, whether spans carry the prompt) and :class:`RequestTelemetry` (one per
request), which the handler drives:

* ``Telemetry.start`` — the request's ``SERVER`` span (W3C trace context from the headers;
  registered with the round tracer, whose round spans become its children), or none;
* ``token`` — on the engine thread, as each output with tokens leaves it: the gap since the
  previous one (the inter-token latency histogram);
* ``finish`` — the engine's last output: time to first token, tokens, latencies and the finish
  reason (whether the client is still there or not);
* ``refused`` — the engine would not take the request: the span ends with the error;
* ``end`` — the response is over: the span gets the usage and speculation figures and ends,
  an error if the client went away (no output) or the engine failed.

Does not know: routes, response formats, the engine. It reads the request's body model and
its :class:`GenerationRequest` for span attributes only.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass

from opentelemetry.propagate import extract
from opentelemetry.trace import Span, SpanKind, Status, StatusCode, Tracer

from spectest.engine.requests import GenerationRequest, RequestOutput
from spectest.telemetry import tracing as T
from spectest.telemetry.metrics import ServingMetrics


@dataclass(frozen=True)
class Telemetry:
    metrics: ServingMetrics
    tracer: Tracer | None  # None: no tracing
    round_tracer: T.RoundTracer | None
    drafter: str
    trace_content: bool = False  # spans carry the prompt / messages

    def start(self, request, body, gen: GenerationRequest, operation: str) -> RequestTelemetry:
        return RequestTelemetry(self, gen, self._span(request, body, gen, operation))

    def _span(self, request, body, gen: GenerationRequest, operation: str) -> Span | None:
        if self.tracer is None:
            return None
        attrs = {T.OPERATION: operation, T.REQUEST_MODEL: body.model,
                 T.TEMPERATURE: body.temperature, T.TOP_P: body.top_p, T.TOP_K: body.top_k,
                 T.MAX_TOKENS: gen.params.max_tokens, T.RESPONSE_ID: gen.request_id,
                 "spectest.speculative": gen.speculative, "spectest.workload": gen.tag,
                 "spectest.drafter": self.drafter, "server.port": request.url.port or 0}
        if body.seed is not None:
            attrs[T.SEED] = body.seed
        if self.trace_content:
            attrs["gen_ai.input.messages"] = json.dumps(
                body.chat_messages() if operation == "chat" else body.prompt_value())
        span = self.tracer.start_span(f"{operation} {body.model}", kind=SpanKind.SERVER,
                                      context=extract(request.headers), attributes=attrs)
        self.round_tracer.register(gen.request_id, span)
        return span


class RequestTelemetry:
    """One request's metrics and span (see the module docstring for the calls)."""

    def __init__(self, telemetry: Telemetry, gen: GenerationRequest, span: Span | None):
        self.telemetry, self.gen, self.span = telemetry, gen, span
        self._last_token_at: float | None = None

    def token(self, out: RequestOutput) -> None:  # on the engine thread
        if out.token_ids:
            now = time.perf_counter()
            if self._last_token_at is not None:
                self.telemetry.metrics.observe_token_gap(self.gen.tag, now - self._last_token_at)
            self._last_token_at = now

    def finish(self, out: RequestOutput) -> None:
        if out.stats is None:
            return
        metrics = self.telemetry.metrics
        if out.stats.completion_tokens:
            metrics.observe_first_token(self.gen.tag, out.stats.ttft)
        metrics.observe_request(self.gen.tag, out.stats, out.finish_reason or "error")

    def refused(self, error: str) -> None:
        self.end(None, error)

    def end(self, out: RequestOutput | None, error: str | None = None) -> None:
        span = self.span
        if span is None:
            return
        if self.telemetry.round_tracer is not None:
            self.telemetry.round_tracer.unregister(self.gen.request_id)
        if out is not None and out.stats is not None:
            span.set_attribute(T.INPUT_TOKENS, out.stats.prompt_tokens)
            span.set_attribute(T.OUTPUT_TOKENS, out.stats.completion_tokens)
            span.set_attribute(T.FINISH_REASONS, [out.finish_reason or "error"])
            span.set_attribute("spectest.spec.drafts", out.stats.drafts)
            span.set_attribute("spectest.spec.draft_tokens", out.stats.draft_tokens)
            span.set_attribute("spectest.spec.accepted_tokens", out.stats.accepted_tokens)
        elif out is None:
            error = error or "client disconnected"
        if error or (out is not None and out.error):
            span.set_status(Status(StatusCode.ERROR, error or out.error))
        span.end()
