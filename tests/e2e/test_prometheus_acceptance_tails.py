"""Per-request acceptance as a quality signal, end to end: a real ``spectest serve`` (the default:
the embedded pair, draft-model drafting), a real Prometheus with spectest's rules, and a
degenerate workload.

Ordinary questions first: the per-request acceptance histogram fills, and neither tail alert is
pending. Then a prompt that makes the model loop (thirty ``import os`` lines: it answers
``import sys`` over and over, and the draft predicts every token of the loop) becomes most of the
traffic, and Prometheus's own rule evaluation puts ``SpecDecodeRequestsNearFullAcceptance`` into
pending. (A garbled-input prompt does not move this pair's acceptance to either end — measured
~0.5 with both drafters — so the near-zero alert is exercised by its promtool test only.)
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import requests
from prometheus_harness import running_prometheus

from spectest.sweep.embedded import EmbeddedServer

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "alerts" / "spectest.rules.yml"
LOOP = "import os\n" * 30
FULL = "SpecDecodeRequestsNearFullAcceptance"

pytestmark = pytest.mark.timeout(240)


def _complete(url: str, model: str, prompt: str) -> dict:
    resp = requests.post(url + "/v1/completions", json={
        "model": model, "prompt": prompt, "max_tokens": 40, "temperature": 0}, timeout=60)
    resp.raise_for_status()
    return resp.json()


def _pending(prom, name: str) -> list[dict]:
    return prom.query(f'ALERTS{{alertname="{name}", alertstate="pending"}}')


def test_a_looping_workload_puts_the_near_full_acceptance_alert_in_pending(tmp_path):
    server = EmbeddedServer(["--threads", "1"], tmp_path / "serve.log")
    with server as url, running_prometheus({"spectest": f"{url}/metrics"}, tmp_path / "prom",
                                           rule_files=[RULES]) as prom:
        model = requests.get(url + "/v1/models", timeout=10).json()["data"][0]["id"]
        for i in range(4):  # ordinary traffic
            _complete(url, model, f"def parse_config_{i}(path):\n    \"\"\"Read")
        prom.wait_for_scrapes(3)
        assert prom.query("sum(spectest:spec_decode_request_acceptance_rate_count)")
        assert _pending(prom, FULL) == [] and \
            _pending(prom, "SpecDecodeRequestsNearZeroAcceptance") == []
        accepted = [_complete(url, model, LOOP)["spec"] for _ in range(16)]
        assert all(s["accepted_tokens"] / s["draft_tokens"] > 0.95 for s in accepted), accepted
        deadline = time.monotonic() + 30
        while not _pending(prom, FULL) and time.monotonic() < deadline:
            time.sleep(0.5)
        alerts = _pending(prom, FULL)
        assert [a["metric"]["drafter"] for a in alerts] == ["draft-model"]
