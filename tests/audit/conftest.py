"""Audit-test fixtures: the model pair, a correct bundled server, and the CLI as a subprocess.

The pair is ``$SPECTEST_TEST_MODELS`` (a directory with ``target/`` and ``draft/``), by default
the embedded pair in ``spectest/models``.  Servers are real ``spectest serve`` processes on
loopback ports; the auditor runs as ``python -m spectest.audit`` with a timeout, so every test
bounds itself.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from spectest.audit.servers import ServerProcess, ServerSpec, fault_args
from spectest.procs import python_env


def models_dir() -> Path:
    return Path(os.environ.get("SPECTEST_TEST_MODELS", ROOT / "spectest" / "models"))


@pytest.fixture(scope="session")
def models() -> Path:
    root = models_dir()
    if not (root / "target" / "config.json").is_file() or not (root / "draft").is_dir():
        pytest.skip(f"no model pair in {root} (set SPECTEST_TEST_MODELS)")
    return root


def server(models: Path, drafter: str = "draft-model", faults: tuple[str, ...] = (),
           target: str = "target", extra: tuple[str, ...] = ()) -> ServerProcess:
    return ServerProcess(ServerSpec(str(models / target), str(models / "draft"), drafter, 4, 1,
                                    fault_args(faults) + extra))


@pytest.fixture(scope="session")
def correct_url(models):
    """One correct speculative server (draft-model drafter) for the whole session."""
    with server(models) as url:
        yield url


@dataclass(frozen=True)
class AuditOutcome:
    returncode: int
    stdout: str
    stderr: str
    out: Path

    @property
    def report(self) -> dict:
        return json.loads((self.out / "report.json").read_text())

    def check(self, name: str) -> dict:
        return self.report["checks"][name]


def run_audit(out: Path, *args: str, timeout: float = 240) -> AuditOutcome:
    """``python -m spectest.audit ARGS --out OUT --no-progress`` (bounded by ``timeout``)."""
    argv = [sys.executable, "-m", "spectest.audit", *args, "--out", str(out)]
    if "--progress" not in args:
        argv.append("--no-progress")
    env = python_env()
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, cwd=ROOT,
                          env=env, check=False)
    return AuditOutcome(proc.returncode, proc.stdout, proc.stderr, out)


def small(prompts: int = 8, samples: int = 4, tokens: int = 24) -> tuple[str, ...]:
    """Smaller than the defaults, to keep the suite fast (the benchmark runs the defaults)."""
    return ("--num-prompts", str(prompts), "--samples-per-prompt", str(samples),
            "--sample-tokens", str(tokens), "--greedy-tokens", "32")
