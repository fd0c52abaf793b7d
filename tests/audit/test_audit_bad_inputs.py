"""Inputs the audit cannot run on: exit 2, one readable line on stderr, no traceback, and a
report/JUnit file that says why (so CI shows it too)."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET

import pytest
from conftest import run_audit, server

from spectest.loadgen.runner import StubProcess
from spectest.procs import free_port
from tests.proxies import RewritingProxy


def _assert_cannot_run(outcome, *words: str) -> str:
    assert outcome.returncode == 2, outcome.stdout + outcome.stderr
    assert "Traceback" not in outcome.stderr + outcome.stdout
    lines = [x for x in outcome.stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and lines[0].startswith("spectest audit: "), outcome.stderr
    for w in words:
        assert w in lines[0], lines[0]
    return lines[0]


def _assert_files_say_could_not_run(outcome) -> None:
    report = outcome.report
    assert report["verdict"] == "could not run" and report["exit_code"] == 2
    suite = ET.parse(outcome.out / "junit.xml").getroot().find("testsuite")
    # serving and the three checks: none ran
    assert int(suite.get("errors")) == 4 and int(suite.get("failures")) == 0


def test_unreachable_server(tmp_path):
    dead = f"http://127.0.0.1:{free_port()}"
    outcome = run_audit(tmp_path, "--candidate", dead, "--baseline", dead, timeout=60)
    _assert_cannot_run(outcome, "cannot reach the", dead, "is it running?")
    _assert_files_say_could_not_run(outcome)


def test_empty_prompt_file(tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    outcome = run_audit(tmp_path / "out", "--prompts", str(empty), timeout=60)
    _assert_cannot_run(outcome, "prompt set", "no records")
    _assert_files_say_could_not_run(outcome)


def test_malformed_prompt_file(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"prompt": "fine"}) + "\n{not json\n")
    outcome = run_audit(tmp_path / "out", "--prompts", str(bad), timeout=60)
    _assert_cannot_run(outcome, "bad.jsonl:2", "not valid JSON")


def test_missing_prompt_file(tmp_path):
    outcome = run_audit(tmp_path, "--prompts", str(tmp_path / "nope.jsonl"), timeout=60)
    _assert_cannot_run(outcome, "no such file")


@pytest.mark.parametrize("args, words", [
    (("--top-k", "50"), ("--top-k 50 exceeds --logprobs 20",)),
    (("--alpha", "2"), ("alpha must be in (0, 1)",)),
    (("--num-prompts", "0"), ("num-prompts must be >= 1",)),
])
def test_bad_settings(tmp_path, args, words):
    _assert_cannot_run(run_audit(tmp_path, *args, timeout=60), *words)


def test_config_file_unknown_key_and_bad_toml(tmp_path):
    cfg = tmp_path / "audit.toml"
    cfg.write_text('max-kl = 0.1\nmax_kll = 3\n')
    _assert_cannot_run(run_audit(tmp_path, "--config", str(cfg), timeout=60),
                       "unknown setting 'max-kll'")
    cfg.write_text('max-kl = [\n')
    _assert_cannot_run(run_audit(tmp_path, "--config", str(cfg), timeout=60), "not valid TOML")
    cfg.write_text('sampled-control = "always"\n')
    _assert_cannot_run(run_audit(tmp_path, "--config", str(cfg), timeout=60),
                       "sampled-control must be auto, on or off")


class LogprobStripper(RewritingProxy):
    """Forwards to a real spectest server and drops ``logprobs`` from every answer: a server
    that silently ignores the parameter."""

    def rewrite_response(self, body: dict) -> dict:
        for choice in body.get("choices", []):
            choice["logprobs"] = None
        return body


def test_candidate_without_logprobs(correct_url, tmp_path):
    with LogprobStripper(correct_url) as stripped:
        outcome = run_audit(tmp_path, "--candidate", stripped, "--baseline", correct_url,
                            timeout=60)
    _assert_cannot_run(outcome, "the candidate returned no logprobs")
    _assert_files_say_could_not_run(outcome)


def test_candidate_that_rejects_audit_requests(correct_url, tmp_path):
    """An OpenAI-style server that refuses token-id prompts and logprobs (the loadgen stub)."""
    with StubProcess("--ttft-ms", "1", "--itl-ms", "1") as stub:
        outcome = run_audit(tmp_path, "--candidate", stub, "--baseline", correct_url,
                            timeout=60)
    _assert_cannot_run(outcome, "the candidate", "HTTP 400")


def test_baseline_without_echo_scoring(correct_url, tmp_path):
    with StubProcess("--ttft-ms", "1", "--itl-ms", "1") as stub:
        outcome = run_audit(tmp_path, "--candidate", correct_url, "--baseline", stub,
                            timeout=60)
    _assert_cannot_run(outcome, "the baseline", "echo")


def test_mismatched_models(models, correct_url, tmp_path):
    """The draft checkpoint served as a target: same tokenizer, different model."""
    with server(models, drafter="none", target="draft") as other:
        outcome = run_audit(tmp_path, "--candidate", correct_url, "--baseline", other,
                            timeout=120)
    _assert_cannot_run(outcome, "do not serve the same model")


def test_config_file_sets_thresholds_and_the_command_line_wins(correct_url, tmp_path):
    cfg = tmp_path / "audit.json"
    cfg.write_text(json.dumps({"checks": ["greedy"], "num-prompts": 3, "greedy_tokens": 8,
                               "max-kl": 0.5, "seed": 7}))
    outcome = run_audit(tmp_path / "out", "--config", str(cfg), "--candidate", correct_url,
                        "--baseline", correct_url, "--seed", "8", timeout=120)
    assert outcome.returncode == 0, outcome.stderr
    settings = outcome.report["settings"]
    assert settings["checks"] == ["greedy"] and settings["num_prompts"] == 3
    assert settings["max_kl"] == 0.5 and settings["seed"] == 8
    assert list(outcome.report["checks"]) == ["serving", "greedy"]
