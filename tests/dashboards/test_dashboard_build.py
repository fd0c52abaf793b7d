"""The dashboard builder: committed JSON equals its output, --check catches drift, and every
dashboard is importable as is (datasource variable, label variables, descriptions, layout)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from dashboards import build
from dashboards.flavours import BY_KEY

ROOT = Path(__file__).resolve().parents[2]
BOARDS = build.build_dashboards()

SPECULATIVE_PANELS = {
    "Acceptance rate", "Mean accepted length", "Per-position acceptance",
    "Draft vs accepted tokens/s", "Effective tokens per target forward", "Current K",
    "Draft and verify time per round", "Speculation on/off traffic", "Speculation switch",
}
SERVING_PANELS = {
    "Time to first token", "Time per output token", "Inter-token latency (per engine step)",
    "End-to-end request latency", "Queue time", "Requests/s by finished reason", "Tokens/s",
    "Running and waiting requests", "KV cache usage", "Errors by reason", "SLO attainment",
}
VLLM_ABSENT = {"Effective tokens per target forward", "Current K",
               "Draft and verify time per round", "Speculation on/off traffic",
               "Speculation switch"}
# What the llama.cpp builds must show (issue 11), and what its /metrics cannot feed.
LLAMACPP_SPECULATIVE = {"Acceptance rate", "Mean accepted length", "Per-position acceptance",
                        "Draft vs accepted tokens/s", "Drafts and generated tokens/s",
                        "Generated tokens/s"}
LLAMACPP_SERVING = {"Tokens/s", "Cached prompt share", "Mean time per token",
                    "Running and waiting requests", "Busy slots per decode call",
                    "Latency comes from the client side"}
LLAMACPP_ABSENT = VLLM_ABSENT | {"Acceptance rate by workload", "Time to first token",
                                 "Time per output token", "SLO attainment", "KV cache usage",
                                 "Errors by reason", "Requests/s", "TTFT p99"}


def panels_of(board: dict) -> list[dict]:
    return [p for p in board["panels"] if p["type"] != "row"]


def titles(uid: str) -> set[str]:
    return {p["title"] for p in panels_of(BOARDS[f"{uid}.json"])}


def test_committed_json_equals_builder_output():
    problems = build.drift(build.HERE, BOARDS)
    assert problems == [], "run: python -m dashboards.build\n" + "\n".join(problems)


def test_check_cli_accepts_committed_files():
    result = subprocess.run([sys.executable, "-m", "dashboards.build", "--check"], cwd=ROOT,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert f"{len(BOARDS)} dashboards up to date" in result.stdout
    assert len(BOARDS) == 6


def test_check_fails_on_edited_missing_and_stale_files(tmp_path, capsys):
    assert build.main(["--out-dir", str(tmp_path)]) == 0
    assert build.main(["--check", "--out-dir", str(tmp_path)]) == 0
    edited = tmp_path / "spectest-serving.json"
    edited.write_text(edited.read_text().replace("Time to first token", "TTFT!"))
    (tmp_path / "vllm-serving.json").unlink()
    (tmp_path / "old-dashboard.json").write_text("{}")
    capsys.readouterr()
    assert build.main(["--check", "--out-dir", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert "spectest-serving.json differs" in err
    assert "vllm-serving.json is missing" in err
    assert "old-dashboard.json is not produced" in err


def test_write_is_idempotent_and_leaves_no_temp_files(tmp_path):
    build.main(["--out-dir", str(tmp_path)])
    first = {p.name: p.read_text() for p in tmp_path.iterdir()}
    build.main(["--out-dir", str(tmp_path)])
    second = {p.name: p.read_text() for p in tmp_path.iterdir()}
    assert first == second
    assert sorted(first) == sorted(BOARDS)


def test_bad_out_dir_is_one_readable_line(tmp_path):
    result = subprocess.run([sys.executable, "-m", "dashboards.build", "--out-dir",
                             str(tmp_path / "nope")], cwd=ROOT, capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 2
    assert result.stderr.strip().count("\n") == 0 and "not a directory" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize("name", sorted(BOARDS))
def test_dashboard_is_importable_as_is(name):
    board = BOARDS[name]
    json.dumps(board)  # plain JSON
    assert board["uid"] == name.removesuffix(".json") and board["title"]
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    flavour = BY_KEY[name.split("-", 1)[0]]
    for label in flavour.variables:
        var = variables[label]
        assert var["type"] == "query" and var["multi"] and var["includeAll"]
        assert var["allValue"] == ".*"
        assert var["datasource"]["uid"] == "${datasource}"
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids)) and 0 not in ids
    for panel in panels_of(board):
        pos = panel["gridPos"]
        assert pos["x"] + pos["w"] <= 24 and pos["h"] > 0
        if panel["type"] == "text":  # an explanation, not a query
            assert panel["options"]["mode"] == "markdown" and panel["options"]["content"]
            continue
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        assert "Healthy" in panel["description"], f"{panel['title']}: say what healthy is"
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            assert target["datasource"]["uid"] == "${datasource}"
            assert target["expr"] and target["refId"]


def test_required_panels_are_present():
    assert SPECULATIVE_PANELS <= titles("spectest-speculative-decoding")
    assert SERVING_PANELS <= titles("spectest-serving")
    assert "Acceptance rate by workload" in titles("spectest-speculative-decoding")
    assert SPECULATIVE_PANELS - VLLM_ABSENT <= titles("vllm-speculative-decoding")
    assert not VLLM_ABSENT & titles("vllm-speculative-decoding")
    assert SERVING_PANELS <= titles("vllm-serving")
    assert LLAMACPP_SPECULATIVE <= titles("llamacpp-speculative-decoding")
    assert LLAMACPP_SERVING <= titles("llamacpp-serving")
    assert not LLAMACPP_ABSENT & (titles("llamacpp-speculative-decoding")
                                  | titles("llamacpp-serving"))


def test_llamacpp_boards_say_where_latency_and_lumpy_counts_come_from():
    serving = BOARDS["llamacpp-serving.json"]
    assert "client-side" in serving["description"]
    text = next(p for p in panels_of(serving) if p["type"] == "text")
    assert "spectest sweep" in text["options"]["content"]
    speculative = BOARDS["llamacpp-speculative-decoding.json"]
    assert "when the request finishes" in speculative["description"]
    for panel in panels_of(speculative):
        if "accept" in panel["title"].lower():
            assert "finishes" in panel["description"], panel["title"]
    # The healthy-threshold lines are the spectest dashboard's.
    steps = {p["title"]: p["fieldConfig"]["defaults"]["thresholds"]["steps"]
             for p in panels_of(BOARDS["spectest-speculative-decoding.json"])}
    for panel in panels_of(speculative):
        if panel["title"] in ("Acceptance rate", "Mean accepted length"):
            assert panel["fieldConfig"]["defaults"]["thresholds"]["steps"] == \
                steps[panel["title"]]


def test_render_cli_reports_an_unreachable_prometheus_in_one_line(tmp_path):
    result = subprocess.run([sys.executable, "-m", "dashboards.render", "--prometheus",
                             "http://127.0.0.1:1", "--out", str(tmp_path / "p.png")], cwd=ROOT,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 1
    assert result.stderr.startswith("error: cannot query") and "Traceback" not in result.stderr
    assert not (tmp_path / "p.png").exists()
