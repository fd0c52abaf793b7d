"""``scripts/install_vllm.sh`` fails in one readable line, without leaving a half environment."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_a_failed_install_says_why_and_leaves_nothing(tmp_path):
    env = {**os.environ, "SPECTEST_CACHE": str(tmp_path), "PYTHON": "false"}
    proc = subprocess.run(["bash", str(ROOT / "scripts" / "install_vllm.sh")], env=env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "venv" in errors[0], proc.stderr
    assert not (tmp_path / "vllm" / "0.32.0" / "venv" / ".spectest-complete").exists()
