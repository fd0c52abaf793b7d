"""The processes ``benchmarks/server_overhead.py`` measures — that script run again with its
hidden ``--serve`` flag — and the closed loop that drives the in-process engine.

Owns the prompt and served model name every mode uses; :func:`serve_engine` (``--serve
engine``: the engine built as ``spectest serve`` builds it, running :func:`run_engine`'s closed
loop for each ``concurrency requests accounting speculative`` line on stdin and answering a
JSON line); :class:`Accounting` (the server's telemetry wired to that engine, with the thread
CPU time of each part); and :func:`serve` (``--serve on|off``: ``spectest serve``'s server with
telemetry on, or off through :class:`NullMetrics`). Knows nothing of the HTTP client, of how
the modes are scheduled, timed against each other and summarized, or of the targets.
``benchmarks/handoff_cost.py`` reuses :func:`run_engine` and the prompt.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path

import torch
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from prometheus_client import CollectorRegistry

from spectest.engine.api import build_engine
from spectest.engine.policies import make_policy
from spectest.engine.requests import GenerationRequest
from spectest.engine.sampling import SamplingParams
from spectest.loops import run_loop
from spectest.telemetry.metrics import ServingMetrics
from spectest.telemetry.tracing import JsonLinesExporter, RoundTracer

NAME = "bench"
PROMPT = "def fibonacci(n):\n    "


class NullMetrics:
    """Telemetry off: every metric call of the server does nothing (the collectors stay
    registered and never move); only the bounded workload mapping is kept."""

    def __init__(self, real):
        self.workload_of = real.workload_of

    def __getattr__(self, name):
        return lambda *args, **kwargs: None


class Accounting:
    """Telemetry wired to the in-process engine the way ``Server`` wires it, with the thread
    CPU time of each part summed in ``spent`` — where the telemetry time goes."""

    PARTS = ("metrics per round", "spans per round", "spans (worker thread)", "span export",
             "per request")
    ENGINE_THREAD = ("metrics per round", "spans per round", "per request")  # in the round

    def __init__(self, engine, trace_file: Path):
        self.spent = dict.fromkeys(self.PARTS, 0.0)
        self.metrics = ServingMetrics(CollectorRegistry(), NAME, engine.drafter.name)
        exporter = JsonLinesExporter(trace_file)
        exporter.export = self.timed("span export", exporter.export)
        self.provider = TracerProvider()
        self.provider.add_span_processor(BatchSpanProcessor(exporter, schedule_delay_millis=500))
        self.rounds = RoundTracer(self.provider, background=True)  # as the server runs it
        self.rounds._trace = self.timed("spans (worker thread)", self.rounds._trace)
        self.tracer = self.provider.get_tracer("bench")
        self.observers = [self.timed("metrics per round", self.metrics.observe_round),
                          self.timed("spans per round", self.rounds)]
        self.submitted = self.timed("per request", self._submitted)
        self.finished = self.timed("per request", self._finished)
        self.spans: dict[str, object] = {}

    def timed(self, part: str, fn):
        def wrapper(*args):
            t0 = time.thread_time()
            try:
                return fn(*args)
            finally:
                self.spent[part] += time.thread_time() - t0
        return wrapper

    def _submitted(self, rid: str) -> None:
        self.spans[rid] = self.tracer.start_span(f"text_completion {NAME}")
        self.rounds.register(rid, self.spans[rid])

    def _finished(self, rid: str, out) -> None:
        self.metrics.observe_request("none", out.stats, out.finish_reason)
        self.rounds.unregister(rid)
        self.spans.pop(rid).end()


def run_engine(engine, concurrency: int, n: int, prompt_ids: tuple[int, ...],
               max_tokens: int, acct: Accounting | None = None,
               speculative: bool = True, each_output=None) -> tuple[int, float]:
    """Closed loop in-process: keep ``concurrency`` requests in flight until n are done;
    ``each_output()`` runs on the engine thread for every output."""
    lock, all_done = threading.Lock(), threading.Event()
    state = {"next": 0, "finished": 0, "tokens": 0}
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)

    def submit() -> None:
        with lock:
            if state["next"] >= n:
                return
            i = state["next"]
            state["next"] += 1
        rid = f"bench-{time.monotonic_ns()}-{i}"
        if acct:
            acct.submitted(rid)
        engine.submit(GenerationRequest(rid, prompt_ids, params, speculative=speculative),
                      on_output)

    def on_output(out) -> None:  # on the engine thread
        if each_output is not None:
            each_output()
        if acct and out.finished:
            acct.finished(out.request_id, out)
        with lock:
            state["tokens"] += len(out.token_ids)
            if out.finished:
                state["finished"] += 1
                if out.finish_reason != "length":
                    raise RuntimeError(f"unexpected finish {out.finish_reason}: {out.error}")
                if state["finished"] == n:
                    all_done.set()
        if out.finished:
            submit()

    t0 = time.perf_counter()
    for _ in range(concurrency):
        submit()
    if not all_done.wait(600):
        raise RuntimeError("the in-process run did not finish")
    return state["tokens"], time.perf_counter() - t0


def serve_engine(args) -> None:
    """The baseline process: build the engine like ``spectest serve`` does, then run closed
    loops on command (a ``concurrency requests accounting`` line on stdin → a JSON line out;
    with accounting, the server's telemetry is attached and its CPU time reported by part)."""
    torch.set_num_threads(args.threads)
    engine = build_engine(args.models / "target", args.models / "draft", "draft-model",
                          make_policy("fixed", k=args.k), max_num_seqs=max(args.concurrency),
                          max_model_len=args.max_model_len, device=args.device)
    prompt_ids = tuple(engine.tokenizer.encode(PROMPT))
    acct = Accounting(engine, args.trace_file)
    engine.start()
    print("engine ready at in-process", flush=True)
    try:
        for line in sys.stdin:
            c, n, accounting, speculative = map(int, line.split())
            engine.observers[:] = acct.observers if accounting else []
            acct.spent = dict.fromkeys(acct.PARTS, 0.0)
            rounds, cpu = engine.rounds, time.process_time()
            tokens, seconds = run_engine(engine, c, n, prompt_ids, args.max_tokens,
                                         acct if accounting else None, bool(speculative))
            acct.rounds.flush()
            acct.provider.force_flush()
            print(json.dumps({"tokens": tokens, "seconds": seconds, "spent": acct.spent,
                              "rounds": engine.rounds - rounds,
                              "cpu": time.process_time() - cpu}), flush=True)
    finally:
        engine.stop()
        acct.rounds.shutdown()
        acct.provider.shutdown()


def serve(args) -> None:
    from spectest.server import serve as cli
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    argv = ["--port", "0", "--model", str(args.models / "target"), "--draft",
            str(args.models / "draft"), "--threads", str(args.threads), "--k", str(args.k),
            "--max-num-seqs", str(max(args.concurrency)), "--max-model-len",
            str(args.max_model_len), "--served-model-name", NAME, "--device", args.device]
    if args.serve == "on":
        argv += ["--trace-file", str(args.trace_file)]
    server = cli.build_server(parser.parse_args(argv))
    if args.serve == "off":
        server.engine.observers.remove(server.metrics.observe_round)
        server.metrics = NullMetrics(server.metrics)
        server.telemetry = replace(server.telemetry, metrics=server.metrics)
        assert server.provider is None, "OTEL_TRACES_EXPORTER must be unset for telemetry off"
    run_loop(cli._run(server, "127.0.0.1", 0, f"telemetry {args.serve}"))
