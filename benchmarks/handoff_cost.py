"""Benchmark: what it costs the engine to hand each round's output to another thread.

Why ``server.relay`` writes a stream's rounds from the engine thread instead of waking the
event loop once a round. The in-process engine (built as ``spectest serve`` builds it, one torch
thread) runs fixed-length greedy requests one at a time, both arms (speculation on: K drafts a
round; off: one token a round), while its per-output callback does one of:

* ``plain``       — nothing (the baseline);
* ``wake``        — ``call_soon_threadsafe`` of a no-op on an event loop running in another
  thread (uvloop when installed, as the server runs);
* ``wake+50us``   — the same, and the woken loop then runs 50 µs of Python (JSON encoding, about
  what a streamed chunk costs the loop with aiohttp);
* ``inline 50us`` — the same 50 µs of Python, on the engine thread itself;
* ``write``       — encode a chunk-sized JSON event and ``os.write`` it to a pipe that another
  process drains (``cat``; what the relay's direct path does, waking the client);
* ``tcp write``   — the same event, framed as an HTTP chunk, ``os.write`` to a loopback TCP
  connection (``TCP_NODELAY``, as aiohttp sets it) that another process reads: the least any
  server streaming one token a round to a client on this machine can pay — the floor under
  ``server_overhead.py``'s streamed ``http`` / ``engine`` ratio.

``--pin`` places this process on every core but the last and the readers on the last, as
``server_overhead.py`` places server and client.

Conditions alternate within each repeat; printed: tokens/s per condition (median over repeats)
and its ratio to ``plain`` in the same repeat (median [min, max]). On a machine where the two
threads land on different cores, the wake-up itself — the loop taking the GIL from the engine
thread across cores, and giving it back — is what costs, not the work.

    python benchmarks/handoff_cost.py [--models DIR] [--repeats 5] [--max-tokens 128] [--pin]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import torch

from overhead_modes import PROMPT, run_engine  # server_overhead's closed loop, prompt and settings
from spectest.engine.api import MODELS_DIR, build_engine
from spectest.engine.policies import make_policy

CONDITIONS = ("plain", "wake", "wake+50us", "inline 50us", "write", "tcp write")
EVENT = {"id": "cmpl-" + "0" * 32, "object": "text_completion", "created": 0, "model": "bench",
         "choices": [{"index": 0, "text": " return", "logprobs": None, "finish_reason": None}]}


def busy(microseconds: float) -> None:
    """``microseconds`` of Python work holding the GIL (JSON encoding, as a server does)."""
    end = time.perf_counter() + microseconds / 1e6
    while time.perf_counter() < end:
        json.dumps(EVENT)


def new_loop() -> asyncio.AbstractEventLoop:
    try:
        import uvloop
        return uvloop.new_event_loop()
    except ImportError:
        return asyncio.new_event_loop()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", type=Path,
                    default=Path(os.environ.get("SPECTEST_TEST_MODELS", MODELS_DIR)))
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--requests", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--pin", action=argparse.BooleanOptionalAction, default=False,
                    help="this process on all cores but the last, the readers on the last")
    args = ap.parse_args()
    cores = sorted(os.sched_getaffinity(0))
    reader_cpus = None
    if args.pin and len(cores) >= 2:
        os.sched_setaffinity(0, set(cores[:-1]))
        reader_cpus = {cores[-1]}
    torch.set_num_threads(1)
    engine = build_engine(args.models / "target", args.models / "draft", "draft-model",
                          make_policy("fixed", k=4), max_num_seqs=8)
    prompt_ids = tuple(engine.tokenizer.encode(PROMPT))
    engine.start()
    loop = new_loop()
    threading.Thread(target=loop.run_forever, daemon=True).start()
    pin_reader = (lambda: os.sched_setaffinity(0, reader_cpus)) if reader_cpus else None
    reader = subprocess.Popen(["cat"], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                              preexec_fn=pin_reader)
    listener = socket.create_server(("127.0.0.1", 0))
    tcp_reader = subprocess.Popen(  # reads until the connection closes
        [sys.executable, "-c", "import socket, sys\n"
         "c = socket.create_connection(('127.0.0.1', int(sys.argv[1])))\n"
         "while c.recv(65536): pass", str(listener.getsockname()[1])],
        preexec_fn=pin_reader)
    tcp, _ = listener.accept()
    tcp.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sse = b"data: " + json.dumps(EVENT).encode() + b"\n\n"
    chunk = b"%x\r\n%s\r\n" % (len(sse), sse)
    actions = {
        "plain": lambda: None,
        "wake": lambda: loop.call_soon_threadsafe(lambda: None),
        "wake+50us": lambda: loop.call_soon_threadsafe(busy, 50),
        "inline 50us": lambda: busy(50),
        "write": lambda: os.write(reader.stdin.fileno(), b"data: " + json.dumps(EVENT).encode()),
        "tcp write": lambda: os.write(tcp.fileno(), chunk),
    }

    def run(condition: str, speculative: bool) -> float:
        tokens, seconds = run_engine(engine, 1, args.requests, prompt_ids, args.max_tokens,
                                     speculative=speculative, each_output=actions[condition])
        return tokens / seconds

    try:
        for arm in ("off", "spec"):
            run("plain", arm == "spec")  # warm-up
            rates = {c: [] for c in CONDITIONS}
            for r in range(args.repeats):
                order = CONDITIONS[r % len(CONDITIONS):] + CONDITIONS[:r % len(CONDITIONS)]
                for condition in order:
                    rates[condition].append(run(condition, arm == "spec"))
            print(f"\narm {arm} ({args.repeats} repeats, {args.requests} x {args.max_tokens} "
                  "tokens each)")
            for condition in CONDITIONS:
                ratios = [x / b for x, b in zip(rates[condition], rates["plain"])]
                print(f"  {condition:12s} {statistics.median(rates[condition]):8.1f} tok/s  "
                      f"vs plain {statistics.median(ratios):.3f} "
                      f"[{min(ratios):.3f}, {max(ratios):.3f}]", flush=True)
    finally:
        engine.stop()
        loop.call_soon_threadsafe(loop.stop)
        reader.stdin.close()
        reader.wait()
        tcp.close()
        listener.close()
        tcp_reader.wait()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
