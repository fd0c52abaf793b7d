"""alerts/*.rules.yml: promtool accepts every generated file, the unit tests pass and can fail, and
every rule agrees with its flavour's series and labels, the histogram bucket edges, the
dashboards' thresholds and the runbooks."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from prometheus_client.utils import floatToGoString

from alerts.catalogue import DEPLOYMENTS
from dashboards import panels
from dashboards.flavours import SCRAPE_LABELS, for_server
from dashboards.promql import metric_names, rule_expressions
from spectest import flavours
from spectest.telemetry import names

ROOT = Path(__file__).resolve().parents[2]
ALERTS_DIR = ROOT / "alerts"
RULE_FILES = sorted(ALERTS_DIR.glob("*.rules.yml"))
RULES = ALERTS_DIR / "spectest.rules.yml"
UNIT_TESTS = sorted((ALERTS_DIR / "tests").glob("*.yml"))
README = ALERTS_DIR / "README.md"


def flavour_of(path: Path) -> flavours.Flavour:
    return flavours.get(path.name.removesuffix(".rules.yml"))


ALERTS = [(flavour_of(p), r) for p in RULE_FILES for r in rule_expressions(p) if r.is_alert]
IDS = [r.name for _, r in ALERTS]

# The alerts each rule file must hold, by file and alert name.
REQUIRED = {
    "spectest": {"SpecDecodeAcceptanceRateLow", "SpecDecodeAcceptedLengthNearOne",
                 "SpecDecodeDrafterFailing", "SpecDecodeRequestsNearZeroAcceptance",
                 "SpecDecodeRequestsNearFullAcceptance", "SpectestTTFTSLOBreach",
                 "SpectestTPOTSLOBreach",
                 "SpectestHighErrorRate",
                 "SpectestRequestsRefused", "SpectestQueueGrowing", "SpectestMetricsAbsent"},
    "llamacpp": {"LlamacppSpecDecodeAcceptanceRateLow", "LlamacppSpecDecodeAcceptedLengthNearOne",
                 "LlamacppQueueGrowing", "LlamacppMetricsAbsent"},
    "vllm": {"VllmSpecDecodeAcceptanceRateLow", "VllmSpecDecodeAcceptedLengthNearOne",
             "VllmTTFTSLOBreach", "VllmTPOTSLOBreach", "VllmHighErrorRate", "VllmQueueGrowing",
             "VllmMetricsAbsent"},
}


def promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        msg = "promtool not found: run scripts/install_prometheus.sh (Debian package prometheus)"
        if os.environ.get("CI"):
            pytest.fail(msg)
        pytest.skip(msg)
    return path


def run(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([promtool(), *args], cwd=cwd, capture_output=True, text=True,
                          timeout=120)


def test_required_alerts_are_present():
    found: dict[str, set[str]] = {}
    for f, alert in ALERTS:
        found.setdefault(f.key, set()).add(alert.name)
    assert found == REQUIRED


def test_no_latency_alerts_without_histograms():
    text = (ALERTS_DIR / "llamacpp.rules.yml").read_text()
    assert "No latency SLO alerts" in text.split("groups:")[0]
    assert "_bucket" not in text and "SLOBreach" not in text.split("groups:")[1]


@pytest.mark.parametrize("path", RULE_FILES, ids=lambda p: p.name)
def test_promtool_check_rules(path):
    result = run("check", "rules", str(path))
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(rule_expressions(path))} rules found" in result.stdout


def test_promtool_check_rejects_a_broken_expression(tmp_path):
    broken = tmp_path / "broken.rules.yml"
    broken.write_text(RULES.read_text().replace("absent(spectest:num_requests_running)",
                                                "absent(spectest:num_requests_running"))
    result = run("check", "rules", str(broken))
    assert result.returncode != 0
    output = result.stdout + result.stderr
    assert '"SpectestMetricsAbsent": could not parse expression' in output


def test_promtool_unit_tests_pass():
    tested = {f for p in UNIT_TESTS for f in yaml.safe_load(p.read_text())["rule_files"]}
    assert {f"../{p.name}" for p in RULE_FILES} <= tested, "a rule file without unit tests"
    result = run("test", "rules", *map(str, UNIT_TESTS))
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count("SUCCESS") == len(UNIT_TESTS)


def test_every_alert_has_a_firing_and_a_silent_unit_test():
    firing, silent = set(), set()
    for path in UNIT_TESTS:
        for case in yaml.safe_load(path.read_text())["tests"]:
            for check in case.get("alert_rule_test", []):
                (firing if check.get("exp_alerts") else silent).add(check["alertname"])
    all_names = set(IDS)
    assert all_names - firing == set(), "alerts never shown to fire"
    assert all_names - silent == set(), "alerts never shown to stay silent"


# Each mutation breaks one property the unit tests claim to pin down; promtool must notice.
MUTATIONS = {
    "spectest: acceptance floor 0.6 -> 0.2": ("spectest", ") < 0.6\n", ") < 0.2\n"),
    "spectest: TTFT edge 0.5 s -> 1.0 s": ("spectest",
                                          'time_to_first_token_seconds_bucket{le="0.5"}',
                                          'time_to_first_token_seconds_bucket{le="1.0"}'),
    "spectest: acceptance idle guard removed": ("spectest", "[10m])) > 1\n", "[10m])) > 0\n"),
    "spectest: error rate counts 4xx": ("spectest", 'request_errors_total{code=~"5.."}',
                                        "request_errors_total"),
    "spectest: queue growth check removed": ("spectest",
                                             "(deriv(spectest:num_requests_waiting[10m])) > 0",
                                             "(deriv(spectest:num_requests_waiting[10m])) > -1"),
    "llamacpp: acceptance floor 0.6 -> 0.2": ("llamacpp", ") < 0.6\n", ") < 0.2\n"),
    "llamacpp: 30-minute window -> 10 minutes": ("llamacpp", "[30m]", "[10m]"),
    "llamacpp: acceptance idle guard removed": ("llamacpp", "[30m])) > 1\n", "[30m])) > 0\n"),
    "llamacpp: accepted-length floor 1.2 -> 1.05": ("llamacpp", "< 1.2\n", "< 1.05\n"),
    "llamacpp: deferred growth check removed": ("llamacpp",
                                                "(deriv(llamacpp:requests_deferred[10m])) > 0",
                                                "(deriv(llamacpp:requests_deferred[10m])) > -1"),
    "llamacpp: absent() on the wrong gauge": ("llamacpp", "absent(llamacpp:requests_processing)",
                                              "absent(llamacpp:requests_deferred)"),
    "vllm: failures count length": ("vllm", 'finished_reason!~"stop|length"',
                                    'finished_reason!~"stop"'),
    "vllm: alerts per engine": ("vllm", "sum by (model_name) (rate(vllm:spec_decode_num_accepted",
                                "sum by (model_name, engine) (rate(vllm:spec_decode_num_accepted"),
}


@pytest.mark.parametrize("mutation", sorted(MUTATIONS))
def test_unit_tests_fail_on_a_mutated_rule(tmp_path, mutation):
    key, old, new = MUTATIONS[mutation]
    rules = ALERTS_DIR / f"{key}.rules.yml"
    text = rules.read_text()
    assert text.count(old) >= 1, f"mutation target not found: {old!r}"
    (tmp_path / rules.name).write_text(text.replace(old, new))
    (tmp_path / "tests").mkdir()
    tests = [p for p in UNIT_TESTS
             if f"../{rules.name}" in yaml.safe_load(p.read_text())["rule_files"]]
    for path in tests:
        shutil.copy(path, tmp_path / "tests" / path.name)
    result = run("test", "rules", *[f"tests/{p.name}" for p in tests], cwd=tmp_path)
    assert result.returncode != 0, f"unit tests did not notice: {mutation}"


@pytest.mark.parametrize("flavour,alert", ALERTS, ids=IDS)
def test_alert_has_severity_summary_description_and_runbook(flavour, alert):
    readme = README.read_text()
    headings = set(re.findall(r"^### (\w+)\s*$", readme, re.M))
    rule = alert.rule
    assert rule["labels"]["severity"] in {"warning", "critical"}
    ann = rule["annotations"]
    assert ann["summary"].strip() and ann["description"].strip()
    assert ann["runbook_url"] == f"alerts/README.md#{alert.name.lower()}"
    assert alert.name in headings, f"alerts/README.md has no runbook for {alert.name}"
    section = readme.split(f"### {alert.name}\n", 1)[1].split("\n### ", 1)[0]
    for part in ("**Meaning.**", "**Check.**", "**Fix.**"):
        assert part in section, f"runbook of {alert.name} lacks {part}"


@pytest.mark.parametrize("flavour,alert", ALERTS, ids=IDS)
def test_every_metric_and_label_is_the_flavours(flavour, alert):
    valid = for_server(flavour).sample_names()
    used = metric_names(alert.expr)
    assert used, f"{alert.name} uses no metric"
    assert used <= valid, f"{alert.name}: {flavour.display} has no {used - valid}"
    labels = set(flavour.labels) | set(SCRAPE_LABELS)
    for clause in re.findall(r"\b(?:by|on) \(([^)]*)\)", alert.expr):
        grouped = {x.strip() for x in clause.split(",")}
        assert grouped <= labels, f"{alert.name}: {flavour.display} series lack {grouped - labels}"
    d = DEPLOYMENTS[flavour.key]
    assert set(d.speculative_by + d.serving_by + d.engine_by) <= labels


def test_latency_thresholds_sit_on_bucket_edges():
    found = 0
    for flavour, alert in ALERTS:
        for metric, le in re.findall(r"([\w:]+)_bucket\{[^}]*le=\"([^\"]+)\"", alert.expr):
            spec = names.BY_NAME[names.PREFIX + metric.split(":", 1)[1]]
            assert float(le) in spec.buckets, f"{alert.name}: le={le} not a bucket of {metric}"
            assert le == floatToGoString(float(le)), f"{alert.name}: le={le} not as exposed"
            found += 1
    assert found >= 4  # TTFT and TPOT, spectest and vLLM


def test_thresholds_match_the_dashboards():
    for flavour, alert in ALERTS:
        expr = alert.expr
        if alert.name.endswith("SpecDecodeAcceptanceRateLow"):
            assert f") < {panels.ACCEPTANCE_RATE_FLOOR}\n" in expr
        if alert.name.endswith("SpecDecodeAcceptedLengthNearOne"):
            assert f"< {panels.ACCEPTED_LENGTH_FLOOR}\n" in expr
        for slo, edge in (("TTFTSLOBreach", panels.TTFT_SLO_SECONDS),
                          ("TPOTSLOBreach", panels.TPOT_SLO_SECONDS)):
            if alert.name.endswith(slo):
                assert f'le="{floatToGoString(edge)}"' in expr
                assert f") < {panels.SLO_OBJECTIVE}\n" in expr


def test_request_end_counters_get_long_windows():
    """llama.cpp adds draft counts when a request finishes: its speculative alerts read 30
    minutes, the per-step servers' 10 (the drafter-failure alert reads a per-round counter)."""
    for flavour, alert in ALERTS:
        if "SpecDecodeAccept" in alert.name:
            window = "30m" if flavour.counters_at_request_end else "10m"
            assert set(re.findall(r"\[(\w+)\]", alert.expr)) == {window}, alert.name
