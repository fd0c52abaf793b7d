"""Benchmark: does speculation pay on the server a newcomer starts with no flags?

Starts ``spectest serve`` with its defaults (embedded pair, draft-model speculation, K = 4, the
default thread count — or ``--threads N`` to compare), then sends held-out code prompts — 600-
character windows of an installed third-party package's Python source (``aiohttp``; the pair's
corpus is the standard library and the Python docs, so it never saw these) — greedy,
non-streaming, concurrency 1, through HTTP, each prompt once with speculation and once with
``"speculative": false``, alternating which goes first. Printed: wall-clock tokens/s per arm,
the ratio (the geometric mean of the per-prompt ratios, with a 95 % t-interval over prompts and
the number of prompts behind it), and whether greedy outputs were identical.

    python benchmarks/default_config.py [--prompts 8] [--max-tokens 128] [--threads N]
                                        [--device auto|cpu|cuda] [--draft DIR] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
import urllib.request
from pathlib import Path

from scipy import stats

from spectest.audit.servers import ServerProcess, ServerSpec

WINDOW = 600


def held_out_code(n: int, package: str = "aiohttp") -> list[str]:
    """``n`` windows of ``package``'s source, one per file (sorted), cut at line starts."""
    root = Path(__import__(package).__file__).parent
    out = []
    for path in sorted(root.glob("*.py")):
        text = path.read_text(encoding="utf-8", errors="replace")
        if len(text) < 3 * WINDOW:
            continue
        start = text.find("\n", len(text) // 2) + 1
        out.append(text[start:start + WINDOW])
        if len(out) == n:
            break
    return out


def complete(url: str, prompt: str, max_tokens: int, speculative: bool) -> tuple[float, dict]:
    body = {"model": "spectest-demo", "prompt": prompt, "max_tokens": max_tokens,
            "temperature": 0, "ignore_eos": True, "speculative": speculative}
    req = urllib.request.Request(url + "/v1/completions", json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    t = time.perf_counter()
    with urllib.request.urlopen(req, timeout=600) as resp:
        data = json.loads(resp.read())
    return time.perf_counter() - t, data


def measure(prompts: list[str], max_tokens: int, threads: int | None,
            device: str = "auto", draft: str = "auto") -> dict:
    with ServerProcess(ServerSpec(threads=threads, device=device, draft=draft)) as url:
        complete(url, prompts[0], 16, True)  # warm both paths
        complete(url, prompts[0], 16, False)
        rows = []
        for i, prompt in enumerate(prompts):
            order = (True, False) if i % 2 == 0 else (False, True)
            got = {arm: complete(url, prompt, max_tokens, arm) for arm in order}
            (t_on, on), (t_off, off) = got[True], got[False]
            n_on, n_off = on["usage"]["completion_tokens"], off["usage"]["completion_tokens"]
            rows.append({"on_tok_s": n_on / t_on, "off_tok_s": n_off / t_off,
                         "identical": on["choices"][0]["text"] == off["choices"][0]["text"],
                         "acceptance": on["spec"]["acceptance_rate"]})
    logs = [math.log(r["on_tok_s"] / r["off_tok_s"]) for r in rows]
    mean = statistics.fmean(logs)
    half = (stats.t.ppf(0.975, len(logs) - 1) * statistics.stdev(logs) / math.sqrt(len(logs))
            if len(logs) > 1 else float("inf"))
    return {"threads": threads or "default", "prompts": len(rows), "max_tokens": max_tokens,
            "on_tok_s": statistics.fmean(r["on_tok_s"] for r in rows),
            "off_tok_s": statistics.fmean(r["off_tok_s"] for r in rows),
            "ratio": math.exp(mean), "ratio_low": math.exp(mean - half),
            "ratio_high": math.exp(mean + half),
            "acceptance": statistics.fmean(r["acceptance"] for r in rows),
            "identical": sum(r["identical"] for r in rows), "rows": rows}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=None,
                    help="pass --threads N to the server (default: none, its own default)")
    ap.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"),
                    help="pass --device to the server (default auto, its own default)")
    ap.add_argument("--draft", default="auto",
                    help="pass --draft to the server (default auto: the shipped draft), e.g. a "
                         "the previous draft from a git worktree")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    result = measure(held_out_code(args.prompts), args.max_tokens, args.threads, args.device,
                     args.draft)
    print(f"spectest serve (threads: {result['threads']}), held-out code, greedy, c=1, "
          f"{result['prompts']} prompts × {args.max_tokens} tokens, wall clock through HTTP:")
    print(f"  speculation on  {result['on_tok_s']:6.1f} tok/s   (acceptance "
          f"{result['acceptance']:.2f})")
    print(f"  speculation off {result['off_tok_s']:6.1f} tok/s")
    print(f"  ratio {result['ratio']:.2f}× (95 % interval {result['ratio_low']:.2f}–"
          f"{result['ratio_high']:.2f}, n = {result['prompts']} prompts); greedy outputs "
          f"identical for {result['identical']}/{result['prompts']}")
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
