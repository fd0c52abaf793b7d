"""Benchmark: time to first token of long prompts on the default server, cold and warm.

Starts ``spectest serve`` with its defaults, then sends held-out prompts — windows of an
installed third-party package's Python source (``aiohttp``; the embedded pair never saw it) of
``--chars`` characters — each with one output token, greedy, non-streaming, concurrency 1,
through HTTP: first cold (a fresh ``cache_salt``: the whole prompt is prefilled), then warm
(the same prompt again under one shared salt: the prefix cache restores all of it but the
chunk its last token falls in). The request's wall time is its time to first token. Printed:
median TTFT per arm, prompt tokens and cached tokens, and warm over cold (the ratio of medians,
with the number of prompts). Run it on two commits to compare prefill schedules.

    python benchmarks/prefill_ttft.py [--prompts 8] [--chars 4000] [--threads N] [--json out]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import urllib.request
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from default_config import held_out_code  # noqa: E402

from spectest import files  # noqa: E402
from spectest.audit.servers import ServerProcess, ServerSpec  # noqa: E402


def first_token(url: str, prompt: str, salt: str) -> tuple[float, dict]:
    body = {"model": "spectest-demo", "prompt": prompt, "max_tokens": 1, "temperature": 0,
            "cache_salt": salt}
    req = urllib.request.Request(url + "/v1/completions", json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    t = time.perf_counter()
    with urllib.request.urlopen(req, timeout=600) as resp:
        data = json.loads(resp.read())
    return time.perf_counter() - t, data["usage"]


def measure(prompts: list[str], threads: int | None) -> dict:
    rows = []
    with ServerProcess(ServerSpec(threads=threads)) as url:
        first_token(url, prompts[0][:200], uuid.uuid4().hex)  # the first call's one-off costs
        shared = uuid.uuid4().hex
        for prompt in prompts:
            t_cold, usage = first_token(url, prompt, uuid.uuid4().hex)
            first_token(url, prompt, shared)  # fills the shared namespace
            t_warm, warm = first_token(url, prompt, shared)
            cached = (warm.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
            rows.append({"prompt_tokens": usage["prompt_tokens"], "cold_s": t_cold,
                         "warm_s": t_warm, "cached_tokens": cached})
    cold = statistics.median(r["cold_s"] for r in rows)
    warm = statistics.median(r["warm_s"] for r in rows)
    return {"prompts": len(rows), "threads": threads or "default",
            "prompt_tokens": statistics.median(r["prompt_tokens"] for r in rows),
            "cached_tokens": statistics.median(r["cached_tokens"] for r in rows),
            "cold_ttft_ms": 1000 * cold, "warm_ttft_ms": 1000 * warm,
            "warm_over_cold": warm / cold, "rows": rows}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--chars", type=int, default=4000)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--json", type=Path, default=None)
    a = ap.parse_args()
    import default_config
    default_config.WINDOW = a.chars
    r = measure(held_out_code(a.prompts), a.threads)
    print(f"spectest serve (threads: {r['threads']}), held-out code, {r['prompts']} prompts of "
          f"{r['prompt_tokens']:.0f} tokens (median), one output token, through HTTP:")
    print(f"  cold (whole prompt prefilled)   TTFT {r['cold_ttft_ms']:.0f} ms (median)")
    print(f"  warm ({r['cached_tokens']:.0f} tokens from the cache) TTFT "
          f"{r['warm_ttft_ms']:.0f} ms (median)")
    print(f"  warm / cold {r['warm_over_cold']:.2f} (n = {r['prompts']} prompts)")
    if a.json:
        files.write_atomic(a.json, json.dumps(r, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
