"""The audit's conditions on the bundled engine: each conditional fault is caught by the
condition that targets it — and the summary names that condition and saves a reproducer that
replays — while a correct server passes every condition of the full profile.

The faults (``engine.faults.CONDITIONAL``) are wrong only in mixed batches, past position 256,
on a prefix-cache hit, for the penalties, or after some requests: the base audit's fresh short
prompts in quiet batches pass them (``test_engine_faults_conditional`` shows each is silent
without its condition). Real ``spectest serve`` processes, the CLI in a subprocess.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT, run_audit, server

from spectest.procs import python_env

# fault → (the condition that targets it, server flags, audit flags: small sizes)
SMALL = ("--num-prompts", "8", "--samples-per-prompt", "4", "--sample-tokens", "24",
         "--greedy-tokens", "32")
CASES = {
    "mixed-batch-greedy": ("load", (), ("--load-prompts", "6", "--load-concurrency", "4")),
    "decay-after-requests": ("load", ("--fault-after", "40"),
                             ("--load-prompts", "6", "--load-concurrency", "4")),
    "rewind-past-256": ("long", (), ("--long-tokens", "300", "--long-prompts", "2",
                                     "--long-prompt-tokens", "600", "--turns", "2")),
    "prefix-hit-stale-kv": ("prefix-reuse", (), ("--prefix-prompts", "4")),
    "draft-only-penalties": ("params", (), ("--params-prompts", "3", "--params-samples", "3",
                                            "--params-tokens", "16")),
}


def _condition(report: dict, name: str) -> dict:
    return next(c for c in report["conditions"] if c["name"] == name)


@pytest.mark.parametrize("fault", sorted(CASES))
def test_each_conditional_fault_is_caught_by_the_condition_that_targets_it(fault, models,
                                                                          tmp_path):
    condition, serve_flags, flags = CASES[fault]
    with server(models, faults=(fault,), extra=serve_flags) as url:
        outcome = run_audit(tmp_path, "--candidate", url, "--baseline", url, "--conditions",
                            condition, *SMALL, *flags)
    assert outcome.returncode == 1, outcome.stdout + outcome.stderr
    cond = _condition(outcome.report, condition)
    assert cond["status"] == "fail", cond
    assert cond["evidence"]  # it says how the condition was met
    failed = [c for c in cond["checks"] if c["status"] == "fail"]
    assert failed and all(c["reproducer"] and Path(c["reproducer"]).is_file() for c in failed)
    summary = (outcome.out / "summary.md").read_text()
    assert summary.startswith("# spectest audit: DRIFT FOUND (exit 1)")
    assert f"### [FAIL] {condition}" in summary


def test_a_correct_server_passes_every_condition_of_the_full_profile(models, tmp_path):
    """The embedded pair, started by the audit (with the KV budget that makes the preemption
    condition preempt), every condition run and reached."""
    outcome = run_audit(tmp_path, "--candidate", "embedded", "--baseline", "embedded",
                        "--embedded-model", str(models / "target"), "--embedded-draft",
                        str(models / "draft"), "--profile", "full", *SMALL,
                        "--load-prompts", "4", "--load-concurrency", "4",
                        "--prefix-prompts", "3", "--long-tokens", "300", "--long-prompts", "2",
                        "--long-prompt-tokens", "600", "--turns", "2", "--params-prompts", "3",
                        "--params-samples", "3", "--params-tokens", "16",
                        "--preemption-requests", "10", timeout=600)
    assert outcome.returncode == 0, outcome.stdout + outcome.stderr
    report = outcome.report
    assert [c["name"] for c in report["conditions"]] == ["load", "prefix-reuse", "long",
                                                         "params", "preemption"]
    assert all(c["status"] == "pass" for c in report["conditions"]), report["conditions"]
    assert report["statistical_tests"] == 12 and report["alpha_each"] == pytest.approx(0.01 / 12)
    assert not report["reproducers"]


def test_a_saved_reproducer_replays_the_divergence_against_real_servers(models, tmp_path):
    with server(models, faults=("prefix-hit-stale-kv",)) as url:
        outcome = run_audit(tmp_path / "audit", "--candidate", url, "--baseline", url,
                            "--conditions", "prefix-reuse", "--checks", "greedy,logprobs",
                            *SMALL, "--prefix-prompts", "3")
        files = [p for p in outcome.report["reproducers"] if "greedy" in Path(p).name]
        assert files, outcome.report["reproducers"]
        replay = subprocess.run([sys.executable, "-m", "spectest", "replay", files[0]],
                                capture_output=True, text=True, timeout=120, cwd=ROOT,
                                env=python_env(), check=False)
    assert replay.returncode == 1, replay.stdout + replay.stderr
    out = replay.stdout
    assert "REPRODUCED" in out and "first difference at generated position" in out
    assert "on the candidate" in out and "on the baseline" in out  # both probabilities
