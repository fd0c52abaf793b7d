"""``spectest sweep`` against llama.cpp's llama-server, as a user runs it: a speculative server
(``--host``) and a plain one (``--baseline-host``), since llama-server has no per-request switch
that turns speculation off. The sweep finishes, reads acceptance from ``llamacpp:`` counters,
and its report renders with the request counts behind every verdict. Without a baseline host
the sweep refuses in one line instead of measuring two speculative arms."""

from __future__ import annotations

import subprocess
import sys

import pandas as pd
from conftest import ROOT


def sweep(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "spectest", "sweep", *args],
                          capture_output=True, text=True, timeout=900, cwd=ROOT)


def test_a_short_sweep_of_llama_server_finishes_and_its_report_renders(llama_pair, tmp_path):
    spec_url, base_url = llama_pair
    out = tmp_path / "sweep"
    proc = sweep("--host", spec_url, "--baseline-host", base_url, "--workloads", "code",
                 "--steps", "1,2", "--step-time", "4", "--warmup", "0", "--max-tokens", "16",
                 "--min-requests-per-step", "3", "--max-step-time", "8", "--out", str(out))
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "Traceback" not in proc.stdout + proc.stderr
    steps = pd.read_csv(out / "steps.csv")
    assert len(steps) == 4 and (steps.failures == 0).all()
    spec = steps[steps.arm == "spec"]
    assert (spec.acceptance_source == "llamacpp").all() and spec.acceptance_rate.notna().all()
    assert (steps.requests - steps.failures >= 3).all()  # steps ran on until they had enough
    assert set(steps.looks) <= {1, 2} and steps.decided.notna().all()
    report = (out / "report.md").read_text()
    assert "n = " in report  # every verdict says how many requests it rests on
    assert (out / "report.html").exists() and (out / "plots" / "speedup.png").exists()


def test_one_llama_server_without_a_baseline_is_refused_in_one_line(llama_pair, tmp_path):
    spec_url, _ = llama_pair
    proc = sweep("--host", spec_url, "--workloads", "code", "--steps", "1", "--step-time", "2",
                 "--out", str(tmp_path / "sweep"))
    assert proc.returncode != 0
    assert "Traceback" not in proc.stdout + proc.stderr
    assert "llama.cpp" in proc.stdout + proc.stderr and "--baseline-host" in proc.stdout + proc.stderr
