"""``spectest sweep`` options: step plans, defaults, and one readable line for bad input."""

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pytest

from spectest.sweep import config as C

ROOT = Path(__file__).resolve().parents[2]


def args(*argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    C.add_arguments(p)
    return p.parse_args(list(argv))


def cfg(*argv: str) -> C.SweepConfig:
    return C.SweepConfig.from_args(args(*argv), "now")


@pytest.mark.parametrize("steps,top,want", [
    ("", 0, (1, 2, 4, 8)), ("", 64, (1, 2, 4, 8, 16, 32, 64)), ("", 12, (1, 2, 4, 8, 12)),
    ("", 1, (1,)), ("1, 3,5", 0, (1, 3, 5))])
def test_steps_explicit_or_doubling(steps, top, want):
    assert C.parse_steps(steps, top) == want


@pytest.mark.parametrize("steps,top,message", [
    ("4,2", 0, "rise strictly"), ("1,1", 0, "rise strictly"), ("0,1", 0, "positive"),
    ("a", 0, "whole numbers"), ("1,2", 8, "not both")])
def test_bad_steps(steps, top, message):
    with pytest.raises(C.ConfigError, match=message):
        C.parse_steps(steps, top)


def test_defaults_are_the_embedded_readme_sweep():
    c = cfg()
    assert c.embedded and c.verify_advice and c.workloads == ("chat", "code", "rag")
    assert c.looks == 3 and c.objective == "both"  # up to 3 looks of 10 s until settled
    assert c.steps == (1, 2, 4, 8) and c.arms == ("spec", "base")
    assert c.slo == C.EMBEDDED_SLO and c.max_prompt_chars == 0  # every record fits
    assert c.windows == 3 and c.window_s == pytest.approx(10 / 3)  # warm-up + 3 windows
    assert c.estimated_s() < 12 * 60
    assert "--max-num-seqs" in c.serve_args() and str(c.out) == "spectest-sweep-now"


def test_external_hosts_have_no_default_slo_or_validation():
    c = cfg("--host", "http://gpu:8000/", "--baseline-host", "http://gpu:8001")
    assert not c.embedded and not c.verify_advice and not c.slo.any
    assert (c.host, c.baseline_host, c.max_prompt_chars) == ("http://gpu:8000",
                                                             "http://gpu:8001", 0)
    assert cfg("--host", "http://x", "--slo-tpot-ms", "50").slo.tpot_p99_ms == 50


def test_report_options_default_and_land_in_the_sweep_json_config():
    c = cfg()
    assert c.min_requests_per_step == 20 and c.price_per_hour is None
    j = cfg("--min-requests-per-step", "50", "--price-per-hour", "2.5",
            "--spec-price-per-hour", "2.75", "--target-rps", "12").to_json()
    assert (j["min_requests_per_step"], j["price_per_hour"], j["spec_price_per_hour"],
            j["target_rps"], j["target_output_tps"]) == (50, 2.5, 2.75, 12, None)


def test_advice_options_land_in_the_sweep_json_config():
    j = cfg("--objective", "throughput", "--mix", "chat=3,code=1",
            "--speculative-config", '{"method": "ngram"}', "--max-step-time", "40").to_json()
    assert (j["objective"], j["mix"], j["speculative_config"]) == (
        "throughput", "chat=3,code=1", '{"method": "ngram"}')
    assert (j["max_step_time_s"], j["looks"]) == (40, 4)
    assert cfg("--max-step-time", "10").looks == 1


def test_the_advised_schedule_comes_from_a_schedule_json(tmp_path):
    path = tmp_path / "schedule.json"
    path.write_text(json.dumps({"schedules": [
        {"name": "code", "status": "schedule", "k": 4, "ranges": [[1, 3, 4], [4, 8, 0]]},
        {"name": "mix", "status": "always", "k": 4, "ranges": [[1, 8, 4]]}]}))
    hosts = ("--host", "http://a", "--baseline-host", "http://b", "--advised-host", "http://c")
    assert cfg(*hosts, "--advised-schedule", str(path)).advised_schedule["name"] == "mix"
    code = cfg(*hosts, "--advised-schedule", f"{path}:code").to_json()["advised_schedule"]
    assert code["ranges"] == [[1, 3, 4], [4, 8, 0]]
    with pytest.raises(C.ConfigError, match="no schedule named 'rag'"):
        cfg(*hosts, "--advised-schedule", f"{path}:rag")
    with pytest.raises(C.ConfigError, match="cannot read a schedule.json"):
        cfg(*hosts, "--advised-schedule", str(tmp_path / "nope.json"))
    with pytest.raises(C.ConfigError, match="give both"):
        cfg("--advised-schedule", str(path))


def test_windows_split_the_measured_time_by_the_warmup_length():
    assert (cfg("--step-time", "20", "--warmup", "5").window_s,
            cfg("--step-time", "20", "--warmup", "5").windows) == (5.0, 4)
    assert cfg("--step-time", "10", "--warmup", "0").windows == 1
    assert cfg("--step-time", "10", "--warmup", "3").window_s == pytest.approx(10 / 3)


@pytest.mark.parametrize("argv,message", [
    (["--workloads", "chat,nope"], "unknown workload 'nope'"),
    (["--arms", "spec,fast"], "--arms must be"),
    (["--embedded", "--host", "http://x"], "drop --host"),
    (["--baseline-host", "http://x"], "needs --host"),
    (["--step-time", "0"], "--step-time must be positive"),
    (["--slo-tpot-ms", "-1"], "--slo-tpot-ms must be positive"),
    (["--host", "http://x", "--validate-k", "on"], "needs --embedded"),
    (["--host", "http://x", "--verify-advice", "on"], "--advised-host"),
    (["--host", "http://x", "--advised-host", "http://y"], "needs --host and --baseline-host"),
    (["--step-time", "10", "--max-step-time", "5"], "at least --step-time"),
    (["--verify-workloads", "mixed"], "--verify-workloads must name"),
    (["--mix", "chat=1,math=2"], "math, which the sweep did not measure"),
    (["--mix", "chat"], "workload=weight"),
    (["--speculative-config", "[1]"], "JSON object"),
    (["--min-requests-per-step", "0"], "--min-requests-per-step must be at least 1"),
    (["--spec-price-per-hour", "2"], "needs --price-per-hour"),
    (["--target-rps", "5", "--target-output-tps", "100"], "not both"),
])
def test_bad_options(argv, message):
    with pytest.raises(C.ConfigError, match=message):
        cfg(*argv)


def test_cli_bad_input_is_one_line_and_exit_2(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "spectest.sweep.cli", "--steps", "8,4",
                           "--out", str(tmp_path / "x")], capture_output=True, text=True,
                          cwd=ROOT, timeout=120)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip() == "spectest sweep: --steps must rise strictly, got '8,4'"
    assert not (tmp_path / "x").exists()
    # an unreachable --host: one line, nothing measured
    proc = subprocess.run([sys.executable, "-m", "spectest.sweep.cli", "--host",
                           "http://127.0.0.1:9", "--out", str(tmp_path / "y")],
                          capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "cannot reach the server at http://127.0.0.1:9" in proc.stderr
    assert proc.stderr.count("\n") == 1 and not (tmp_path / "y").exists()


def test_drafter_reaches_the_bundled_server_and_the_config():
    c = cfg("--model", "smollm2", "--drafter", "eagle")
    argv = c.serve_args()
    assert argv[argv.index("--drafter") + 1] == "eagle" and c.to_json()["drafter"] == "eagle"
    assert cfg().serve_args()[cfg().serve_args().index("--drafter") + 1] == "draft-model"


def test_k_defaults_to_the_models_measured_best():
    smollm2 = cfg("--model", "smollm2")
    assert smollm2.k == 2 and smollm2.serve_args()[smollm2.serve_args().index("--k") + 1] == "2"
    assert cfg().k == 4 and cfg("--model", "smollm2", "--k", "5").k == 5


def test_a_hybrid_drafter_reaches_the_bundled_server_with_its_draft_and_k():
    c = cfg("--model", "smollm2", "--drafter", "ngram+eagle")
    argv = c.serve_args()
    assert argv[argv.index("--drafter") + 1] == "ngram+eagle"
    assert c.k == 4 and argv[argv.index("--draft") + 1] == "auto"
