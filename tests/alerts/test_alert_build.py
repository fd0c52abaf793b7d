"""The alert-rule generator: committed files equal its output, --check catches drift, and an
alert appears exactly for the flavours whose rows have the metrics it reads."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import yaml

from alerts import build, catalogue
from spectest import flavours
from spectest.telemetry import names

ROOT = Path(__file__).resolve().parents[2]
FILES = build.build_rules()


def alert_names(text: str) -> list[str]:
    return [r["alert"] for g in yaml.safe_load(text)["groups"] for r in g["rules"]]


def test_committed_files_equal_generator_output():
    problems = build.drift(build.HERE, FILES)
    assert problems == [], "run: python -m alerts.build\n" + "\n".join(problems)


def test_check_cli_accepts_committed_files():
    result = subprocess.run([sys.executable, "-m", "alerts.build", "--check"], cwd=ROOT,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert f"{len(FILES)} rule files up to date" in result.stdout


def test_check_fails_on_edited_missing_and_stale_files(tmp_path, capsys):
    assert build.main(["--out-dir", str(tmp_path)]) == 0
    assert build.main(["--check", "--out-dir", str(tmp_path)]) == 0
    edited = tmp_path / "llamacpp.rules.yml"
    edited.write_text(edited.read_text().replace("< 0.6", "< 0.5"))
    (tmp_path / "vllm.rules.yml").unlink()
    (tmp_path / "old.rules.yml").write_text("groups: []\n")
    capsys.readouterr()
    assert build.main(["--check", "--out-dir", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert "llamacpp.rules.yml differs" in err
    assert "vllm.rules.yml is missing" in err
    assert "old.rules.yml is not produced" in err


def test_write_is_idempotent_and_leaves_no_temp_files(tmp_path):
    build.main(["--out-dir", str(tmp_path)])
    first = {p.name: p.read_text() for p in tmp_path.iterdir()}
    build.main(["--out-dir", str(tmp_path)])
    assert first == {p.name: p.read_text() for p in tmp_path.iterdir()}
    assert sorted(first) == sorted(FILES)


def test_bad_out_dir_is_one_readable_line(tmp_path):
    result = subprocess.run([sys.executable, "-m", "alerts.build", "--out-dir",
                             str(tmp_path / "nope")], cwd=ROOT, capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 2
    assert result.stderr.strip().count("\n") == 0 and "not a directory" in result.stderr
    assert "Traceback" not in result.stderr


def test_one_file_per_flavour_with_metrics():
    assert sorted(FILES) == ["llamacpp.rules.yml", "spectest.rules.yml", "vllm.rules.yml"]
    assert build.rules_file(flavours.SGLANG) is None  # no counters: a gauge only


def test_files_parse_to_what_the_generator_meant():
    for name, text in FILES.items():
        doc = yaml.safe_load(text)
        f = flavours.get(name.removesuffix(".rules.yml"))
        assert [g["name"] for g in doc["groups"]] == [f"{f.key}-speculative-decoding",
                                                      f"{f.key}-serving"]
        for g in doc["groups"]:
            for r in g["rules"]:
                assert r["expr"] == build.rule(
                    next(a for a in catalogue.ALERTS if a.full_name(catalogue.DEPLOYMENTS[f.key])
                         == r["alert"]), f)["expr"]


def test_an_alert_is_left_out_where_its_metric_is_missing():
    """A server row without the waiting gauge gets no queue alert, and the header says why."""
    row = dict(flavours.LLAMACPP.samples)
    del row[names.WAITING.name]
    text = build.rules_file(replace(flavours.LLAMACPP, samples=row))
    assert "LlamacppQueueGrowing" not in alert_names(text)
    assert "#   LlamacppQueueGrowing (needs num_requests_waiting)." in text
    assert "LlamacppMetricsAbsent" in alert_names(text)


def test_a_new_alert_reaches_exactly_the_flavours_with_its_metric():
    """How the "speculation enabled" gauge will get its alert: one Alert, needs=(its spec,)."""
    gauge = names.MetricSpec(names.PREFIX + "spec_decode_enabled", "gauge", "1 while on.",
                             names.ENGINE_LABELS)
    alert = catalogue.Alert(
        "SpeculationDisabled", "speculative-decoding", (gauge,),
        lambda c: f"max by ({', '.join(c.where.engine_by)}) ({c.sample(gauge)}) == 0\n",
        "warning", lambda c: "Speculation is off", lambda c: "The kill switch is on.")
    spectest = replace(flavours.SPECTEST,
                       samples={**flavours.SPECTEST.samples, gauge.name: gauge.sample_name})
    alerts = catalogue.ALERTS + (alert,)
    assert "SpeculationDisabled" in alert_names(build.rules_file(spectest, alerts))
    assert "LlamacppSpeculationDisabled" not in alert_names(
        build.rules_file(flavours.LLAMACPP, alerts))


def test_spectest_alerts_keep_their_names_and_labels():
    doc = yaml.safe_load(FILES["spectest.rules.yml"])
    rules = {r["alert"]: r for g in doc["groups"] for r in g["rules"]}
    assert "sum by (model_name, drafter)" in rules["SpecDecodeAcceptanceRateLow"]["expr"]
    assert "sum by (model_name)" in rules["SpectestTTFTSLOBreach"]["expr"]
    assert rules["SpectestMetricsAbsent"]["expr"] == "absent(spectest:num_requests_running)"
    assert {r["for"] for r in rules.values()} == {"2m", "5m", "10m", "15m"}
    assert rules["SpecDecodeDrafterFailing"]["for"] == "2m"  # a lost drafter shows fast
