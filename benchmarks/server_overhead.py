"""Benchmark: what HTTP streaming and telemetry cost on top of the in-process engine.

Three ways to run the same fixed-length greedy generations (``ignore_eos``, same prompt, same
K, so every request takes the same rounds), each at concurrency 1 and 8, in one run:

* ``engine``         — the baseline: a :class:`SpecEngine` on its own thread, requests submitted
  in-process by a closed loop (a finished request submits the next one);
* ``http``           — ``spectest serve``'s server in a subprocess, streamed over HTTP on
  127.0.0.1 by an aiohttp client, telemetry off (no tracer provider; the metric observers are
  removed, so no collector moves);
* ``http+telemetry`` — the same server with Prometheus metrics and OpenTelemetry tracing to a
  JSON-lines file, as ``spectest serve --trace-file`` runs it.

Modes alternate within each repeat (the order rotates) so that drift on a busy machine hits
them alike; the figure is the median over repeats. Printed: tokens/s per mode and
concurrency, each ratio to the in-process baseline at the same concurrency, and telemetry on
vs off. Targets: ``http+telemetry`` ≥ 0.90 × ``engine`` at concurrency 1 (HTTP + telemetry cost
at most 10 %), and ``http+telemetry`` ≥ 0.97 × ``http`` (tracing + metrics cost at most 3 %).

    python benchmarks/server_overhead.py [--models DIR] [--max-tokens 128] [--requests 8]
        [--repeats 5] [--concurrency 1 8] [--out results.json] [--strict]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import aiohttp
import pandas as pd
import torch

from spectest.engine.api import MODELS_DIR, build_engine
from spectest.engine.policies import make_policy
from spectest.engine.requests import GenerationRequest
from spectest.engine.sampling import SamplingParams

NAME = "bench"
PROMPT = "def fibonacci(n):\n    "
MODES = ("engine", "http", "http+telemetry")
TARGET_HTTP = 0.90  # http+telemetry / engine at concurrency 1
TARGET_TELEMETRY = 0.97  # http+telemetry / http
START_LINE = re.compile(r"spectest serving .* at (http://[0-9.]+:\d+)")


# --- the server side (a subprocess running this file with --serve) ----------------------------
class NullMetrics:
    """Telemetry off: every metric call of the server does nothing (the collectors stay
    registered and never move); only the bounded workload mapping is kept."""

    def __init__(self, real):
        self.workload_of = real.workload_of

    def __getattr__(self, name):
        return lambda *args, **kwargs: None


def serve_engine(args) -> None:
    """The baseline process: build the engine like ``spectest serve`` does, then run closed
    loops on command (one ``concurrency requests`` line on stdin → one JSON line out)."""
    torch.set_num_threads(args.threads)
    engine = build_engine(args.models / "target", args.models / "draft", "draft-model",
                          make_policy("fixed", k=args.k), max_num_seqs=max(args.concurrency),
                          max_model_len=args.max_model_len)
    prompt_ids = tuple(engine.tokenizer.encode(PROMPT))
    engine.start()
    print("engine ready at in-process", flush=True)
    try:
        for line in sys.stdin:
            c, n = map(int, line.split())
            tokens, seconds = run_engine(engine, c, n, prompt_ids, args.max_tokens)
            print(json.dumps({"tokens": tokens, "seconds": seconds}), flush=True)
    finally:
        engine.stop()


def serve(args) -> None:
    from spectest.server import serve as cli
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    argv = ["--port", "0", "--model", str(args.models / "target"), "--draft",
            str(args.models / "draft"), "--threads", str(args.threads), "--k", str(args.k),
            "--max-num-seqs", str(max(args.concurrency)), "--max-model-len",
            str(args.max_model_len), "--served-model-name", NAME]
    if args.serve == "on":
        argv += ["--trace-file", str(args.trace_file)]
    server = cli.build_server(parser.parse_args(argv))
    if args.serve == "off":
        server.engine.observers.remove(server.metrics.observe_round)
        server.metrics = NullMetrics(server.metrics)
        assert server.provider is None, "OTEL_TRACES_EXPORTER must be unset for telemetry off"
    asyncio.run(cli._run(server, "127.0.0.1", 0, f"telemetry {args.serve}"))


class ModeProcess:
    """One mode's process: ``engine`` (driven over stdin) or a server (``off``/``on``)."""

    def __init__(self, args, kind: str, trace_file: Path):
        env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
        repo = str(Path(__file__).resolve().parents[1])  # import spectest as the parent does
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [repo, env.get("PYTHONPATH")]))
        cmd = [sys.executable, __file__, "--serve", kind, "--models", str(args.models),
               "--threads", str(args.threads), "--k", str(args.k), "--max-tokens",
               str(args.max_tokens), "--max-model-len", str(args.max_model_len),
               "--trace-file", str(trace_file), "--concurrency", *map(str, args.concurrency)]
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True,
                                     env={**env, "PYTHONUNBUFFERED": "1"})
        self.url = ""
        for line in self.proc.stdout:  # until the start-up line
            match = START_LINE.search(line) or re.search(r"engine ready", line)
            if match:
                self.url = match.group(1) if match.re is START_LINE else "in-process"
                break
        if not self.url:
            raise RuntimeError(f"the {kind} process did not start (exit {self.proc.wait()})")
        if kind != "engine":
            threading.Thread(target=self.proc.stdout.read, daemon=True).start()  # drain

    def cpu_seconds(self) -> float:
        """user + system CPU time of the process, all threads (from /proc)."""
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def run_engine(self, concurrency: int, n: int) -> tuple[int, float]:
        self.proc.stdin.write(f"{concurrency} {n}\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the engine process died (exit {self.proc.wait()})")
        result = json.loads(line)
        return result["tokens"], result["seconds"]

    def stop(self) -> None:
        if self.proc.stdin:
            self.proc.stdin.close()
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


# --- the client side ----------------------------------------------------------------------
def run_engine(engine, concurrency: int, n: int, prompt_ids: tuple[int, ...],
               max_tokens: int) -> tuple[int, float]:
    """Closed loop in-process: keep ``concurrency`` requests in flight until n are done."""
    lock, all_done = threading.Lock(), threading.Event()
    state = {"next": 0, "finished": 0, "tokens": 0}
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)

    def submit() -> None:
        with lock:
            if state["next"] >= n:
                return
            i = state["next"]
            state["next"] += 1
        engine.submit(GenerationRequest(f"bench-{time.monotonic_ns()}-{i}", prompt_ids, params),
                      on_output)

    def on_output(out) -> None:  # on the engine thread
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


async def run_http(url: str, concurrency: int, n: int, max_tokens: int) -> tuple[int, float]:
    """Closed loop over HTTP: ``concurrency`` clients stream completions until n are done."""
    body = {"model": NAME, "prompt": PROMPT, "max_tokens": max_tokens, "temperature": 0,
            "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
    todo = iter(range(n))
    tokens = 0
    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector, read_bufsize=2**20) as session:
        async def client():
            nonlocal tokens
            for _ in todo:
                async with session.post(url + "/v1/completions", json=body) as resp:
                    if resp.status != 200:
                        raise RuntimeError(f"HTTP {resp.status}: {await resp.text()}")
                    usage = None
                    async for line in resp.content:
                        if line.startswith(b'data: {"id"') and b'"usage"' in line:
                            usage = json.loads(line[6:])["usage"]
                    if usage is None or usage["completion_tokens"] != max_tokens:
                        raise RuntimeError(f"stream ended without the expected usage: {usage}")
                    tokens += usage["completion_tokens"]
        t0 = time.perf_counter()
        await asyncio.gather(*(client() for _ in range(concurrency)))
        return tokens, time.perf_counter() - t0


def write_atomic(path: Path, obj) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(obj, indent=2))
    os.replace(tmp, path)


METRICS = {"tok_s": "tokens/s (wall clock)",
           "tok_per_cpu_s": "tokens per CPU-second of the serving process"}


def summarize(rows: list[dict]) -> tuple[pd.DataFrame, dict[str, float]]:
    """Median (and spread) per concurrency × mode for both measures, each mode's ratio to the
    in-process engine at the same concurrency, and the named ratios the targets apply to."""
    df = pd.DataFrame(rows)
    table = df.groupby(["concurrency", "mode"]).agg(
        runs=("tok_s", "count"), tok_s=("tok_s", "median"), tok_s_min=("tok_s", "min"),
        tok_s_max=("tok_s", "max"), tok_per_cpu_s=("tok_per_cpu_s", "median"))
    ratios: dict[str, float] = {}
    for metric in METRICS:
        base = table[metric].xs("engine", level="mode")
        table[f"{metric}_vs_engine"] = table[metric] / base.reindex(
            table.index.get_level_values("concurrency")).to_numpy()
        for c in base.index:
            med = table[metric].xs(c, level="concurrency")
            if {"http", "http+telemetry"} <= set(med.index):
                ratios[f"{metric}: telemetry on / off, c={c}"] = \
                    med["http+telemetry"] / med["http"]
                ratios[f"{metric}: http+telemetry / engine, c={c}"] = \
                    med["http+telemetry"] / med["engine"]
    return table.reset_index(), ratios


def target_of(name: str) -> float | None:
    if "telemetry on / off" in name:
        return TARGET_TELEMETRY
    if "http+telemetry / engine, c=1" in name:
        return TARGET_HTTP
    return None


def measure(args) -> int:
    rows: list[dict] = []
    workdir = Path(tempfile.mkdtemp(prefix="spectest-overhead-"))
    procs = {mode: ModeProcess(args, kind, workdir / f"{kind}.jsonl")
             for mode, kind in zip(MODES, ("engine", "off", "on"))}

    def once(mode: str, c: int, n: int) -> tuple[int, float, float]:
        proc = procs[mode]
        cpu0 = proc.cpu_seconds()
        if mode == "engine":
            tokens, seconds = proc.run_engine(c, n)
        else:
            tokens, seconds = asyncio.run(run_http(proc.url, c, n, args.max_tokens))
        return tokens, seconds, proc.cpu_seconds() - cpu0

    try:
        for mode in MODES:  # warm-up: first forwards, connection set-up, allocator pools
            once(mode, max(args.concurrency), max(args.concurrency))
        for r in range(args.repeats):
            for c in args.concurrency:
                n = args.requests * c
                order = MODES[r % 3:] + MODES[:r % 3]
                for mode in order:
                    tokens, seconds, cpu = once(mode, c, n)
                    rows.append({"mode": mode, "concurrency": c, "repeat": r,
                                 "requests": n, "tokens": tokens, "seconds": seconds,
                                 "cpu_seconds": cpu, "tok_s": tokens / seconds,
                                 "tok_per_cpu_s": tokens / max(cpu, 1e-9)})
                    print(f"repeat {r} c={c} {mode:15s} {tokens / seconds:9.1f} tok/s "
                          f"{tokens / max(cpu, 1e-9):9.1f} tok/CPU-s ({tokens} tokens in "
                          f"{seconds:.2f} s)", flush=True)
                    if args.out:
                        write_atomic(args.out, {"rows": rows})
    except KeyboardInterrupt:
        print("interrupted: summarizing the runs so far", file=sys.stderr)
    finally:
        for proc in procs.values():
            proc.stop()
    if not rows:
        return 1
    table, ratios = summarize(rows)
    spans = workdir / "on.jsonl"
    n_spans = sum(1 for _ in spans.open()) if spans.exists() else 0
    shutil.rmtree(workdir, ignore_errors=True)
    print(f"\nmodels {args.models}, K={args.k}, {args.max_tokens} tokens per request, "
          f"{args.requests} requests per client, torch threads {args.threads}, "
          f"{args.repeats} repeats; {n_spans} spans traced")
    print(table.to_string(index=False, float_format=lambda v: f"{v:.3f}" if v < 10
                          else f"{v:.1f}"))
    ok = True
    for name, ratio in ratios.items():
        target = target_of(name)
        verdict = "" if target is None else \
            f"  {'PASS' if ratio >= target else 'MISS'} (target >= {target:.2f})"
        ok &= target is None or ratio >= target
        print(f"{name}: {ratio:.3f}{verdict}")
    if args.out:
        write_atomic(args.out, {"rows": rows, "summary": table.to_dict("records"),
                                "ratios": ratios})
    return 0 if ok or not args.strict else 1


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", type=Path,
                    default=Path(os.environ.get("SPECTEST_TEST_MODELS", MODELS_DIR)))
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--requests", type=int, default=8, help="requests per client per run")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--threads", type=int, default=1, help="torch threads (engine and server)")
    ap.add_argument("--max-model-len", type=int, default=512)
    ap.add_argument("--out", type=Path, default=None, help="JSON results (written atomically)")
    ap.add_argument("--strict", action="store_true", help="exit 1 when a target is missed")
    ap.add_argument("--serve", choices=["engine", "on", "off"], help=argparse.SUPPRESS)
    ap.add_argument("--trace-file", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    for name in ("target", "draft"):
        if not (args.models / name).is_dir():
            print(f"server_overhead: no {name}/ checkpoint under {args.models}", file=sys.stderr)
            return 2
    if args.max_tokens + len(PROMPT) + args.k + 1 > args.max_model_len:
        print("server_overhead: --max-tokens does not fit --max-model-len", file=sys.stderr)
        return 2
    if args.serve == "engine":
        serve_engine(args)
        return 0
    if args.serve:
        serve(args)
        return 0
    return measure(args)


if __name__ == "__main__":
    sys.exit(main())
