"""A short run of the fuzz campaign (``benchmarks/fuzz_api.py``) against a real ``spectest
serve``: Schemathesis cases from ``/openapi.json`` (positive and negative) plus an even sample
of the hand-written edge cases. Fails on any answer >= 500, a Schemathesis check failure (the
published schema must describe the answers), a hand-written case answered other than expected,
an error in the server's log, or a server that is not alive and serving at the end.

The full campaign (10,000 cases) is the benchmark: ``python benchmarks/fuzz_api.py``.
"""

from __future__ import annotations

import json

from live_server import run_benchmark

CASES = 300


def test_short_fuzz_campaign_finds_no_5xx_and_leaves_the_server_serving(tmp_path):
    out = tmp_path / "fuzz.json"
    run = run_benchmark("fuzz_api.py", "--cases", str(CASES), "--out", str(out), "--strict",
                        timeout=300)
    print(run.stdout[-3000:])
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
    result = json.loads(out.read_text())
    assert result["cases_sent"] >= CASES
    assert result["responses_5xx"] == 0 and result["end"]["server_counted_5xx"] == 0
    assert result["alive"] and result["ok"]
    sources = result["by_source"]
    for part in ("hand-written", "POST /v1/completions positive",
                 "POST /v1/completions negative", "POST /v1/chat/completions positive",
                 "POST /v1/chat/completions negative"):
        assert any(part in source for source in sources), sources
    # both halves did their job: valid requests reached the engine, invalid ones were refused
    assert result["by_status_class"].get("2xx", 0) >= 20
    assert result["by_status_class"].get("4xx", 0) >= 100
