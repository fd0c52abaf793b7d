"""The conditions' pieces that need no server: settings and profiles, how a condition's status
and the exit code follow from its checks, the report and summary of conditions, reproducer
files and their replay's errors, and the small rules each condition applies."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace

import pytest

from spectest.audit import gate, runner
from spectest.audit.conditions import statistical_tests
from spectest.audit.conditions.common import CheckResult, ConditionResult
from spectest.audit.conditions.load import acceptance_trend, background_settings
from spectest.audit.conditions.params import _margin
from spectest.audit.conditions.preemption import sized
from spectest.audit.greedy import Divergence
from spectest.audit.replay import load
from spectest.audit.reproducer import Saver
from spectest.audit.run import AuditRun
from spectest.audit.samples import AuditError, Completion, PromptCase
from spectest.audit.settings import AuditSettings, resolve

ROOT = __import__("pathlib").Path(__file__).resolve().parents[2]


def test_profiles_and_named_conditions():
    assert AuditSettings().planned == ("base",)
    full = AuditSettings(profile="full")
    assert full.planned == ("base", "load", "prefix-reuse", "long", "params", "preemption")
    assert statistical_tests(full) == 12 and statistical_tests(AuditSettings()) == 1
    named = AuditSettings(profile="full", conditions=("long", "load"))
    assert named.planned == ("load", "long") and statistical_tests(named) == 1
    with pytest.raises(AuditError, match="profile must be"):
        resolve(None, {"profile": "fast"})
    with pytest.raises(AuditError, match="conditions must be"):
        resolve(None, {"conditions": ("load", "weather")})


def test_the_cli_refuses_an_unknown_condition_in_one_line(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "spectest", "audit", "--conditions",
                           "load,weather", "--out", str(tmp_path)], capture_output=True,
                          text=True, timeout=60, cwd=ROOT)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "choose from base, load, prefix-reuse, long, params, preemption" in proc.stderr


def test_a_condition_settles_from_its_checks():
    ok, bad = CheckResult("greedy", "pass", "ok"), CheckResult("greedy", "fail", "bad")
    assert ConditionResult("x", "t", checks=[ok]).settle().status == "pass"
    assert ConditionResult("x", "t", checks=[ok, bad]).settle(False).status == "fail"
    unmet = ConditionResult("x", "t", checks=[ok]).settle(False, "no hit")
    assert (unmet.status, unmet.reason) == ("not reached", "no hit")
    assert ConditionResult("x", "t").settle(why="refused").status == "not run"


def _run(conditions, named=()) -> AuditRun:
    s = AuditSettings(profile="full", conditions=named, checks=("greedy",))
    run = AuditRun(s, endpoints={"candidate": {"url": "u", "model": "m", "extra": {}},
                                 "baseline": {"url": "u", "model": "m", "extra": {}}},
                   cases=[PromptCase("p", "chat", (1, 2))], tests=12, alpha=0.01 / 12)
    from spectest.audit.greedy import GreedyResult
    run.greedy = GreedyResult(1, 1, (), (), 0, 0.01, None) if "base" in s.planned else None
    run.conditions = conditions
    return run


def test_exit_codes_report_and_summary_of_conditions(tmp_path):
    passed = ConditionResult("long", "long: deep", "pass", checks=[
        CheckResult("greedy (long outputs)", "pass", "exact 3/3")], evidence=["deepest 600"])
    unmet = ConditionResult("preemption", "preemption: over the KV", "not reached",
                            "it preempted nothing", checks=[CheckResult("greedy", "pass", "ok")])
    run = _run([passed, unmet])
    outs = gate.outcomes(run)
    report = gate.build_report(run, outs, 0.0, 1.0)
    assert report["exit_code"] == 0  # a profile's condition the server cannot meet: reported
    text = gate.summary_text(report)
    assert "not run or not reached" in text.splitlines()[0]
    assert "### [NOT REACHED] preemption" in text and "- why: it preempted nothing" in text
    assert "- reached: deepest 600" in text
    # the same condition named by the user makes the audit exit 2
    named = _run([passed, unmet], named=("base", "long", "preemption"))
    assert gate.build_report(named, gate.outcomes(named), 0.0, 1.0)["exit_code"] == 2
    failed = ConditionResult("load", "load", "fail", checks=[CheckResult(
        "distribution (under load)", "fail", "p = 1e-9", "greedy matching", 1e-9, 0.00083,
        "r.json")])
    run = _run([failed])
    report = gate.build_report(run, gate.outcomes(run), 0.0, 1.0)
    assert report["exit_code"] == 1 and report["verdict"] == "drift"
    assert report["checks"]["load: distribution (under load)"]["reproducer"] == "r.json"
    junit = gate.junit_xml(report, gate.outcomes(run)).decode()
    assert 'name="load: distribution (under load)"' in junit and "<failure" in junit


def _completion(tokens, body) -> Completion:
    return Completion(tuple(tokens), (), body=body)


def test_a_reproducer_file_holds_what_replays_it(tmp_path):
    saver = Saver(tmp_path, {"candidate": {"url": "http://c", "model": "m", "extra": {"a": 1}},
                             "baseline": {"url": "http://b", "model": "m", "extra": {}}})
    d = Divergence("p", 4, 7, 9, 0.5, False, None, None, None, "cause")
    path = saver.greedy("prefix-reuse (warm)", d, _completion([1, 7], {"prompt": [1]}),
                        _completion([1, 9], {"prompt": [1]}), [{"path": "/v1/completions",
                                                                "body": {"x": 1}}])
    doc = load(__import__("pathlib").Path(path))
    assert doc["check"] == "greedy" and doc["steps"][0]["body"] == {"x": 1}
    assert doc["observed"]["position"] == 4 and "position 5" in doc["finding"]
    assert path.endswith("01-prefix-reuse-warm-greedy.json")


def test_replay_refuses_bad_files_in_one_line(tmp_path):
    bad = tmp_path / "x.json"
    bad.write_text('{"spectest_reproducer": 1, "check": "greedy"}')
    junk = tmp_path / "y.json"
    junk.write_text("not json")
    proc = subprocess.run([sys.executable, "-m", "spectest", "replay", str(bad), str(junk),
                           str(tmp_path / "missing.json")], capture_output=True, text=True,
                          timeout=60, cwd=ROOT)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "no candidate URL" in proc.stdout and "not JSON" in proc.stdout
    assert proc.stdout.count("COULD NOT RUN") == 3


def test_penalty_margins_are_judged_as_the_server_decided():
    case = PromptCase("p", "chat", (1,))
    cand = _completion([5, 6, 5], {})
    d = Divergence("p", 3, 5, 8, -0.6, True, None, None, None, "")
    # token 5 was generated twice before: presence 1 and frequency 0.5 lower it by 2
    assert _margin(0, case, cand, d, {"presence_penalty": 1.0, "frequency_penalty": 0.5}) \
        == pytest.approx(1.4)
    assert _margin(0, case, cand, d, {"logit_bias": {"8": -3.0}}) == pytest.approx(3.6)


def test_small_rules():
    assert background_settings({"top_k": "x"}) == ({"temperature": 0.0},
                                                   {"temperature": 0.7, "top_p": 0.95},
                                                   {"temperature": 1.0},
                                                   {"temperature": 0.5, "top_p": 0.9})
    assert background_settings({"temperature": "x"}) == ({"temperature": 0.0},)
    assert sized(4096, 8, 12, 170, 320, 3000) == 470  # 8 × (170 + 470) = 5120 = 1.25 × 4096
    assert sized(None, None, 12, 170, 320, 3000) == 320
    falling = [(100, 80)] * 10 + [(100, 20)] * 10
    assert "FELL" in acceptance_trend(falling)
    assert "FELL" not in acceptance_trend([(100, 50)] * 20)
    assert acceptance_trend([(10, 5)] * 4) == ""


def test_the_replay_module_reads_its_own_files(tmp_path):
    saver = Saver(tmp_path, {"candidate": {"url": "http://c"}, "baseline": {"url": "http://b"}})
    path = saver.text("params (stop)", "ends differently", {"stop": ["x"]}, {"stop": ["x"]})
    doc = json.loads(open(path).read())
    assert load(__import__("pathlib").Path(path))["check"] == "text" == doc["check"]
    assert replace(AuditSettings(), candidate_restart="true").candidate_restart == "true"


def test_a_replay_sends_the_candidate_s_requests_under_one_new_salt():
    """The server may still hold what the audit cached later under the recorded salt; the
    replay's steps and request share a new one, so the request hits what its steps cached."""
    from spectest.audit.replay import fresh_namespace

    doc = {"steps": [{"path": "/v1/completions", "body": {"prompt": [1], "cache_salt": "a"}}],
           "request": {"path": "/v1/completions",
                       "candidate": {"prompt": [1, 2], "cache_salt": "a"}},
           "background": {"bodies": [{"prompt": [3], "cache_salt": "b"}, {"prompt": [4]}]}}
    out = fresh_namespace(doc)
    salt = out["steps"][0]["body"]["cache_salt"]
    assert salt not in ("a", "b") and out["request"]["candidate"]["cache_salt"] == salt
    assert out["background"]["bodies"][0]["cache_salt"] not in ("a", "b", salt)
    assert out["background"]["bodies"][1] == {"prompt": [4]}
    assert doc["steps"][0]["body"]["cache_salt"] == "a"  # the file's own record is left alone


def test_a_bad_background_dataset_is_refused_before_any_server_is_reached():
    settings = AuditSettings(candidate="http://127.0.0.1:9", baseline="http://127.0.0.1:9",
                             conditions=("load",), load_workload="nope")
    error = runner.run(settings).error
    assert error.startswith("--load-workload: dataset 'nope': no such file"), error
