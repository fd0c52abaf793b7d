"""AIPerf and GuideLLM result folders as the arms of ``spectest report`` / ``spectest compare``.

The fixtures are real files (``peer_runs.tar.gz``): NVIDIA AIPerf 0.13.0 and GuideLLM 0.8.1 runs
against a speculative and a plain ``spectest serve``, made by ``docs/peer-runs-example``'s
scripts. Figures are recomputed here from the raw files (per-request records, warm-up left out)
and checked against the rows spectest builds and against AIPerf's own aggregates; the command
line is run as a user runs it (exit code, one-line errors, the files it writes).
"""

import contextlib
import io
import json
import re
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from spectest import cli
from spectest.report import peers
from spectest.report.table import SLO

ROOT = Path(__file__).resolve().parents[2]
TARBALL = Path(__file__).with_name("peer_runs.tar.gz")
LEVELS = (1.0, 2.0, 4.0)
VERDICT = re.compile(r"at c=1 speculation is [\d.]+× .*\(n = (\d+) spec / (\d+) base; "
                     r"95% interval [\d.]+×–[\d.]+×")
# spectest rounds latency percentiles to 0.001 ms; AIPerf interpolates percentiles linearly, as
# numpy does, so the two agree to that rounding
AGREE = {"rel": 1e-4, "abs": 1e-3}


def spectest(*args) -> subprocess.CompletedProcess:
    """``spectest ARGS`` in this process (``cli.main``, stdout and stderr captured): what the
    command prints and returns, without a Python start-up per call. The first test runs the
    real command line in a child process."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = cli.main([str(a) for a in args])
        except SystemExit as e:  # argparse
            code = e.code if isinstance(e.code, int) else 1
    return subprocess.CompletedProcess(args, code, out.getvalue(), err.getvalue())


def spectest_process(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "spectest", *map(str, args)], cwd=ROOT,
                          capture_output=True, text=True, timeout=600)


def ok(proc: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr
    return proc


def notes(proc) -> list[str]:
    return [line for line in proc.stdout.splitlines() if line.startswith("note: ")]


def empty(v) -> bool:
    return v is None or (isinstance(v, float) and np.isnan(v))


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    """The folder the tarball is extracted into (``base / 'peer_runs'``); read-only by use."""
    d = tmp_path_factory.mktemp("peers")
    with tarfile.open(TARBALL) as t:
        t.extractall(d, filter="data")
    return d


@pytest.fixture(scope="module")
def runs(base) -> Path:
    return base / "peer_runs"


@pytest.fixture
def copy(runs, tmp_path):
    """A writable copy of one tool's runs: ``copy('aiperf') / 'spec' / 'c2'``."""
    def make(tool: str) -> Path:
        dst = tmp_path / "copy" / tool
        shutil.copytree(runs / tool, dst)
        return dst
    return make


@pytest.fixture(scope="module")
def aiperf_report(base, runs):
    out = base / "out-aiperf"
    proc = spectest_process("report", "--spec", runs / "aiperf/spec", "--baseline",
                            runs / "aiperf/base", "--out", out)
    return proc, out


def aiperf_records(run: Path) -> list[dict]:
    lines = (run / "profile_export.jsonl").read_text(encoding="utf-8").splitlines()
    return [json.loads(x) for x in lines if x.strip()]


def guidellm_benchmark(path: Path, streams: int) -> dict:
    data = json.loads(path.read_text(encoding="utf-8"))
    found = [b for b in data["benchmarks"] if b["config"]["strategy"]["type_"] == "synchronous"
             or b["config"]["strategy"].get("streams") == streams]
    assert len(found) == 1
    return found[0]


# --- 1. AIPerf end to end ---------------------------------------------------------------------
def test_aiperf_runs_make_a_report_with_verdict_and_crossovers(aiperf_report):
    proc, out = aiperf_report
    ok(proc)
    for name in ("report.html", "report.md", "steps.csv", "sweep.json"):
        assert (out / name).is_file(), name
    table = pd.read_csv(out / "steps.csv")
    for arm in ("spec", "base"):
        assert sorted(table[table.arm == arm].concurrency) == list(LEVELS)
    assert set(table.requests) == {24}
    verdict = [line for line in proc.stdout.splitlines() if VERDICT.search(line)]
    assert len(verdict) == 1, proc.stdout
    assert VERDICT.search(verdict[0]).groups() == ("24", "24")
    assert "acceptance 0.55, mean accepted length 3.14" in verdict[0]
    assert any(line.strip().startswith("crossover TPOT") for line in proc.stdout.splitlines())
    assert any(line.strip().startswith("crossover throughput")
               for line in proc.stdout.splitlines())
    info = json.loads((out / "sweep.json").read_text())
    assert info["peer"]["tools"] == ["AIPerf 0.13.0"]
    assert info["config"]["steps"] == [1, 2, 4]
    # the files have per-request records and speculation: no note says otherwise
    assert not any("no per-request records" in n or "no acceptance" in n for n in notes(proc))


# --- 2. AIPerf figures, recomputed from the raw files -----------------------------------------
@pytest.mark.parametrize("arm", ["spec", "base"])
def test_aiperf_rows_equal_figures_recomputed_from_the_records(runs, arm):
    steps = {s.concurrency: s for s in peers.read(runs / "aiperf" / arm)}
    assert sorted(steps) == list(LEVELS)
    for c, step in steps.items():
        run = runs / "aiperf" / arm / f"c{c:g}"
        records = aiperf_records(run)
        phases = [r["metadata"]["benchmark_phase"] for r in records]
        assert phases.count("warmup") == 1 and phases.count("profiling") == 24
        prof = [r for r in records if r["metadata"]["benchmark_phase"] == "profiling"]
        row = peers.step_row(step, arm, SLO())
        assert row["requests"] == 24 and row["failures"] == 0
        ttft = [r["metrics"]["time_to_first_token"]["value"] for r in prof]
        for p in (50, 99):
            assert row[f"ttft_p{p}_ms"] == pytest.approx(np.percentile(ttft, p), abs=5e-4)
        # the warm-up record is left out: counting it would move the median
        with_warmup = [r["metrics"]["time_to_first_token"]["value"] for r in records]
        assert np.percentile(with_warmup, 50) != pytest.approx(row["ttft_p50_ms"], abs=5e-4)
        assert row["output_tokens"] == sum(r["metrics"]["usage_completion_tokens"]["value"]
                                           for r in prof)
        if arm == "base":
            assert all(not r.get("spec_decode_acceptance") for r in prof)
            assert empty(row["acceptance_rate"]) and empty(row["mean_accepted_length"])
            continue
        sd = [r["spec_decode_acceptance"] for r in prof]
        acc = sum(s["num_accepted_draft_tokens"] for s in sd)
        dtok = sum(s["num_draft_tokens"] for s in sd)
        drafts = sum(s["num_spec_steps"] for s in sd)
        assert row["acceptance_rate"] == pytest.approx(acc / dtok, rel=1e-9)
        assert row["mean_accepted_length"] == pytest.approx(1 + acc / drafts, rel=1e-9)
        assert row["k"] == 4
        pooled = np.zeros(5)
        for s in sd:
            for j, n in s["acceptance_histogram"].items():
                pooled[int(j)] += n
        for i in range(4):
            assert row[f"acceptance_pos_{i}"] == pytest.approx(pooled[i + 1:].sum()
                                                               / pooled.sum(), rel=1e-9)


@pytest.mark.parametrize("arm", ["spec", "base"])
def test_aiperf_rows_agree_with_aiperfs_own_aggregates(runs, arm):
    """Within 0.001 ms or 0.01% (spectest's rounding; both interpolate percentiles linearly)."""
    for step in peers.read(runs / "aiperf" / arm):
        row = peers.step_row(step, arm, SLO())
        agg = json.loads((step.path / "profile_export_aiperf.json").read_text())
        for ours, theirs in (("ttft", "time_to_first_token"), ("tpot", "inter_token_latency"),
                             ("e2el", "request_latency"), ("itl", "inter_chunk_latency")):
            for p in (50, 90, 99):
                assert row[f"{ours}_p{p}_ms"] == pytest.approx(agg[theirs][f"p{p}"], **AGREE), \
                    (step.path, ours, p)
        assert row["tpot_mean_ms"] == pytest.approx(agg["inter_token_latency"]["avg"], **AGREE)
        assert row["requests"] == agg["request_count"]["avg"]
        assert row["output_tokens"] == agg["total_usage_completion_tokens"]["avg"]
        assert row["duration_s"] == pytest.approx(agg["benchmark_duration"]["avg"], abs=2e-3)
        if arm == "base":
            assert "total_spec_decode_steps" not in agg
            continue
        assert row["accepted_tokens"] == agg["total_accepted_draft_tokens"]["avg"]
        assert row["draft_tokens"] == agg["total_draft_tokens"]["avg"]
        assert row["drafts"] == agg["total_spec_decode_steps"]["avg"]
        assert 100 * row["acceptance_rate"] == pytest.approx(
            agg["spec_decode_overall_draft_acceptance_rate"]["avg"], rel=1e-9)
        assert row["mean_accepted_length"] == pytest.approx(
            agg["spec_decode_token_weighted_acceptance_length"]["avg"], rel=1e-9)
        hist = agg["pooled_spec_decode_acceptance_histogram"]
        total = sum(hist.values())
        assert row["acceptance_pos_0"] == pytest.approx(1 - hist["0"] / total, rel=1e-9)
        assert row["acceptance_pos_3"] == pytest.approx(hist["4"] / total, rel=1e-9)


# --- 3. GuideLLM end to end -------------------------------------------------------------------
def test_guidellm_runs_make_a_report_with_their_figures(runs, tmp_path):
    out = tmp_path / "out"
    proc = ok(spectest("report", "--spec", runs / "guidellm/spec", "--baseline",
                       runs / "guidellm/base", "--out", out))
    said = notes(proc)
    chunks = [n for n in said if "no per-chunk times" in n]
    assert len(chunks) == 1 and chunks[0].endswith("(every step).")
    # these files keep each response's speculation (response_metrics.speculative_decoding)
    assert not any("no acceptance" in n for n in said)
    match = [VERDICT.search(line) for line in proc.stdout.splitlines()]
    assert [m.groups() for m in match if m] == [("20", "20")]
    assert "acceptance 0.53, mean accepted length 3.02" in proc.stdout
    table = pd.read_csv(out / "steps.csv")
    assert table.itl_p50_ms.isna().all() and table.itl_p99_ms.isna().all()
    assert table[table.arm == "base"].acceptance_rate.isna().all()
    for arm in ("spec", "base"):
        path = runs / "guidellm" / arm / "benchmarks.json"
        for c in LEVELS:
            row = table[(table.arm == arm) & (table.concurrency == c)].iloc[0]
            reqs = guidellm_benchmark(path, int(c))["requests"]["successful"]
            assert row.requests == len(reqs) == 20
            ttft = [r["time_to_first_token_ms"] for r in reqs]
            itl = [r["inter_token_latency_ms"] for r in reqs]
            assert row.ttft_p50_ms == pytest.approx(np.percentile(ttft, 50), abs=5e-4)
            assert row.ttft_p99_ms == pytest.approx(np.percentile(ttft, 99), abs=5e-4)
            assert row.tpot_p50_ms == pytest.approx(np.percentile(itl, 50), abs=5e-4)
            # GuideLLM's time_per_output_token_ms includes the TTFT: not spectest's TPOT
            tpot_guidellm = np.percentile([r["time_per_output_token_ms"] for r in reqs], 50)
            assert row.tpot_p50_ms < tpot_guidellm - 1
            if arm == "spec":
                sd = [r["response_metrics"]["speculative_decoding"] for r in reqs]
                acc = sum(s["num_accepted_draft_tokens"] for s in sd)
                assert row.acceptance_rate == pytest.approx(
                    acc / sum(s["num_draft_tokens"] for s in sd), rel=1e-9)
                assert row.mean_accepted_length == pytest.approx(
                    1 + acc / sum(s["num_spec_steps"] for s in sd), rel=1e-9)


def test_guidellm_without_speculation_in_the_responses_says_no_acceptance(copy, tmp_path):
    runs = copy("guidellm")
    path = runs / "spec" / "benchmarks.json"
    data = json.loads(path.read_text())
    for bench in data["benchmarks"]:
        for r in bench["requests"]["successful"]:
            r["response_metrics"] = {}
    path.write_text(json.dumps(data))
    out = tmp_path / "out"
    proc = ok(spectest("report", "--spec", runs / "spec", "--baseline", runs / "base",
                       "--out", out))
    said = [n for n in notes(proc) if "no acceptance" in n]
    assert len(said) == 1 and said[0].endswith("(every speculative step).")
    assert "acceptance –, mean accepted length –" in proc.stdout
    table = pd.read_csv(out / "steps.csv")
    for col in ("acceptance_rate", "mean_accepted_length", "drafts", "accepted_tokens"):
        assert table[col].isna().all(), col


# --- 4. AIPerf without per-request records ----------------------------------------------------
def test_a_run_without_records_is_filled_from_aiperfs_aggregates(copy, tmp_path):
    runs = copy("aiperf")
    (runs / "spec" / "c2" / "profile_export.jsonl").unlink()
    agg = json.loads((runs / "spec" / "c2" / "profile_export_aiperf.json").read_text())
    out = tmp_path / "out"
    proc = ok(spectest("report", "--spec", runs / "spec", "--baseline", runs / "base",
                       "--out", out))
    said = [n for n in notes(proc) if "no per-request records" in n]
    assert len(said) == 1 and said[0].endswith("(spec c=2).")
    table = pd.read_csv(out / "steps.csv")
    row = table[(table.arm == "spec") & (table.concurrency == 2)].iloc[0]
    assert row.ttft_p50_ms == pytest.approx(agg["time_to_first_token"]["p50"], rel=1e-12)
    assert row.ttft_p99_ms == pytest.approx(agg["time_to_first_token"]["p99"], rel=1e-12)
    assert row.tpot_p50_ms == pytest.approx(agg["inter_token_latency"]["p50"], rel=1e-12)
    assert row.requests == 24
    assert row.acceptance_rate == pytest.approx(agg["total_accepted_draft_tokens"]["avg"]
                                                / agg["total_draft_tokens"]["avg"], rel=1e-12)
    log_se = [c for c in table.columns if c.endswith("_log_se")]
    assert log_se and all(pd.isna(row[c]) for c in log_se)
    assert pd.isna(row.goodput_rps)
    # the other rows still come from their records, with intervals
    others = table[~((table.arm == "spec") & (table.concurrency == 2))]
    assert others.tpot_p50_log_se.notna().all() and len(others) == 5


# --- 5. a rate-based run ----------------------------------------------------------------------
def test_a_rate_based_run_is_left_out_with_one_note(copy, tmp_path):
    runs = copy("guidellm")
    path = runs / "spec" / "benchmarks.json"
    data = json.loads(path.read_text())
    data["benchmarks"][1]["config"]["strategy"] = {"type_": "constant", "rate": 2.0,
                                                    "max_concurrency": None}
    path.write_text(json.dumps(data))
    out = tmp_path / "out"
    proc = ok(spectest("report", "--spec", runs / "spec", "--baseline", runs / "base",
                       "--out", out))
    left = [n for n in notes(proc) if "Left out" in n]
    assert len(left) == 1
    assert "speculative arm" in left[0] and "constant benchmark at 2 req/s" in left[0]
    table = pd.read_csv(out / "steps.csv")
    assert sorted(table[table.arm == "spec"].concurrency) == [1.0, 4.0]
    assert sorted(table[table.arm == "base"].concurrency) == list(LEVELS)
    assert (out / "report.html").is_file()
    assert any(VERDICT.search(line) for line in proc.stdout.splitlines())


# --- 6. clear errors --------------------------------------------------------------------------
def _no_results(runs, tmp):
    (tmp / "empty").mkdir()
    return ["--spec", tmp / "empty", "--baseline", runs / "aiperf/base"], "holds no AIPerf"


def _a_sweep_as_spec(runs, tmp):
    sweep = tmp / "sweep"
    sweep.mkdir()
    (sweep / "steps.csv").write_text("workload,arm,concurrency\n")
    (sweep / "sweep.json").write_text('{"status": "finished"}\n')
    return ["--spec", sweep, "--baseline", runs / "aiperf/base"], "is a spectest sweep"


def _same_run_twice(runs, tmp):
    return (["--spec", runs / "aiperf/spec/c1", runs / "aiperf/spec/c1", "--baseline",
             runs / "aiperf/base"], "two speculative runs at concurrency 1")


def _c1_twice(runs, tmp):
    return (["--spec", runs / "aiperf/spec/c1", runs / "aiperf/spec/c2", "--baseline",
             runs / "aiperf/base", runs / "aiperf/base/c1"], "two baseline runs at concurrency 1")


def _peer_folder_as_sweep(runs, tmp):
    return [runs / "guidellm/spec"], "--spec DIR… and the plain server's with --baseline"


def _spec_without_baseline(runs, tmp):
    return ["--spec", runs / "aiperf/spec"], "need both arms"


@pytest.mark.parametrize("case", [_no_results, _a_sweep_as_spec, _same_run_twice, _c1_twice,
                                  _peer_folder_as_sweep, _spec_without_baseline])
def test_bad_peer_input_gives_one_line_and_exit_2(runs, tmp_path, case):
    args, message = case(runs, tmp_path)
    out = tmp_path / "out"
    proc = spectest("report", *args, "--out", out)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("spectest report: "), proc.stderr
    assert message in lines[0]
    assert not (out / "steps.csv").exists()


# --- 7. compare with peer sides ---------------------------------------------------------------
def test_compare_takes_aiperf_as_one_side_and_guidellm_as_the_other(runs, tmp_path):
    out = tmp_path / "cmp"
    proc = ok(spectest("compare", "--a-spec", runs / "aiperf/spec", "--a-baseline",
                       runs / "aiperf/base", "--b-spec", runs / "guidellm/spec",
                       "--b-baseline", runs / "guidellm/base", "--out", out))
    assert (out / "compare.html").is_file() and (out / "compare.md").is_file()
    assert "comparison:" in proc.stdout
    for side, tool in (("A", "AIPerf 0.13.0"), ("B", "GuideLLM 0.8.1")):
        info = json.loads((out / f"{side}-peer-runs" / "sweep.json").read_text())
        assert info["peer"]["tools"] == [tool]
    md = (out / "compare.md").read_text()
    assert "AIPerf" in md and "GuideLLM" in md


# --- 8. re-rendering, and a real sweep is not overwritten -------------------------------------
def test_the_converted_folder_re_renders_with_the_same_verdict(aiperf_report, base):
    first, out = aiperf_report
    ok(first)
    again = base / "out-aiperf-again"  # a sibling: steps.csv's run_dir is relative to it
    shutil.copytree(out, again)
    (again / "report.html").unlink()
    proc = ok(spectest("report", again))
    assert (again / "report.html").is_file()
    verdict = [line for line in first.stdout.splitlines() if VERDICT.search(line)]
    assert verdict and verdict[0] in proc.stdout.splitlines()


def test_peer_runs_do_not_overwrite_a_spectest_sweep(runs, tmp_path):
    sweep = tmp_path / "sweep"
    sweep.mkdir()
    csv = "workload,arm,concurrency\nw,spec,1\n"
    (sweep / "steps.csv").write_text(csv)
    (sweep / "sweep.json").write_text(json.dumps({"status": "finished", "label": "mine"}))
    proc = spectest("report", "--spec", runs / "aiperf/spec", "--baseline",
                    runs / "aiperf/base", "--out", sweep)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "holds a spectest sweep" in lines[0]
    assert (sweep / "steps.csv").read_text() == csv
    assert json.loads((sweep / "sweep.json").read_text())["label"] == "mine"
    assert not (sweep / "report.html").exists()
