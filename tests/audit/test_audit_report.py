"""Verdicts and report files from audit results (no servers): exit codes, JSON, JUnit XML,
the human summary, partial results on interruption, atomic writes, settings precedence."""

from __future__ import annotations

import json
import os
import xml.etree.ElementTree as ET

import pytest

from spectest.audit import gate
from spectest.audit.greedy import Divergence, GreedyResult
from spectest.audit.logprobs import PositionDiff, Thresholds
from spectest.audit.logprobs import check as logprob_check
from spectest.audit.run import AuditRun
from spectest.audit.samples import AuditError, PromptCase
from spectest.audit.settings import AuditSettings, read_config, resolve

CASES = [PromptCase("code-1", "code", (1, 2, 3)), PromptCase("chat-2", "chat", (4, 5))]


def _greedy(failures=()) -> GreedyResult:
    return GreedyResult(2, 2 - len(failures), (), tuple(failures), 0, 0.01, 40)


def _bug() -> Divergence:
    return Divergence("code-1", 3, 8, 7, 2.5, False, 2.4, True, 5,
                      "wrong state after speculative rounds (KV-cache rewind/append)")


def _run(**kw) -> AuditRun:
    settings = AuditSettings(candidate="http://a", baseline="http://b",
                             checks=kw.pop("checks", ("greedy", "logprobs")))
    diffs = [PositionDiff("code-1", 0, 1, 0.0, 0.0, False, True),
             PositionDiff("code-1", 3, 8, kw.pop("kl", 0.0), 0.0, False, True)]
    run = AuditRun(settings, endpoints={"candidate": {"url": "http://a", "model": "m",
                                                      "extra": {}},
                                        "baseline": {"url": "http://b", "model": "m",
                                                     "extra": {}}},
                   cases=list(CASES), diffs=diffs, **kw)
    if run.logprobs is None and "logprobs" in settings.checks and not run.error:
        run.logprobs = logprob_check(diffs, Thresholds())
    return run


def _write(run: AuditRun, tmp_path):
    outs = gate.outcomes(run)
    report = gate.build_report(run, outs, 0.0, 1.5)
    paths = gate.write_all(tmp_path, report, outs)
    return report, paths


def test_pass_is_exit_0_with_clean_files(tmp_path):
    report, paths = _write(_run(greedy=_greedy()), tmp_path)
    assert report["exit_code"] == 0 and report["verdict"] == "pass"
    assert json.loads(paths["json"].read_text())["checks"]["greedy"]["status"] == "pass"
    suite = ET.parse(paths["junit"]).getroot().find("testsuite")
    assert suite.get("tests") == "3" and suite.get("failures") == "0"  # serving, greedy, logprobs
    assert report["checks"]["serving"]["status"] == "pass"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["junit.xml", "report.json",
                                                          "summary.md"]  # no temp files left


def test_drift_is_exit_1_and_every_file_points_at_the_failing_check(tmp_path):
    run = _run(greedy=_greedy([_bug()]), kl=0.7)
    report, paths = _write(run, tmp_path)
    assert report["exit_code"] == 1 and report["verdict"] == "drift"
    assert report["checks"]["greedy"]["divergences"][0]["margin"] == 2.5
    assert report["checks"]["logprobs"]["status"] == "fail"
    assert "prefill" in report["checks"]["logprobs"]["cause"]  # first token fine, later not
    cases = {c.get("name"): c for c in ET.parse(paths["junit"]).getroot().iter("testcase")}
    failure = cases["greedy"].find("failure")
    assert failure is not None and "position 4" in failure.get("message")
    assert "KV-cache" in failure.text
    summary = paths["summary"].read_text()
    assert "DRIFT FOUND" in summary and "`code-1`" in summary and "KV-cache" in summary
    assert report["worst_prompts"][0]["id"] == "code-1"
    assert "greedy diverges at position 4" in report["worst_prompts"][0]["problems"][0]


def test_could_not_run_is_exit_2_with_errors_in_junit(tmp_path):
    run = _run(error="cannot reach the candidate (http://a): refused; is it running?")
    report, paths = _write(run, tmp_path)
    assert report["exit_code"] == 2 and report["verdict"] == "could not run"
    suite = ET.parse(paths["junit"]).getroot().find("testsuite")
    assert suite.get("errors") == "3" and suite.get("failures") == "0"
    assert "is it running?" in paths["summary"].read_text()


def test_interrupted_run_keeps_finished_checks(tmp_path):
    run = _run(greedy=_greedy(), checks=("greedy", "distribution"), interrupted=True,
               error="interrupted; the checks that finished are kept")
    report, _ = _write(run, tmp_path)
    assert report["exit_code"] == 2 and report["interrupted"]
    assert report["checks"]["greedy"]["status"] == "pass"
    assert report["checks"]["distribution"]["status"] == "not run"
    # …but a drift found before the interruption is still a drift
    run = _run(greedy=_greedy([_bug()]), checks=("greedy", "distribution"), interrupted=True,
               error="interrupted")
    assert _write(run, tmp_path)[0]["exit_code"] == 1


def test_atomic_write_keeps_the_old_file_when_writing_fails(tmp_path, monkeypatch):
    target = tmp_path / "report.json"
    gate.write_atomic(target, b"old")

    def boom(*a, **k):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", boom)  # the one spectest.files' writer renames with
    with pytest.raises(OSError):
        gate.write_atomic(target, b"new")
    assert target.read_bytes() == b"old" and [p.name for p in tmp_path.iterdir()] == [
        "report.json"]


def test_settings_precedence_and_config_files(tmp_path):
    toml = tmp_path / "a.toml"
    toml.write_text('[audit]\nmax-kl = 0.5\nchecks = ["greedy"]\ncandidate-extra = '
                    '{speculative = true}\n')
    cfg = read_config(toml)
    s = resolve(cfg, {"max_kl": 0.25, "seed": None})
    assert s.max_kl == 0.25 and s.checks == ("greedy",) and s.candidate_extra == {
        "speculative": True}
    with pytest.raises(AuditError, match="unknown setting 'max-kll'"):
        resolve({"max_kll": 1}, {})
    with pytest.raises(AuditError, match="setting temperature"):
        resolve({"temperature": "hot"}, {})
    with pytest.raises(AuditError, match="only known at temperature 1"):
        resolve({}, {"top_k": 0})
    assert resolve({}, {"top_k": 0, "temperature": 1.0, "top_p": 1.0}).top_k == 0


def test_the_example_ci_workflow_calls_the_audit_with_valid_flags():
    import shlex
    from pathlib import Path

    import yaml

    from spectest.audit.cli import build_parser

    root = Path(__file__).resolve().parents[2]
    flow = yaml.safe_load((root / "docs" / "ci-audit-example.yml").read_text())
    steps = flow["jobs"]["audit"]["steps"]
    env = flow["jobs"]["audit"]["env"]
    runs = [s["run"] for s in steps if "spectest audit" in s.get("run", "")]
    assert len(runs) == 1
    command = runs[0].split("\n# ")[0].replace("\\\n", " ")
    command = "\n".join(x for x in command.splitlines() if not x.strip().startswith("#"))
    for k, v in env.items():
        command = command.replace(f'"${k}"', v)
    argv = shlex.split(command)
    assert argv[:2] == ["spectest", "audit"]
    args = build_parser().parse_args(argv[2:])
    assert args.candidate == env["CANDIDATE"] and args.out == "audit-report"
    assert any("upload-artifact" in s.get("uses", "") for s in steps)
    assert any("junit.xml" in json.dumps(s.get("with", {})) for s in steps)
