"""``spectest audit`` against llama.cpp's llama-server: a server without ``echo``.

The baseline scores the candidate's tokens by generating after each prefix (``scoring.py``);
the candidate reports no logprobs for tokens it accepted from a draft, and those positions are
counted, not compared; llama.cpp's own batch-shape noise is measured (the baseline against
itself) and the tolerances widen to it. Asserted: speculative vs plain llama-server passes all
three checks, with every route named in the report; two lossy candidates fail — llama.cpp's
synthetic-acceptance benchmarking mode, and a proxy that quietly lowers the temperature of
sampled requests (a sampling setting applied to only one side); and text prompts (for servers
that refuse token ids) still pass, with the re-tokenisation cost counted.
"""

from __future__ import annotations

import json
import subprocess
import sys

from conftest import ROOT, draft_spec

from spectest.thirdparty.llama_server import LlamaServer
from tests.proxies import RewritingProxy

# One request at a time per server: llama-server batches the requests of its slots together and
# its logits depend on the batch's shape, so at concurrency > 1 a greedy near-tie can go either
# way depending on what else was in flight (seen once in CI: a 0.23-nat margin). What these
# tests claim is about speculation and about the auditor, so that noise is kept out.
SMALL = ["--num-prompts", "6", "--greedy-tokens", "24", "--samples-per-prompt", "4",
         "--sample-tokens", "16", "--prompts", "mixed", "--no-progress", "--concurrency", "1"]


def audit(out, candidate: str, baseline: str, *args: str):
    proc = subprocess.run([sys.executable, "-m", "spectest", "audit", "--candidate", candidate,
                           "--baseline", baseline, "--out", str(out), *SMALL, *args],
                          capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert "Traceback" not in proc.stderr + proc.stdout, proc.stderr[-2000:]
    report = json.loads((out / "report.json").read_text())
    return proc, report


def test_speculative_llama_server_passes_every_check_on_its_routes(llama_pair, tmp_path):
    spec_url, base_url = llama_pair
    proc, report = audit(tmp_path, spec_url, base_url)
    assert proc.returncode == 0, (tmp_path / "summary.md").read_text()
    assert {c["status"] for c in report["checks"].values()} == {"pass"}
    assert report["endpoints"]["candidate"]["server"] == "llama.cpp"
    assert "generation after each prefix" in report["endpoints"]["baseline"]["routes"]["scoring"]
    assert set(report["routes"]) == {"greedy", "logprobs", "distribution"}
    spec = report["candidate_speculation"]["greedy"]
    assert spec["draft_tokens"] > 0 and spec["drafts"] is None
    # tokens taken from drafts carry no logprobs in llama.cpp: counted, never read as p = 1
    assert report["coverage"]["candidate_unreported"] > 0
    assert report["noise_floor"]["positions"] > 0
    summary = (tmp_path / "summary.md").read_text()
    assert "noise floor" in summary and "route:" in summary


def test_synthetic_acceptance_mode_is_caught(llama_pair, smollm2_gguf, tmp_path):
    """--spec-synth-rates accepts drafts with fixed per-position odds whatever the target says:
    llama.cpp itself declares the output invalid. The audit must not pass it."""
    _, base_url = llama_pair
    lossy = draft_spec(smollm2_gguf, synth_rates=(0.9, 0.7, 0.5, 0.3))
    with LlamaServer(lossy, tmp_path / "synth.log") as synth_url:
        proc, report = audit(tmp_path / "out", synth_url, base_url)
    assert proc.returncode == 1, (tmp_path / "out" / "summary.md").read_text()
    assert report["checks"]["distribution"]["status"] == "fail"


class TemperatureProxy(RewritingProxy):
    """Forwards to a real server and multiplies the temperature of sampled requests by
    ``factor``: a sampling setting that reaches only one side."""

    def __init__(self, upstream: str, factor: float):
        super().__init__(upstream)
        self.factor = factor

    def rewrite_request(self, body: dict) -> dict:
        if (body.get("temperature") or 0) > 0:
            body["temperature"] *= self.factor
        return body


def test_a_proxy_that_lowers_the_temperature_is_caught(llama_pair, tmp_path):
    spec_url, base_url = llama_pair
    with TemperatureProxy(spec_url, factor=0.6) as lossy:
        proc, report = audit(tmp_path, lossy, base_url, "--candidate-flavour", "llamacpp")
    assert proc.returncode == 1, (tmp_path / "summary.md").read_text()
    dist = report["checks"]["distribution"]
    assert dist["status"] == "fail" and dist["test"]["z"] > 0  # sharper than asked
    assert report["checks"]["greedy"]["status"] == "pass"  # temperature 0 is untouched


def test_text_prompts_still_audit_and_count_the_retokenisation(llama_pair, tmp_path):
    spec_url, base_url = llama_pair
    proc, report = audit(tmp_path, spec_url, base_url, "--prompt-format", "text",
                         "--checks", "greedy,logprobs")
    assert proc.returncode == 0, (tmp_path / "summary.md").read_text()
    for role in ("candidate", "baseline"):
        assert report["endpoints"][role]["routes"]["prompts"].startswith("text")
    assert "re-tokenised" in report["routes"]["greedy"]
