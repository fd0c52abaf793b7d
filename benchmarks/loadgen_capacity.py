"""Benchmark: how fast can one Locust worker process drive a streaming server, and how exactly?

Against the zero-latency stub (``spectest.loadgen.stub``: 64 tokens per response, one token
per SSE chunk, no delays) pinned to one core, with the client pinned to the other, in one run
and at each concurrency of ``--sweep`` (closed loop, no wait):

* baseline — a minimal asyncio/aiohttp streaming client (``iter_any()`` + line splitting,
  the fastest asyncio reading pattern tried), one process, decoding events with
  ``json.loads`` as vLLM's benchmark client does (``--baseline-decoder orjson``: with orjson,
  as the Locust user does — the same work, so the ratio isolates Locust's own cost);
* Locust — one Locust process running ``workloads/chat.py`` (the real spectest user).

Timing error per request = what the client measured − the truth from the stub's stamps, on
the shared CLOCK_MONOTONIC: TTFT truth = first token chunk sent − request sent; TPOT truth =
(last − first chunk sent) / (N − 1). Printed per run: requests/s, TTFT/TPOT error (mean and
p90 of |error|), CPU of client, stub and machine, and requests per client CPU-second (what
the client costs, independent of how much of its core other jobs took); then the
Locust/asyncio ratios and the highest rate each keeps with mean timing error < 2 ms (target:
Locust ≥ 0.90 × asyncio's rate).

Then load beyond one process (``--processes N``, default 2; 1 skips it): against the stub in
``--burst`` mode (each response written at once, metrics added once — the least a server can
cost, so the load generator is what saturates), unpinned, at ``--concurrency`` users: one
Locust process vs ``locust --processes N`` (what ``spectest sweep --processes N`` runs: a master
and N forked workers, rows shipped to the master), interleaved, ``--repeat`` times; the rate
ratio is the capacity scale-out gives on this machine (target on 2 cores: ≥ 1.6×).
A JSON copy goes to ``--out``. On a shared machine the figures move ±20 % between runs; the
ratios compare runs made seconds apart on the same stub, interleaved, each level
repeated ``--repeat`` times (medians reported).

    python benchmarks/loadgen_capacity.py [--seconds 6] [--concurrency 32] [--sweep 1,2,4,8,16,32]
        [--processes 2] [--baseline-decoder json|orjson]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import numpy as np
import pandas as pd
import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from spectest.loadgen.runner import StubProcess, locust_env  # noqa: E402
from spectest.procs import preexec  # noqa: E402

BODY = json.dumps({"model": "stub-model", "max_tokens": 64, "temperature": 0.0, "stream": True,
                   "stream_options": {"include_usage": True},
                   "messages": [{"role": "user", "content": "Tell me about the sea."}]}).encode()
LIMIT_MS = 2.0
WARMUP_S = 1.0


# --- the baseline client (runs in its own pinned process: --asyncio-client) ---------------
async def _asyncio_client(url: str, concurrency: int, seconds: float,
                          decoder: str = "json") -> list[dict]:
    import aiohttp
    if decoder == "orjson":
        import orjson
        loads = orjson.loads
    else:
        def loads(data: bytes):
            return json.loads(data.decode())

    rows: list[dict] = []
    end = time.monotonic() + seconds
    headers = {"Content-Type": "application/json", "Accept-Encoding": "identity"}

    async def worker(session: aiohttp.ClientSession) -> None:
        while time.monotonic() < end:
            t0 = time.perf_counter()
            times, usage, rid, buf = [], None, "", b""
            async with session.post(url + "/v1/chat/completions", data=BODY,
                                    headers=headers) as resp:
                async for data in resp.content.iter_any():
                    buf += data
                    while (i := buf.find(b"\n")) >= 0:
                        line, buf = buf[:i], buf[i + 1:]
                        if not line.startswith(b"data:") or line[5:].strip() == b"[DONE]":
                            continue
                        now = time.perf_counter()
                        ev = loads(line[5:])
                        rid = rid or ev.get("id", "")
                        usage = ev.get("usage") or usage
                        for ch in ev.get("choices") or ():
                            if (ch.get("delta") or {}).get("content"):
                                times.append(now)
            n = usage["completion_tokens"]
            rows.append({"response_id": rid, "ok": True, "sent_mono": t0,
                         "started_at": time.time() - (time.perf_counter() - t0),
                         "ttft_ms": (times[0] - t0) * 1e3, "e2el_ms": (times[-1] - t0) * 1e3,
                         "tpot_ms": (times[-1] - times[0]) / (n - 1) * 1e3})

    conn = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=conn) as session:
        await asyncio.gather(*(worker(session) for _ in range(concurrency)))
    return rows


# --- measuring ------------------------------------------------------------------------------
class CpuWindow:
    """CPU seconds used by the client and the stub (and the whole machine) over a window."""

    def __init__(self, client_pid: int, stub_pid: int, tree: bool = False):
        self.procs = {"client": psutil.Process(client_pid), "stub": psutil.Process(stub_pid)}
        self.tree = tree  # the client's forked workers count as the client
        self.kids = self.procs["client"].children(recursive=True) if tree else []
        self.t0 = time.monotonic()
        self.start = {k: self._used(p) for k, p in self.procs.items()}
        self.start_kids = [self._used(p) for p in self.kids]
        self.machine0 = psutil.cpu_times()

    @staticmethod
    def _used(p: psutil.Process) -> float:
        try:
            t = p.cpu_times()
        except psutil.Error:  # a worker that already exited
            return 0.0
        return t.user + t.system

    def stop(self) -> dict[str, float]:
        wall = time.monotonic() - self.t0
        out = {f"{k}_cpu_pct": 100 * (self._used(p) - self.start[k]) / wall
               for k, p in self.procs.items()}
        out["client_cpu_pct"] += sum(100 * (self._used(p) - s0) / wall
                                     for p, s0 in zip(self.kids, self.start_kids))
        m1 = psutil.cpu_times()
        busy = sum(getattr(m1, f) - getattr(self.machine0, f) for f in ("user", "system", "nice"))
        out["machine_cpu_pct"] = 100 * busy / wall  # of all cores: 200 % = both saturated
        return out


def truth(url: str) -> dict[str, dict]:
    with urllib.request.urlopen(url + "/stub/timings?clear=1") as r:
        return {t["id"]: t for t in json.loads(r.read())}


def figures(rows: list[dict], stamps: dict[str, dict], warmup_s: float) -> dict:
    """Rate over the steady window and the timing error of the requests in it."""
    df = pd.DataFrame([r for r in rows if r["ok"] and r["response_id"] in stamps])
    df["ended_at"] = df.started_at + df.e2el_ms / 1e3
    t_start, t_end = df.started_at.min() + warmup_s, df.ended_at.max()
    win = df[df.started_at >= t_start]
    sent0 = np.array([stamps[i]["chunk_sent_at"][0] for i in win.response_id])
    sent1 = np.array([stamps[i]["chunk_sent_at"][-1] for i in win.response_id])
    n = np.array([stamps[i]["completion_tokens"] for i in win.response_id])
    e_ttft = np.abs(win.ttft_ms.to_numpy() - (sent0 - win.sent_mono.to_numpy()) * 1e3)
    e_tpot = np.abs(win.tpot_ms.to_numpy() - (sent1 - sent0) / (n - 1) * 1e3)
    return {"requests": int(len(win)), "rate_rps": len(win) / max(1e-9, t_end - t_start),
            "ttft_err_mean_ms": float(e_ttft.mean()),
            "ttft_err_p90_ms": float(np.percentile(e_ttft, 90)),
            "tpot_err_mean_ms": float(e_tpot.mean()),
            "tpot_err_p90_ms": float(np.percentile(e_tpot, 90))}


def run_client(kind: str, url: str, users: int, seconds: float, cpu: int | None,
               stub_pid: int, work: Path, nice: int = 0,
               processes: int = 1, decoder: str = "json") -> tuple[list[dict], dict]:
    """One measured run of the asyncio baseline or of Locust (``processes`` > 1: a master
    and that many workers) at ``users``."""
    work.mkdir(parents=True, exist_ok=True)
    out = work / f"{kind}-{users}-p{processes}"
    if kind == "asyncio":
        cmd = [sys.executable, __file__, "--asyncio-client", url, "--concurrency", str(users),
               "--seconds", str(seconds), "--rows", str(out) + ".json", "--decoder", decoder]
    else:
        cmd = [sys.executable, "-m", "locust", "-f", str(ROOT / "workloads" / "chat.py"),
               "--host", url, "--headless", "--only-summary", "--results-dir", str(out),
               "--users", str(users), "--run-time", f"{seconds:g}s", "--max-tokens", "64",
               "--stop-timeout", "10", "--scrape-interval", "3600"]
        if processes > 1:
            cmd += ["--processes", str(processes)]
    env = locust_env()
    with open(f"{out}.log", "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env,
                                preexec_fn=preexec(cpu, nice))
        time.sleep(WARMUP_S + 1.0)  # interpreter start-up + warm-up: not measured
        window = CpuWindow(proc.pid, stub_pid, tree=processes > 1)
        time.sleep(max(0.5, seconds - WARMUP_S - 1.5))
        cpu_use = window.stop()
        if proc.wait(timeout=seconds + 90) != 0:
            raise SystemExit(f"loadgen_capacity: {kind} client failed, see {out}.log")
    if kind == "asyncio":
        rows = json.loads(Path(f"{out}.json").read_text())
    else:
        rows = [json.loads(x) for x in (out / "requests.jsonl").read_text().splitlines()]
    return rows, cpu_use


def steady_rate(rows: list[dict], warmup_s: float) -> dict:
    """Completed requests per second among those sent after the warm-up."""
    ok = [r for r in rows if r["ok"]]
    t0 = min(r["started_at"] for r in ok) + warmup_s
    win = [r for r in ok if r["started_at"] >= t0]
    t_end = max(r["started_at"] + r["e2el_ms"] / 1e3 for r in win)
    return {"requests": len(win), "rate_rps": len(win) / max(1e-9, t_end - t0)}


def scale_out(a, work: Path) -> dict:
    """One Locust process vs ``--processes N`` against the burst stub, unpinned."""
    runs: dict[int, list[dict]] = {1: [], a.processes: []}
    stub = StubProcess("--ttft-ms", "0", "--itl-ms", "0", "--output-tokens", "64",
                       "--spec-k", "0", "--burst", nice=a.nice)
    with stub as url:
        for rep in range(a.repeat):
            for procs in (1, a.processes):
                rows, cpu_use = run_client("locust", url, a.concurrency, a.seconds, None,
                                           stub.proc.pid, work / f"scale{rep}", a.nice,
                                           processes=procs)
                runs[procs].append({**steady_rate(rows, WARMUP_S + 1.0), **cpu_use})
                r = runs[procs][-1]
                print(f"  repeat {rep} locust x{procs}: {r['rate_rps']:7.1f} req/s, client "
                      f"{r['client_cpu_pct']:.0f}% cpu, stub {r['stub_cpu_pct']:.0f}%, machine "
                      f"{r['machine_cpu_pct']:.0f}%", flush=True)
    med = {p: {k: float(np.median([r[k] for r in rs])) for k in rs[0]} for p, rs in runs.items()}
    ratios = [b["rate_rps"] / s["rate_rps"] for s, b in zip(runs[1], runs[a.processes])]
    return {"users": a.concurrency, "processes": a.processes, "one": med[1],
            "many": med[a.processes], "ratio_median": float(np.median(ratios)),
            "ratio_min": min(ratios), "ratio_max": max(ratios), "repeats": a.repeat}


def versus_asyncio(a, work: Path) -> dict:
    """The asyncio baseline and one Locust process at each level, pinned apart."""
    cpus = sorted(os.sched_getaffinity(0))
    stub_cpu, client_cpu = (cpus[0], cpus[1]) if len(cpus) >= 2 else (None, None)
    levels = sorted({int(x) for x in a.sweep.split(",") if x} | {a.concurrency})
    results: dict = {"asyncio": [], "locust": []}
    stub = StubProcess("--ttft-ms", "0", "--itl-ms", "0", "--output-tokens", "64",
                       "--spec-k", "0", cpu=stub_cpu, nice=a.nice)
    with stub as url:
        for users in levels:
            runs: dict[str, list[dict]] = {"asyncio": [], "locust": []}
            for rep in range(a.repeat):  # interleaved, so drift in machine load hits both
                for kind in ("asyncio", "locust"):
                    truth(url)
                    rows, cpu_use = run_client(kind, url, users, a.seconds, client_cpu,
                                               stub.proc.pid, work / f"rep{rep}", a.nice,
                                               decoder=a.baseline_decoder)
                    runs[kind].append({**figures(rows, truth(url), WARMUP_S), **cpu_use})
            for kind, reps in runs.items():  # the median of the repeats, figure by figure
                for r in reps:  # contention-proof capacity: requests per client CPU-second
                    r["req_per_cpu_s"] = r["rate_rps"] / max(1e-9, r["client_cpu_pct"] / 100)
                results[kind].append({"users": users, "repeats": len(reps), **{
                    k: float(np.median([r[k] for r in reps])) for k in reps[0]}})

    def pick(kind: str, within: bool) -> dict:
        runs = [r for r in results[kind] if not within
                or max(r["ttft_err_mean_ms"], r["tpot_err_mean_ms"]) < LIMIT_MS]
        return max(runs, key=lambda r: r["rate_rps"]) if runs else {"rate_rps": 0.0, "users": 0}

    at = {k: next(r for r in results[k] if r["users"] == a.concurrency) for k in results}
    summary = {
        f"ratio_at_{a.concurrency}_streams": at["locust"]["rate_rps"] / at["asyncio"]["rate_rps"],
        "ratio_of_max_rates": (pick("locust", False)["rate_rps"]
                               / pick("asyncio", False)["rate_rps"]),
        "locust_best_within_2ms": pick("locust", True),
        "asyncio_best_within_2ms": pick("asyncio", True),
    }
    summary["ratio_best_within_2ms_vs_asyncio_max"] = (
        summary["locust_best_within_2ms"]["rate_rps"] / pick("asyncio", False)["rate_rps"])
    cap = {k: float(np.median([r["req_per_cpu_s"] for r in results[k]])) for k in results
           if k in ("asyncio", "locust")}
    summary["req_per_cpu_s"] = cap
    summary["ratio_req_per_cpu_s"] = cap["locust"] / cap["asyncio"]
    results["summary"] = summary

    print(f"asyncio baseline decodes events with {a.baseline_decoder}; "
          f"zero-latency stub (64 tokens/response, 1 token/chunk) on cpu {stub_cpu}, "
          f"client on cpu {client_cpu}; {a.seconds:g} s per run, first {WARMUP_S:g} s not "
          f"counted; nice {a.nice}; median of {a.repeat} interleaved runs per row; "
          f"'machine' = all cores "
          f"busy, {100 * len(cpus)} % = saturated (other jobs included)")
    print(f"{'client':<8} {'users':>5} {'req/s':>8} {'TTFT err mean/p90 ms':>22} "
          f"{'TPOT err mean/p90 ms':>22} {'client cpu':>10} {'req/cpu-s':>9} {'stub cpu':>9} "
          f"{'machine':>8}")
    for users in levels:
        for kind in ("asyncio", "locust"):
            r = next(x for x in results[kind] if x["users"] == users)
            print(f"{kind:<8} {users:>5} {r['rate_rps']:>8.1f} "
                  f"{r['ttft_err_mean_ms']:>11.3f}/{r['ttft_err_p90_ms']:<10.3f} "
                  f"{r['tpot_err_mean_ms']:>11.3f}/{r['tpot_err_p90_ms']:<10.3f} "
                  f"{r['client_cpu_pct']:>9.0f}% {r['req_per_cpu_s']:>9.0f} "
                  f"{r['stub_cpu_pct']:>8.0f}% "
                  f"{r['machine_cpu_pct']:>7.0f}%")
    lb, ab = summary["locust_best_within_2ms"], summary["asyncio_best_within_2ms"]
    print(f"locust / asyncio rate at {a.concurrency} streams: "
          f"{summary[f'ratio_at_{a.concurrency}_streams']:.2f} (target >= 0.90); max rate vs "
          f"max rate: {summary['ratio_of_max_rates']:.2f}")
    print(f"highest rate with mean timing error < {LIMIT_MS:g} ms: locust {lb['rate_rps']:.1f} "
          f"req/s ({lb['users']} users), asyncio {ab['rate_rps']:.1f} req/s ({ab['users']} "
          f"streams); locust-within-2ms / asyncio max = "
          f"{summary['ratio_best_within_2ms_vs_asyncio_max']:.2f}")
    print(f"client cost, contention-proof: locust {cap['locust']:.0f} vs asyncio "
          f"{cap['asyncio']:.0f} requests per client CPU-second = "
          f"{summary['ratio_req_per_cpu_s']:.2f} (the rate ratio on a core of its own)")
    return results


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=6.0, help="length of each run")
    ap.add_argument("--concurrency", type=int, default=32, help="the headline level")
    ap.add_argument("--sweep", default="1,2,4,8,16,32", help="concurrency levels to run")
    ap.add_argument("--repeat", type=int, default=3, help="runs per level and client (median)")
    ap.add_argument("--nice", type=int, default=0,
                    help="priority change for stub and clients (e.g. -10 on a shared host)")
    ap.add_argument("--out", type=Path, default=None, help="write the figures as JSON here")
    ap.add_argument("--processes", type=int, default=2,
                    help="also compare one Locust process with this many (1: skip)")
    ap.add_argument("--skip-asyncio", action="store_true",
                    help="only the scale-out comparison")
    ap.add_argument("--baseline-decoder", choices=["json", "orjson"], default="json",
                    help="the asyncio baseline's JSON decoder: json (the standard library, as "
                         "vLLM's benchmark client decodes) or orjson (what spectest's Locust "
                         "user decodes with: the same work, so the ratio is Locust's own cost)")
    ap.add_argument("--asyncio-client", metavar="URL", help=argparse.SUPPRESS)
    ap.add_argument("--decoder", default="json", help=argparse.SUPPRESS)
    ap.add_argument("--rows", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.asyncio_client:  # child mode: the baseline client itself
        rows = asyncio.run(_asyncio_client(a.asyncio_client, a.concurrency, a.seconds,
                                           a.decoder))
        Path(a.rows).write_text(json.dumps(rows))
        return 0
    work = Path(tempfile.mkdtemp(prefix="loadgen-capacity-"))
    results = {} if a.skip_asyncio else versus_asyncio(a, work)
    if a.processes > 1:
        print(f"\nscale-out: one Locust process vs --processes {a.processes}, "
              f"{a.concurrency} users, burst stub, unpinned", flush=True)
        results["scale_out"] = out = scale_out(a, work)
        print(f"locust --processes {a.processes}: {out['many']['rate_rps']:.1f} req/s vs one "
              f"process {out['one']['rate_rps']:.1f} req/s = {out['ratio_median']:.2f}× "
              f"(median of {out['repeats']} paired runs, [{out['ratio_min']:.2f}, "
              f"{out['ratio_max']:.2f}]; target >= 1.6)")
    if a.out:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
