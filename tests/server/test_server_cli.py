"""``spectest serve`` as users run it: a subprocess, its start-up line, flags and signals.

Proves: the start-up line names a URL that answers; ``--api-key``, ``--served-model-name`` and
``--trace-file`` take effect; a port already in use, a missing checkpoint and a fault flag
without its confirmation each end in one readable line and a non-zero exit, no traceback; a
confirmed fault flag serves but says so loudly; SIGTERM and SIGINT let an in-flight stream
finish, and a stream that outlasts ``--drain-seconds`` ends with an error event — nothing hangs;
``OTEL_TRACES_EXPORTER=otlp`` sends the request and round spans to an OTLP/HTTP collector.
"""

from __future__ import annotations

import gzip
import json
import signal
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import requests
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from prometheus_client.parser import text_string_to_metric_families

from live_server import ServeProcess, models_dir, run_cli, sse_events
from spectest.server.serve import default_threads
from spectest.telemetry import names

KEY = "cli-key"
AUTH = {"Authorization": f"Bearer {KEY}"}


def one_line_error(proc) -> str:
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, proc.stderr
    return lines[0]


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    trace = tmp_path_factory.mktemp("cli") / "spans.jsonl"
    with ServeProcess("--api-key", KEY, "--served-model-name", "cli-test",
                      "--trace-file", str(trace)) as proc:
        yield proc, trace


def test_startup_line_names_a_working_url(served):
    proc, _ = served
    line = proc.output.splitlines()[0]
    assert line.startswith("spectest serving 'cli-test' (drafter draft-model, K policy fixed, ")
    # ServeProcess passes --threads 1; no --max-model-len: the model's own context
    assert ("1 torch thread(s), uvloop event loop, max model len 4096 (the model's context))"
            in line)
    assert proc.url.startswith("http://127.0.0.1:")
    assert requests.get(proc.url + "/health", timeout=10).json() == {"status": "ok"}
    models = requests.get(proc.url + "/v1/models", headers=AUTH, timeout=10).json()
    assert [m["id"] for m in models["data"]] == ["cli-test"]
    assert models["data"][0]["max_model_len"] == 4096
    assert requests.get(proc.url + "/v1/models", timeout=10).status_code == 401


@pytest.mark.parametrize("cores, threads", [(1, 1), (2, 1), (4, 3), (16, 15)])
def test_default_threads_leave_the_event_loop_a_core(cores, threads):
    assert default_threads(cores) == threads


def test_without_threads_the_start_up_line_says_the_default():
    with ServeProcess(threads=None) as proc:
        line = proc.output.splitlines()[0]
    assert (f"{default_threads()} torch thread(s) (default: usable cores − 1, the event loop "
            "gets the other; --threads N)") in line


def test_metrics_are_the_name_table_without_created_series(served):
    proc, _ = served
    text = requests.get(proc.url + "/metrics", timeout=10).text
    exposed = {f.name for f in text_string_to_metric_families(text)
               if f.name.startswith(names.PREFIX)}
    assert exposed == {spec.name for spec in names.ALL}
    assert "_created" not in text


def test_trace_file_gets_spans(served):
    proc, trace = served
    resp = requests.post(proc.url + "/v1/completions", headers=AUTH, timeout=60,
                         json={"model": "cli-test", "prompt": "hi", "max_tokens": 4})
    assert resp.status_code == 200
    deadline = time.monotonic() + 10  # the batch processor flushes every 0.5 s
    while time.monotonic() < deadline:
        spans = [json.loads(line) for line in trace.read_text().splitlines()] \
            if trace.exists() else []
        if {"text_completion cli-test", "spec.round"} <= {s["name"] for s in spans}:
            break  # round spans are built off the engine thread: maybe a batch later
        time.sleep(0.2)
    names = {s["name"] for s in spans}
    assert {"text_completion cli-test", "spec.round"} <= names


def test_port_in_use_is_one_line(served):
    proc, _ = served
    port = proc.url.rsplit(":", 1)[1]
    root = models_dir()
    done = run_cli("--port", port, "--model", str(root / "target"), "--draft",
                   str(root / "draft"), "--threads", "1")
    assert "cannot listen" in one_line_error(done)


def test_missing_checkpoint_is_one_line(tmp_path):
    done = run_cli("--model", str(tmp_path / "nope"), "--drafter", "none")
    assert str(tmp_path / "nope") in one_line_error(done)


def test_fault_flag_needs_confirmation():
    done = run_cli("--inject-fault", "kv-rewind-off-by-one")
    assert "--i-understand-faults-break-correctness" in one_line_error(done)


def test_confirmed_fault_serves_with_a_loud_warning():
    with ServeProcess("--inject-fault", "lossy-threshold",
                      "--i-understand-faults-break-correctness") as proc:
        resp = requests.post(proc.url + "/v1/completions", timeout=60,
                             json={"model": "target", "prompt": "hi", "max_tokens": 4})
        assert resp.status_code == 200
        assert "FAULT INJECTION ENABLED" in proc.output and "lossy-threshold" in proc.output


def stream_in_background(url: str, max_tokens: int, n: int = 1):
    """Start n streams; return (threads, results) — each result is its list of SSE events."""
    results: list[list] = []
    started = threading.Barrier(n + 1)

    def run():
        with requests.post(url + "/v1/completions", stream=True, timeout=60, json={
                "model": "target", "prompt": "one two", "max_tokens": max_tokens,
                "ignore_eos": True, "stream": True, "speculative": False}) as resp:
            started.wait(30)
            results.append(sse_events(resp))

    threads = [threading.Thread(target=run) for _ in range(n)]
    for t in threads:
        t.start()
    started.wait(30)  # every stream has its response headers
    return threads, results


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_signal_lets_in_flight_stream_finish(sig):
    with ServeProcess("--drain-seconds", "20") as proc:
        threads, results = stream_in_background(proc.url, 600)
        assert not results  # still streaming when the signal arrives
        t0 = time.monotonic()
        assert proc.signal_and_wait(sig, 30) == 0
        for t in threads:
            t.join(30)
        events = results[0]
        assert events[-1] == "[DONE]"
        finals = [c for e in events[:-1] for c in e["choices"] if c["finish_reason"]]
        assert [c["finish_reason"] for c in finals] == ["length"]
        assert "spectest: stopped" in proc.output
        assert time.monotonic() - t0 < 20
        with pytest.raises(requests.ConnectionError):
            requests.get(proc.url + "/health", timeout=5)


def test_stream_outlasting_the_drain_ends_with_an_error_event():
    with ServeProcess("--drain-seconds", "0.3", "--max-model-len", "1024") as proc:
        threads, results = stream_in_background(proc.url, 1000, n=4)
        t0 = time.monotonic()
        assert proc.signal_and_wait(signal.SIGTERM, 30) == 0
        for t in threads:
            t.join(30)
        assert time.monotonic() - t0 < 10
        assert len(results) == 4
        for events in results:
            assert events[-1] == "[DONE]"
            assert "error" in events[-2], events[-2]
            assert "shutting down" in events[-2]["error"]["message"]


class Collector(ThreadingHTTPServer):
    """An OTLP/HTTP trace receiver on 127.0.0.1: decodes each protobuf export request."""

    def __init__(self):
        self.spans: list = []
        super().__init__(("127.0.0.1", 0), self.Handler)

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            body = self.rfile.read(int(self.headers["Content-Length"]))
            if self.headers.get("Content-Encoding") == "gzip":
                body = gzip.decompress(body)
            request = ExportTraceServiceRequest.FromString(body)
            for resource_spans in request.resource_spans:
                for scope_spans in resource_spans.scope_spans:
                    self.server.spans.extend(scope_spans.spans)
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args):
            pass


def test_otel_env_exports_otlp_to_a_collector():
    collector = Collector()
    thread = threading.Thread(target=collector.serve_forever, daemon=True)
    thread.start()
    try:
        env = {"OTEL_TRACES_EXPORTER": "otlp", "OTEL_SERVICE_NAME": "spectest-otlp-test",
               "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{collector.server_port}"}
        with ServeProcess(env=env) as proc:
            resp = requests.post(proc.url + "/v1/completions", timeout=60,
                                 json={"model": "target", "prompt": "hi", "max_tokens": 6})
            assert resp.status_code == 200
            rid = resp.json()["id"]

            def received():
                return [s for s in collector.spans if any(
                    a.key == "gen_ai.response.id" and a.value.string_value == rid
                    for a in s.attributes)]
            deadline = time.monotonic() + 15
            while not received() and time.monotonic() < deadline:
                time.sleep(0.2)
        root = received()
        assert len(root) == 1 and root[0].name == "text_completion target"
        rounds = [s for s in collector.spans if s.name == "spec.round"
                  and s.parent_span_id == root[0].span_id]
        assert rounds and all(s.trace_id == root[0].trace_id for s in rounds)
    finally:
        collector.shutdown()
        collector.server_close()
