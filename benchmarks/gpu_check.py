"""The bundled engine on a GPU, checked in one short run (``benchmarks/gpu_check.sh`` runs this).

Sections, each under a time limit of its own and reported PASS / FAIL / SKIPPED (with why):

1. **engine** — the embedded pair built on the device as ``spectest serve`` builds it: greedy
   speculative output equals target-only output on held-out code (draft model and n-gram),
   seeded sampled requests (temperature 0.8, top-p 0.95) finish and reproduce, how often a
   decode round makes the host wait (CUDA: ``torch.cuda.set_sync_debug_mode("warn")``; every
   device: ``engine.syncs``), and how many forwards ran from captured CUDA graphs;
2. **speedup** — ``benchmarks/engine_speedup.py`` on the device (batch 1, held-out code,
   draft model and n-gram, greedy and T = 0.7) with ``transformers`` on the same device;
3. **sizes** — ``benchmarks/gpu_models.py``: a step and a verify(K+1) at realistic sizes
   (SmolLM2-135M's shape, a 1B Llama's) with random weights, engine against transformers;
4. **serve** — ``spectest serve --device …`` with a short ``spectest sweep`` (code, c = 1 and
   4) and the default ``spectest audit`` against it. They need pydantic, OpenTelemetry, orjson
   and Locust, which the GPU image lacks: ``gpu_check.sh --fetch-wheels`` downloads them here
   and the device call carries them; without them this section says SKIPPED and why;
5. **profile** — ``spectest profile`` on the device: a round's time at K = 0 and K = 4 split
   into model compute, drafting, verification, host sync and Python bookkeeping.

Prints one table at the end (and writes ``gpu_check.json`` to ``--out``). ``--quick`` shrinks
every section so the script itself can be checked on a CPU in a few minutes.

    python benchmarks/gpu_check.py [--device cuda|cpu|auto] [--quick] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
import traceback
import uuid
import warnings
from pathlib import Path

import pandas as pd
import torch

REPO = Path(__file__).resolve().parents[1]
BENCH = REPO / "benchmarks"
sys.path[:0] = [str(REPO), str(BENCH)]

from engine_speedup import third_party_code  # noqa: E402
from spectest.engine.api import build_engine  # noqa: E402
from spectest.engine.policies import FixedK  # noqa: E402
from spectest.engine.requests import GenerationRequest  # noqa: E402
from spectest.engine.sampling import SamplingParams  # noqa: E402
from spectest.engine.syncs import HostSyncCounter  # noqa: E402

ROWS: list[dict] = []  # the table: section, check, figure, verdict


def row(section: str, check: str, figure, verdict: str = "", note: str = "") -> None:
    ROWS.append({"section": section, "check": check, "figure": figure, "verdict": verdict,
                 "note": note})
    print(f"gpu_check: [{section}] {check}: {figure} {verdict} {note}".rstrip(), flush=True)


def env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join(
        filter(None, [str(REPO), os.environ.get("PYTHONPATH")])), "PYTHONUNBUFFERED": "1"}


# --- 1. the engine on the device ---------------------------------------------------------
def generate(engine, prompts, speculative=True, temperature=0.0, max_tokens=64):
    reqs = [GenerationRequest(uuid.uuid4().hex, tuple(p), SamplingParams(
        max_tokens=max_tokens, temperature=temperature, top_p=0.95 if temperature else 1.0,
        seed=100 + i, ignore_eos=True), speculative=speculative) for i, p in enumerate(prompts)]
    out = {r.request_id: [] for r in reqs}
    errors = []

    def collect(o):
        out[o.request_id].extend(o.token_ids)
        if o.error:
            errors.append(o.error)

    for r in reqs:
        engine.submit(r, collect)
    engine.run_until_idle()
    return [out[r.request_id] for r in reqs], errors


def syncs_per_round(engine, prompts) -> tuple[list[int], list[int], int, list[str]]:
    """Host waits in each of a few decode rounds (no admissions in them): by the device's own
    sync debug mode (CUDA) and by engine.syncs, with the tokens those rounds emitted and any
    errors (rounds that fail wait for nothing, so a count is only evidence beside tokens). The
    same requests run once first, so every shape those rounds use is already captured (a
    capture synchronises, once per shape)."""
    emitted, errors = [0], []

    def collect(o):
        emitted[0] += len(o.token_ids)
        if o.error:
            errors.append(o.error)

    def submit():
        for i, p in enumerate(prompts):
            engine.submit(GenerationRequest(uuid.uuid4().hex, tuple(p), SamplingParams(
                max_tokens=40, ignore_eos=True, temperature=0.8 if i % 2 else 0.0, seed=i)),
                collect)
    submit()
    engine.run_until_idle()
    submit()
    engine.step()  # admissions
    emitted[0] = 0
    by_device, by_counter = [], []
    for _ in range(4):
        if engine.place.cuda:
            torch.cuda.set_sync_debug_mode("warn")
            try:
                with warnings.catch_warnings(record=True) as caught:
                    warnings.simplefilter("always")
                    engine.step()
            finally:
                torch.cuda.set_sync_debug_mode("default")
            by_device.append(sum("synchroniz" in str(w.message) for w in caught))
        with HostSyncCounter() as counter:
            engine.step()
        by_counter.append(counter.count)
    tokens = emitted[0]
    engine.run_until_idle()
    return by_device, by_counter, tokens, errors


def engine_section(args) -> None:
    s = "engine"
    engines = {d: build_engine("embedded", drafter=d, policy=FixedK(4), max_num_seqs=8,
                               device=args.device) for d in ("none", "draft-model", "ngram")}
    base = engines["none"]
    row(s, "device", base.place.describe(), "", f"torch {torch.__version__}, weights "
        f"{str(base.place.dtype).removeprefix('torch.')}")
    prompts = third_party_code(base.tokenizer, 3 if args.quick else 8)  # token ids
    n_tok = 24 if args.quick else 128
    expected, _ = generate(base, prompts, speculative=False, max_tokens=n_tok)
    for name in ("draft-model", "ngram"):
        got, errors = generate(engines[name], prompts, max_tokens=n_tok)
        same = sum(g == e and len(g) == n_tok for g, e in zip(got, expected))
        row(s, f"greedy {name} == target-only", f"{same}/{len(prompts)} identical",
            "PASS" if same == len(prompts) and not errors else "FAIL",
            "; ".join(errors[:2]))
    for name in ("none", "draft-model"):
        first, errors = generate(engines[name], prompts, temperature=0.8, max_tokens=n_tok)
        again, errors2 = generate(engines[name], prompts, temperature=0.8, max_tokens=n_tok)
        done = sum(len(t) == n_tok for t in first)
        row(s, f"sampled requests ({name})", f"{done}/{len(prompts)} finished, "
            f"{'reproducible' if first == again else 'NOT reproducible'}",
            "PASS" if done == len(prompts) and first == again and not errors + errors2
            else "FAIL", "; ".join((errors + errors2)[:2]))
    for name in ("none", "draft-model", "ngram"):
        by_device, by_counter, tokens, errors = syncs_per_round(engines[name], prompts[:2])
        worst = max(by_device + by_counter)
        row(s, f"host waits per decode round ({name}, greedy + sampled)",
            f"device {by_device or 'n/a'}, counter {by_counter}; {tokens} tokens in those "
            f"rounds", "PASS" if worst <= 1 and tokens and not errors else "FAIL",
            "; ".join(errors[:1]))
    graphs = engines["draft-model"].target.graphs
    if graphs is not None:
        st = graphs.stats()
        row(s, "target forwards from CUDA graphs", f"{st['captured']} captured, "
            f"{st['replayed']} replayed, {st['eager']} eager, {st['failed']} failed",
            "PASS" if st["replayed"] and not st["failed"] else "FAIL")
    else:
        row(s, "target forwards from CUDA graphs", "off (not a GPU)", "SKIPPED")


# --- 2 and 3: the benchmarks ---------------------------------------------------------------
def budget(args) -> float:
    """Seconds the next subprocess may take: its section's limit, within the run's deadline."""
    return max(5.0, min(args.section_timeout, args.deadline - time.perf_counter() - 15))


def run_json(cmd: list[str], out: Path, timeout: float) -> dict | None:
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, cwd=REPO, env=env(), capture_output=True, text=True,
                              timeout=timeout)
    except subprocess.TimeoutExpired:
        print(f"gpu_check: {' '.join(cmd[1:3])} ran past {timeout:.0f} s", flush=True)
        return None
    print(proc.stdout[-4000:], proc.stderr[-2000:], sep="\n", flush=True)
    print(f"gpu_check: {' '.join(cmd[1:3])} took {time.perf_counter() - t0:.0f} s", flush=True)
    return json.loads(out.read_text()) if proc.returncode == 0 and out.is_file() else None


def speedup_section(args) -> None:
    s = "speedup"
    out = args.out / "engine_speedup.json"
    cmd = [sys.executable, str(BENCH / "engine_speedup.py"), "--device", args.device,
           "--workloads", "code,pysrc", "--arms", "draft-model,ngram", "--batches", "1",
           "--prompts", "2" if args.quick else "6", "--max-tokens",
           "32" if args.quick else "128", "--threads", "1", "--json", str(out)]
    data = run_json(cmd, out, budget(args))
    if data is None:
        row(s, "benchmarks/engine_speedup.py", "did not finish", "FAIL")
        return
    for r in data["batch1"]:
        if r["temperature"] == 0.0:
            row(s, f"{r['workload']} {r['arm']} (greedy, batch 1)",
                f"{r['decode_tok_s']:.0f} tok/s" + ("" if r["arm"] == "target-only" else
                                                   f", {r['speedup']:.2f}× [{r['speedup_lo']:.2f}, "
                                                   f"{r['speedup_hi']:.2f}], α {r['acceptance_rate']}"))
    for mine, theirs in (("target-only", "hf-greedy"), ("draft-model", "hf-assisted"),
                         ("ngram", "hf-prompt-lookup")):
        if theirs in data.get("hf", {}):
            row(s, f"transformers {theirs}", f"{data['hf'][theirs]:.0f} tok/s")
    greedy = [r for r in data["batch1"] if r["temperature"] == 0.0 and r["arm"] == "target-only"]
    if greedy and args.device != "cpu":
        best = max(r["decode_tok_s"] for r in greedy)
        row(s, "target-only ≥ 1,000 tok/s (H100 target)", f"{best:.0f} tok/s",
            "PASS" if best >= 1000 else "MISS")


def sizes_section(args) -> None:
    out = args.out / "gpu_models.json"
    cmd = [sys.executable, str(BENCH / "gpu_models.py"), "--device", args.device,
           "--json", str(out)] + (["--quick"] if args.quick else ["--reps", "20"])
    data = run_json(cmd, out, budget(args))
    if data is None:
        row("sizes", "benchmarks/gpu_models.py", "did not finish", "FAIL")
        return
    for r in data["rows"]:
        c = f", c {r['c']}" if r.get("c") is not None else ""
        row("sizes", f"{r['model']} — {r['impl']} ({r['dtype']})",
            f"step {r['step_b1_ms']} ms, verify({data['k'] + 1}) {r['verify_ms']} ms "
            f"(×{r['verify_over_step']}), step b8 {r['step_b8_ms']} ms{c}")


def profile_section(args) -> None:
    """``spectest profile`` on the device: where a round's time goes at K = 0 and the largest K
    (model compute, drafting, verification, host sync, Python bookkeeping)."""
    out = args.out / "profile.json"
    k_max = 4
    cmd = [sys.executable, "-m", "spectest", "profile", "--device", args.device,
           "--batch-sizes", "1" if args.quick else "1,8", "--k-max", str(k_max), "--rounds",
           "6" if args.quick else "24", "--out", str(out)]
    data = run_json(cmd, out, budget(args))
    if data is None:
        row("profile", "spectest profile", "did not finish", "FAIL")
        return
    for batch, by_k in data["meta"]["phases_ms"].items():
        for k in ("0", str(k_max)):
            phases = by_k[k]
            total = data["step_seconds"][batch][k] * 1e3
            row("profile", f"batch {batch}, K {k}: {total:.2f} ms a round", ", ".join(
                f"{name} {ms:.2f}" for name, ms in phases.items() if name != "drafting" or
                k != "0") + " ms")


# --- 4. the server, a sweep and the audit ----------------------------------------------------
def serve_section(args) -> None:
    s = "serve"
    missing = [m for m in ("pydantic", "opentelemetry.sdk", "orjson", "locust")
               if not _importable(m)]
    if missing:
        row(s, "spectest serve + sweep + audit", "not run", "SKIPPED",
            f"this image lacks {', '.join(missing)}: run `bash benchmarks/gpu_check.sh "
            f"--fetch-wheels` where pip works and carry .gpu-check")
        return
    from spectest.audit.servers import ServerProcess, ServerSpec
    spec = ServerSpec(threads=1, device=args.device)
    with ServerProcess(spec, start_timeout_s=budget(args)) as url:
        row(s, "spectest serve", url, "PASS", f"--device {args.device}")
        sweep_dir = args.out / f"sweep-{time.strftime('%H%M%S')}"  # a sweep wants a new folder
        steps = "1" if args.quick else "1,4"
        cmd = [sys.executable, "-m", "spectest", "sweep", "--host", url, "--workloads", "code",
               "--steps", steps, "--step-time", "4" if args.quick else "8", "--warmup",
               "1" if args.quick else "2", "--validate-k", "off", "--out", str(sweep_dir)]
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, cwd=REPO, env=env(), capture_output=True, text=True,
                              timeout=budget(args))
        print(proc.stdout[-3000:], proc.stderr[-2000:], sep="\n", flush=True)
        csv = sweep_dir / "steps.csv"
        if proc.returncode == 0 and csv.is_file():
            frame = pd.read_csv(csv)
            for c, both in frame.groupby("concurrency"):
                arm = both.set_index("arm")
                if {"spec", "base"} <= set(arm.index):
                    ratio = arm.loc["base", "tpot_p50_ms"] / arm.loc["spec", "tpot_p50_ms"]
                    row(s, f"sweep code c={c}: TPOT speedup (p50)", f"{ratio:.2f}× "
                        f"({arm.loc['spec', 'requests']} / {arm.loc['base', 'requests']} "
                        f"requests, acceptance {arm.loc['spec', 'acceptance_rate']:.2f})")
            row(s, "spectest sweep", f"{time.perf_counter() - t0:.0f} s", "PASS")
        else:
            row(s, "spectest sweep", f"exit {proc.returncode}", "FAIL",
                proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else "")
        audit_dir = args.out / "audit"
        cmd = [sys.executable, "-m", "spectest", "audit", "--candidate", url, "--baseline", url,
               "--out", str(audit_dir), "--no-progress"] + (
            ["--num-prompts", "4", "--samples-per-prompt", "2", "--greedy-tokens", "16",
             "--sample-tokens", "8"] if args.quick else [])
        proc = subprocess.run(cmd, cwd=REPO, env=env(), capture_output=True, text=True,
                              timeout=budget(args))
        print(proc.stdout[-3000:], proc.stderr[-2000:], sep="\n", flush=True)
        verdict = {0: "PASS", 1: "FAIL (drift)"}.get(proc.returncode, "FAIL (could not run)")
        checks = re.findall(r"^- \*\*\[(\w+)\]\*\* ([^:(]+)", proc.stdout, re.M)
        row(s, "spectest audit (default checks" + (", shrunk)" if args.quick else ")"),
            "; ".join(f"{name.strip()} {v}" for v, name in checks) or f"exit {proc.returncode}",
            verdict)


def _importable(module: str) -> bool:
    try:
        __import__(module)
        return True
    except ImportError:
        return False


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    ap.add_argument("--quick", action="store_true", help="shrunk sections (a CPU check)")
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "gpu-check-out")))
    ap.add_argument("--sections", default="engine,speedup,serve,sizes,profile")
    ap.add_argument("--section-timeout", type=float, default=150.0,
                    help="seconds one benchmark, sweep or audit may take")
    ap.add_argument("--deadline", type=float, default=280.0,
                    help="seconds for the whole check: a section that cannot start in time "
                         "says so (default 280, under gpu_check.sh's 5 minutes)")
    args = ap.parse_args(argv)
    if args.device == "auto":
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    args.out.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(1)
    t0 = time.perf_counter()
    args.deadline = t0 + args.deadline
    sections = {"engine": engine_section, "speedup": speedup_section, "sizes": sizes_section,
                "serve": serve_section, "profile": profile_section}
    for name in args.sections.split(","):
        if args.deadline - time.perf_counter() < 30:
            row(name, "section", "not started", "SKIPPED", "out of time (--deadline)")
            continue
        try:
            sections[name](args)
        except Exception as exc:  # noqa: BLE001 — one section's failure is reported, not fatal
            traceback.print_exc()
            row(name, "section", f"{type(exc).__name__}: {exc}"[:160], "FAIL")
    table = pd.DataFrame(ROWS)
    print(f"\n== gpu_check: {args.device}, {time.strftime('%Y-%m-%d')}, "
          f"{time.perf_counter() - t0:.0f} s ==")
    with pd.option_context("display.max_colwidth", 110, "display.width", 250):
        print(table.to_string(index=False))
    (args.out / "gpu_check.json").write_text(json.dumps(ROWS, indent=1, default=str))
    failed = [r for r in ROWS if r["verdict"].startswith("FAIL")]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
