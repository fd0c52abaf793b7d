"""A live /metrics target for the Prometheus tests until ``spectest serve`` can be the target.

This module owns a small simulated engine: a background thread that runs speculative *rounds*
(K drafts per row, a per-token acceptance probability per drafter and workload, so acceptance
decays with draft position as it does in a real engine) and finishes requests with plausible
latencies, and records all of it in real prometheus_client collectors for **every metric of
``names.ALL``** (spectest flavour) and for the documented ``vllm:`` counterparts with vLLM's
labels (vLLM flavour).  Each flavour has its own registry served on 127.0.0.1.  It is test
scaffolding, not an engine: it knows the metric table and nothing about HTTP inference.

/metrics always answers in the classic text format (0.0.4).  prometheus_client 0.26's OpenMetrics
output, which Prometheus 2.x negotiates by default, rewrites the colon of ``spectest:`` /
``vllm:`` sample names to ``_`` while keeping it in HELP/TYPE (prometheus/client_python#1177), so
every dashboard query would come back empty; ``spectest serve`` must do the same.

One deployment is deliberately unhealthy: the ``ngram`` drafter accepts ~14% of its drafts, so the
acceptance alert has something to catch.
"""

from __future__ import annotations

import random
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4

from dashboards.flavours import Flavour
from spectest.telemetry import names
from spectest.telemetry.names import MetricSpec

MODEL = "tiny-target"


@dataclass(frozen=True)
class Drafter:
    name: str
    k: int
    alpha: dict[str, float]  # per-token acceptance probability by workload
    draft_seconds: float  # mean draft time per round


DRAFTERS = (
    Drafter("draft-model", 4, {"chat": 0.86, "code": 0.92, "rag": 0.9}, 0.002),
    Drafter("ngram", 3, {"chat": 0.3, "code": 0.3, "rag": 0.3}, 0.0005),
)


class FlavourSink:
    """One flavour's collectors in its own registry; maps spectest labels onto its own."""

    def __init__(self, flavour: Flavour):
        self.flavour = flavour
        self.registry = CollectorRegistry()
        self.collectors = {}
        for spec in names.ALL:
            if not flavour.has(spec):
                continue
            kind = {"counter": Counter, "gauge": Gauge, "histogram": Histogram}[spec.kind]
            extra = {"buckets": spec.buckets} if spec.kind == "histogram" else {}
            self.collectors[spec.name] = kind(names.renamed(spec, flavour.prefix), spec.help,
                                              flavour.labels_of(spec), registry=self.registry,
                                              **extra)

    def _child(self, spec: MetricSpec, labels: dict[str, str]):
        wanted = self.flavour.labels_of(spec)
        values = {**labels, "engine": "0"}
        return self.collectors[spec.name].labels(**{k: str(values[k]) for k in wanted})

    def record(self, spec: MetricSpec, method: str, value: float, **labels: str) -> None:
        if spec.name in self.collectors:
            getattr(self._child(spec, labels), method)(value)


def serve_text_format(registry: CollectorRegistry) -> ThreadingHTTPServer:
    """Serve ``registry`` on 127.0.0.1 (a free port) in text format 0.0.4, whatever the Accept."""
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            body = generate_latest(registry)
            self.send_response(200)
            self.send_header("Content-Type", CONTENT_TYPE_PLAIN_0_0_4)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):  # keep test output clean
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="metrics-http", daemon=True).start()
    return server


class SyntheticExporter:
    """Simulated traffic recorded into one registry per flavour, each served over HTTP."""

    def __init__(self, flavours: tuple[Flavour, ...], tick_seconds: float = 0.1, seed: int = 1):
        self.sinks = [FlavourSink(f) for f in flavours]
        self.tick_seconds = tick_seconds
        self.rng = random.Random(seed)
        self.urls: dict[str, str] = {}
        self._servers = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="synthetic-engine", daemon=True)
        self.ticks = 0

    # -- recording helpers ------------------------------------------------------------------
    def _rec(self, spec: MetricSpec, method: str, value: float, **labels) -> None:
        for sink in self.sinks:
            sink.record(spec, method, value, **labels)

    def _round(self, drafter: Drafter) -> None:
        rng, eng = self.rng, {"model_name": MODEL, "drafter": drafter.name}
        batch = [rng.choice(("chat", "code", "rag")) for _ in range(rng.randint(2, 6))]
        for workload in batch:
            req = {**eng, "workload": workload}
            accepted = 0
            while accepted < drafter.k and rng.random() < drafter.alpha[workload]:
                accepted += 1
            self._rec(names.SPEC_NUM_DRAFTS, "inc", 1, **req)
            self._rec(names.SPEC_NUM_DRAFT_TOKENS, "inc", drafter.k, **req)
            self._rec(names.SPEC_NUM_ACCEPTED_TOKENS, "inc", accepted, **req)
            for pos in range(drafter.k):  # every position exists, most accepted early
                self._rec(names.SPEC_NUM_ACCEPTED_PER_POS, "inc", int(pos < accepted),
                          position=str(pos), **req)
            self._rec(names.SPEC_ACCEPTED_LENGTH, "observe", accepted + 1, **req)
            self._rec(names.GENERATION_TOKENS, "inc", accepted + 1, **req)
            self._rec(names.ITL, "observe", rng.uniform(0.01, 0.05), **req)
        verify = 0.004 + 0.001 * len(batch) * (drafter.k + 1) * rng.uniform(0.8, 1.2)
        self._rec(names.SPEC_ROUNDS, "inc", 1, **eng)
        self._rec(names.SPEC_K, "set", drafter.k, **eng)
        self._rec(names.SPECULATION_ENABLED, "set", 1, **eng)
        self._rec(names.SPECULATION_K, "set", drafter.k, **eng)
        self._rec(names.SPEC_DRAFT_TIME, "observe", drafter.draft_seconds * rng.uniform(0.5, 2),
                  **eng)
        self._rec(names.SPEC_VERIFY_TIME, "observe", verify, **eng)
        # as if the draft ran in its own process (serve --draft-url): a network term per
        # round, and now and then a round that lost its drafts
        self._rec(names.SPEC_NETWORK_TIME, "observe", rng.uniform(0.001, 0.003), **eng)
        if rng.random() < 0.02:
            self._rec(names.SPEC_DRAFT_ERRORS, "inc", 1, **eng)
        self._rec(names.RUNNING, "set", len(batch), **eng)
        self._rec(names.WAITING, "set", rng.randint(0, 2), **eng)
        self._rec(names.KV_USAGE, "set", rng.uniform(0.2, 0.6), **eng)

    def _finish_request(self, drafter: Drafter) -> None:
        rng = self.rng
        eng = {"model_name": MODEL, "drafter": drafter.name}
        req = {**eng, "workload": rng.choice(("chat", "code", "rag"))}
        reason = rng.choices(("stop", "length", "abort", "error"), (90, 8, 1.7, 0.3))[0]
        queue, prefill = rng.uniform(0, 0.02), rng.uniform(0.01, 0.2)
        output_tokens = rng.randint(16, 256)
        tpot = rng.uniform(0.01, 0.06)
        decode = tpot * (output_tokens - 1)
        self._rec(names.TTFT, "observe", queue + prefill, **req)
        self._rec(names.TPOT, "observe", tpot, **req)
        self._rec(names.QUEUE, "observe", queue, **req)
        self._rec(names.PREFILL, "observe", prefill, **req)
        self._rec(names.DECODE, "observe", decode, **req)
        self._rec(names.E2E, "observe", queue + prefill + decode, **req)
        self._rec(names.PROMPT_TOKENS, "inc", rng.randint(32, 2048), **req)
        self._rec(names.REQUEST_SUCCESS, "inc", 1, finished_reason=reason, **req)
        self._rec(names.SPEC_REQUESTS, "inc", 1, speculative=str(rng.random() < 0.8).lower(),
                  **req)
        if rng.random() < 0.01:
            self._rec(names.REQUEST_ERRORS, "inc", 1,
                      code=rng.choice(("400", "429", "503")), **eng)
        if rng.random() < 0.01:
            self._rec(names.PREEMPTIONS, "inc", 1, **eng)

    def _prime(self) -> None:
        """Create every labelled series at once, so that none is missing from early scrapes."""
        for drafter in DRAFTERS:
            eng = {"model_name": MODEL, "drafter": drafter.name}
            for reason in names.FINISHED_REASONS:
                for workload in ("chat", "code", "rag"):
                    self._rec(names.REQUEST_SUCCESS, "inc", 0, finished_reason=reason,
                              workload=workload, **eng)
            for code in ("400", "429", "503"):
                self._rec(names.REQUEST_ERRORS, "inc", 0, code=code, **eng)
            self._rec(names.PREEMPTIONS, "inc", 0, **eng)
            self._rec(names.SPECULATION_SWITCHES, "inc", 0, **eng)
            self._rec(names.SPEC_DRAFT_ERRORS, "inc", 0, **eng)
            self._round(drafter)
            self._finish_request(drafter)

    def _run(self) -> None:
        while not self._stop.wait(self.tick_seconds):
            for drafter in DRAFTERS:
                self._round(drafter)
                for _ in range(self.rng.randint(0, 3)):
                    self._finish_request(drafter)
            self.ticks += 1

    # -- lifecycle --------------------------------------------------------------------------
    def start(self) -> "SyntheticExporter":
        self._prime()
        for sink in self.sinks:
            server = serve_text_format(sink.registry)
            self._servers.append(server)
            self.urls[sink.flavour.key] = f"http://127.0.0.1:{server.server_port}/metrics"
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)
        for server in self._servers:
            server.shutdown()
            server.server_close()

    def __enter__(self) -> "SyntheticExporter":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
