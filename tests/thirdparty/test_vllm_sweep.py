"""``spectest sweep`` against real vLLM as a user runs it: a speculative server (``--host``) and a
plain one (``--baseline-host``). It finishes, reads acceptance from ``vllm:`` counters, and its
report renders with the request counts behind every verdict."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[2]


def test_a_short_sweep_of_vllm_finishes_with_verdicts(vllm, tmp_path):
    out = tmp_path / "sweep"
    proc = subprocess.run([sys.executable, "-m", "spectest", "sweep", "--host", vllm.ngram,
                           "--baseline-host", vllm.plain, "--workloads", "code",
                           "--steps", "1,2", "--step-time", "5", "--warmup", "0",
                           "--max-tokens", "32", "--min-requests-per-step", "3",
                           "--max-step-time", "10",
                           "--out", str(out)],
                          capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "Traceback" not in proc.stdout + proc.stderr
    steps = pd.read_csv(out / "steps.csv")
    assert len(steps) == 4 and (steps.failures == 0).all()
    spec = steps[steps.arm == "spec"]
    assert (spec.acceptance_source == "vllm").all() and spec.acceptance_rate.notna().all()
    assert (steps.requests - steps.failures >= 3).all()
    report = (out / "report.md").read_text()
    assert "n = " in report
    assert (out / "report.html").exists() and (out / "plots" / "speedup.png").exists()
