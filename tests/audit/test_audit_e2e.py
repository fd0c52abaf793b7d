"""The gate on the bundled engine: correct speculation passes, each injected fault fails the
check that should catch it, with a report that points at the cause.

Real servers (``spectest serve``) on loopback, the real CLI in a subprocess, real reports.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from urllib.parse import urlparse

import pytest
from conftest import ROOT, run_audit, server, small

from spectest.procs import python_env


def _junit(outcome) -> dict[str, str]:
    """JUnit test case name → "pass" | "failure" | "error"."""
    root = ET.parse(outcome.out / "junit.xml").getroot()
    out = {}
    for case in root.iter("testcase"):
        kinds = [child.tag for child in case if child.tag in ("failure", "error")]
        out[case.get("name")] = kinds[0] if kinds else "pass"
    return out


def _assert_correct(outcome) -> None:
    assert outcome.returncode == 0, outcome.stdout + outcome.stderr
    report = outcome.report
    assert report["verdict"] == "pass" and report["exit_code"] == 0
    greedy = report["checks"]["greedy"]
    # 100% exact, or every divergence a documented floating-point tie
    assert greedy["exact"] + len(greedy["ties"]) == greedy["prompts"]
    assert not greedy["divergences"]
    kl = report["checks"]["logprobs"]["all"]
    assert kl["positions"] > 500 and kl["mean_kl"] < 1e-6 and kl["max_abs_logprob"] < 1e-3
    dist = report["checks"]["distribution"]
    assert dist["status"] == "pass" and dist["violations"] == 0 and dist["tested_tokens"] > 300
    assert report["candidate_speculation"]["sampled"]["drafts"] > 0  # it really speculated
    assert _junit(outcome) == {"serving": "pass", "greedy": "pass", "logprobs": "pass",
                               "distribution": "pass"}
    assert "PASS" in (outcome.out / "summary.md").read_text()


def test_correct_draft_model_speculation_passes_on_one_server_ab(correct_url, tmp_path):
    """Same URL twice: the candidate's requests carry speculative=true, the baseline's false."""
    outcome = run_audit(tmp_path, "--candidate", correct_url, "--baseline", correct_url,
                        *small(), "--progress")
    _assert_correct(outcome)
    eps = outcome.report["endpoints"]
    assert eps["candidate"]["extra"] == {"speculative": True}
    assert eps["baseline"]["extra"] == {"speculative": False}
    assert "sampling" in outcome.stderr  # the progress bar ran
    assert "Traceback" not in outcome.stderr


def test_correct_ngram_speculation_passes_embedded(models, tmp_path):
    """Both sides 'embedded': the auditor starts the bundled server itself and stops it."""
    outcome = run_audit(tmp_path, "--candidate", "embedded", "--baseline", "embedded",
                        "--embedded-model", str(models / "target"), "--embedded-draft",
                        str(models / "draft"), "--embedded-drafter", "ngram", *small())
    _assert_correct(outcome)
    url = outcome.report["endpoints"]["candidate"]["url"]
    port = urlparse(url).port
    with socket.socket() as s:  # the embedded server is gone
        assert s.connect_ex(("127.0.0.1", port)) != 0


def test_correct_disaggregated_speculation_passes(models, tmp_path):
    """The draft in its own ``spectest serve-draft`` process (``serve --draft-url``): the same
    exact speculation, so the same verdict as co-located."""
    from spectest.audit.servers import ServerProcess, ServerSpec
    from spectest.sweep.embedded import EmbeddedServer
    draft = EmbeddedServer(["--draft", str(models / "draft"), "--threads", "1"],
                           tmp_path / "draft-server.log", subcommand="serve-draft")
    with draft as draft_url:
        spec = ServerSpec(str(models / "target"), str(models / "draft"), "draft-model", 4, 1,
                          ("--draft-url", draft_url))
        with ServerProcess(spec) as url:
            outcome = run_audit(tmp_path / "audit", "--candidate", url, "--baseline", url,
                                *small())
    _assert_correct(outcome)
    drafts = outcome.report["candidate_speculation"]["sampled"]
    assert drafts["drafts"] > 0


# fault → (checks to run, the check that must fail, words the cause must contain, sizes)
FAULTS = {
    "kv-rewind-off-by-one": ("greedy,logprobs", "greedy", "KV-cache", small()),
    "greedy-verify-sampled": ("distribution,logprobs", "distribution", "greedy matching",
                              small()),
    "draft-only-temperature": ("distribution,logprobs", "distribution", "temperature",
                               small()),
    "draft-only-top-p": ("distribution,logprobs", "distribution", "top-p", small()),
    "lossy-threshold": ("distribution,logprobs", "distribution", "lossy acceptance",
                        small(prompts=16, samples=12, tokens=32)),
}


@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_injected_fault_fails_the_right_check_and_names_the_cause(fault, models, correct_url,
                                                                   tmp_path):
    checks, failing, cause, sizes = FAULTS[fault]
    with server(models, faults=(fault,)) as bad_url:
        outcome = run_audit(tmp_path, "--candidate", bad_url, "--baseline", correct_url,
                            "--baseline-extra", '{"speculative": false}', "--checks", checks,
                            *sizes)
    assert outcome.returncode == 1, outcome.stdout + outcome.stderr
    report = outcome.report
    assert report["verdict"] == "drift"
    assert report["checks"][failing]["status"] == "fail"
    assert cause in report["checks"][failing]["cause"], report["checks"][failing]
    assert cause in (outcome.out / "summary.md").read_text()
    assert _junit(outcome)[failing] == "failure"
    if failing == "distribution":  # the model is right, the sampler is wrong
        assert report["checks"]["logprobs"]["status"] == "pass"
    else:  # the state is wrong: the logprob check sees it too, and not at the prefill token
        assert report["checks"]["logprobs"]["status"] == "fail"
        assert report["checks"]["logprobs"]["first_token"]["max_kl"] < 1e-6
        first = report["checks"]["greedy"]["divergences"][0]
        assert first["index"] >= 1 and first["margin"] > 0.01
    assert len(report["worst_prompts"]) == 5
    if failing == "greedy":
        assert "greedy diverges" in report["worst_prompts"][0]["problems"][0]


@pytest.mark.parametrize("sigint", [signal.SIG_DFL, signal.SIG_IGN],
                         ids=["sigint-default", "sigint-ignored"])
def test_a_cancelled_audit_keeps_the_checks_that_finished(correct_url, tmp_path, sigint):
    """SIGTERM (a cancelled CI job) during the sampled phase: exit 2, greedy result kept —
    also where SIGINT is ignored, as in a job a script started in the background (the audit
    once re-sent SIGTERM as SIGINT, and there it ran on to a verdict)."""
    argv = [sys.executable, "-m", "spectest.audit", "--candidate", correct_url, "--baseline",
            correct_url, "--out", str(tmp_path), "--progress", *small(prompts=8, samples=16)]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT,
                            env=python_env(),
                            preexec_fn=lambda: signal.signal(signal.SIGINT, sigint))
    seen, deadline = b"", time.monotonic() + 120
    while b"sampling" not in seen and time.monotonic() < deadline:
        chunk = os.read(proc.stderr.fileno(), 4096)  # the progress bar says where it is
        if not chunk:
            break
        seen += chunk
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert b"sampling" in seen and proc.returncode == 2, (seen + err)[-2000:]
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["interrupted"] and report["verdict"] == "could not run"
    assert report["checks"]["greedy"]["status"] == "pass"
    assert report["checks"]["distribution"]["status"] == "not run"
    assert b"Traceback" not in err and b"RuntimeWarning" not in err


def test_correct_speculation_passes_against_the_baselines_own_samples(correct_url, tmp_path):
    """``--sampled-control on``: the sampled check compares the candidate's continuations with
    continuations the baseline sampled itself (the route ``auto`` takes where the noise floor
    shows the scoring is not the distribution a server samples from, as on int8 SmolLM2)."""
    outcome = run_audit(tmp_path, "--candidate", correct_url, "--baseline", correct_url,
                        *small(), "--sampled-control", "on")
    _assert_correct(outcome)
    dist = outcome.report["checks"]["distribution"]
    assert dist["test"]["method"] == "two-sample" and dist["test"]["permutations"] > 0
    assert dist["test"]["control_n"] > 300 and dist["control"]["baseline_violations"] == 0
    assert "sampled itself" in outcome.report["routes"]["distribution"]


@pytest.mark.parametrize("fault", ["greedy-verify-sampled", "draft-only-temperature"])
def test_faults_are_caught_against_the_baselines_own_samples(fault, models, correct_url,
                                                             tmp_path):
    """Comparing two noisy arms costs power (the lossy threshold, the subtlest fault, goes from
    caught to p = 0.21 at 16 prompts x 12 samples: ``auto`` keeps the one-sample test where
    the scoring is exact), but the faults that change the distribution plainly are caught."""
    checks, failing, cause, sizes = FAULTS[fault]
    with server(models, faults=(fault,)) as bad_url:
        outcome = run_audit(tmp_path, "--candidate", bad_url, "--baseline", correct_url,
                            "--baseline-extra", '{"speculative": false}', "--checks", checks,
                            "--sampled-control", "on", *sizes)
    assert outcome.returncode == 1, outcome.stdout + outcome.stderr
    dist = outcome.report["checks"]["distribution"]
    assert dist["status"] == "fail" and cause in dist["cause"], dist
    assert dist["test"]["method"] == "two-sample"
