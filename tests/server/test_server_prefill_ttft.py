"""``benchmarks/prefill_ttft.py`` runs against the real default server: long held-out prompts
cold, then warm from the prefix cache, whose hit ends on a 64-token chunk. The figures are the
benchmark's to print (docs/results.md); this checks what it measured is what it says."""

from __future__ import annotations

import json

from live_server import run_benchmark

from spectest.engine.prefix_cache import CHUNK


def test_the_prefill_benchmark_measures_cold_and_warm_prompts(tmp_path):
    out = tmp_path / "ttft.json"
    run = run_benchmark("prefill_ttft.py", "--prompts", "2", "--chars", "2000", "--json",
                        str(out), timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["prompts"] == 2 and "warm / cold" in run.stdout
    for row in result["rows"]:
        # all of the prompt but the chunk holding its last token came from the cache
        assert row["cached_tokens"] % CHUNK == 0
        assert row["prompt_tokens"] - CHUNK <= row["cached_tokens"] < row["prompt_tokens"]
