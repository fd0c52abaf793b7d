"""``spectest report`` and ``spectest compare`` on synthetic sweep folders with known answers.

The synthetic sweep (``report_synthetic``) is built from a formula, so the speedup at
concurrency 1 and the crossovers the report must print are known in closed form. Also: an
interrupted sweep (a few rows, status "interrupted") renders; bad folders give one line and
exit code 2; SLO flags re-judge the steps.
"""

import json
import math
import re
import subprocess
import sys
from pathlib import Path

import matplotlib.image as mpimg
import pandas as pd
import pytest
from report_synthetic import K, write_sweep  # tests/report is on sys.path (pytest prepend)

from spectest.report import breakpoints as bpm
from spectest.report.cli import (
    add_compare_arguments,
    add_report_arguments,
    compare_main,
    report_main,
)
from spectest.report.render import render_report

ROOT = Path(__file__).resolve().parents[2]
FIGURES = {"speedup", "throughput", "tpot", "ttft", "acceptance", "acceptance_per_position",
           "k_advisor", "cost"}


def expected_speedup_c1(alpha: float) -> float:
    e = 1 + sum(alpha ** (i + 1) for i in range(K))
    return e / (1 + 0.04 * 1 * K)


def expected_crossover(alpha: float) -> float:
    """Log-linear interpolation of the synthetic advantage between the bracketing steps."""
    e = 1 + sum(alpha ** (i + 1) for i in range(K))
    a = {c: e / (1 + 0.04 * c * K) - 1 for c in (1, 2, 4, 8, 16)}
    cs = sorted(a)
    j = next(i for i, c in enumerate(cs) if a[c] <= 0)
    c0, c1 = cs[j - 1], cs[j]
    f = a[c0] / (a[c0] - a[c1])
    return 2 ** (math.log2(c0) + f * (math.log2(c1) - math.log2(c0)))


def parse(add, argv):
    import argparse
    p = argparse.ArgumentParser()
    add(p)
    return p.parse_args(argv)


def test_report_renders_every_file_with_the_known_answers(tmp_path):
    folder = write_sweep(tmp_path / "sweep", {"chat": 0.7, "code": 0.5})
    out = render_report(folder)
    assert set(out.plots) == FIGURES
    for path in out.plots.values():
        img = mpimg.imread(path)
        assert img.shape[0] > 300 and img.shape[1] > 600  # a real, readable PNG
    for name in ("report.html", "report.md", "breakpoints.csv", "k_advice.csv",
                 "k_profile.json", "cost.csv"):
        assert (folder / name).stat().st_size > 0, name
    md = (folder / "report.md").read_text()
    page = (folder / "report.html").read_text()
    for w, alpha in (("chat", 0.7), ("code", 0.5)):
        assert f"at concurrency 1 speculation is **{expected_speedup_c1(alpha):.2f}×**" in md
        assert f"c ≈ {expected_crossover(alpha):.1f}" in md
    # code crosses between 4 and 8, chat between 8 and 16
    assert "between 4 and 8" in md and "between 8 and 16" in md
    assert "Step resolution: concurrency steps 1, 2, 4, 8, 16 (doubling)" in md
    # self-contained: every image inline, nothing fetched from elsewhere
    assert page.count('src="data:image/png;base64,') == len(FIGURES)
    assert not re.search(r'(src|href)="(?!data:)', page)
    # the Markdown references the PNGs beside it
    for name in FIGURES:
        assert f"(plots/{name}.png)" in md
    bps = pd.read_csv(folder / "breakpoints.csv")
    row = bps[(bps.workload == "code") & (bps.kind == "crossover_tpot")].iloc[0]
    assert row.status == bpm.FOUND and row.concurrency == pytest.approx(expected_crossover(0.5))
    profile = json.loads((folder / "k_profile.json").read_text())
    assert profile["meta"]["k_run"] == K and len(profile["accept_at_least"]) == 8


def test_an_interrupted_sweep_renders_what_it_has(tmp_path, capsys):
    folder = write_sweep(tmp_path / "partial", {"chat": 0.7})
    t = pd.read_csv(folder / "steps.csv")
    t = t[(t.concurrency <= 2) & ~((t.concurrency == 2) & (t.arm == "base"))]
    t.to_csv(folder / "steps.csv", index=False)
    info = json.loads((folder / "sweep.json").read_text())
    (folder / "sweep.json").write_text(json.dumps({**info, "status": "interrupted"}))
    assert report_main(parse(add_report_arguments, [str(folder)])) == 0
    printed = capsys.readouterr().out
    assert "status is 'interrupted'" in printed and "3 finished steps" in printed
    md = (folder / "report.md").read_text()
    assert "Status: **interrupted**" in md and "not reached (up to 1)" in md


def test_slo_flags_rejudge_the_steps(tmp_path, capsys):
    folder = write_sweep(tmp_path / "sweep")
    report_main(parse(add_report_arguments, [str(folder), "--slo-tpot-ms", "1"]))
    assert "SLO break none (missed at c=1" in capsys.readouterr().out
    assert "TPOT p99 ≤ 1 ms" in (folder / "report.md").read_text()


def test_compare_overlays_two_sweeps_and_lists_the_changes(tmp_path, capsys):
    a = write_sweep(tmp_path / "before", {"chat": 0.5, "code": 0.5})
    b = write_sweep(tmp_path / "after", {"chat": 0.8, "rag": 0.6})
    out = tmp_path / "cmp"
    assert compare_main(parse(add_compare_arguments, [str(a), str(b), "--out", str(out)])) == 0
    printed = capsys.readouterr().out
    s_a, s_b = expected_speedup_c1(0.5), expected_speedup_c1(0.8)
    chat = next(line for line in printed.splitlines() if line.startswith("chat:"))
    assert f"chat: TPOT speedup at c=1 {s_a:.2f}× (n = 40 spec / 40 base; 95% interval" in chat
    assert f"→ {s_b:.2f}× (n = 40 spec / 40 base; 95% interval" in chat
    assert "measured in only one sweep (not compared): code, rag" in printed
    md = (out / "compare.md").read_text()
    assert f"{s_b / s_a - 1:+.0%}" in md
    assert (out / "compare.html").read_text().count("data:image/png;base64,") == len(FIGURES)
    assert {p.stem for p in (out / "plots").glob("*.png")} == FIGURES


@pytest.mark.parametrize("setup,message", [
    (lambda p: None, "is not a folder"),
    (lambda p: p.mkdir(), "has no steps.csv"),
    (lambda p: (p.mkdir(), (p / "steps.csv").write_text("a,b\n1,2\n")), "lacks the columns"),
    (lambda p: (p.mkdir(), (p / "steps.csv").write_bytes(b"\xff\xfe\x00bad")),
     "not a readable CSV"),
])
def test_bad_folders_give_one_line_and_exit_2(tmp_path, setup, message):
    folder = tmp_path / "x"
    setup(folder)
    proc = subprocess.run([sys.executable, "-m", "spectest.report.cli", "report", str(folder)],
                          capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and message in proc.stderr
    assert "Traceback" not in proc.stderr


def test_an_old_steps_csv_without_interval_columns_still_renders_honestly(tmp_path):
    folder = write_sweep(tmp_path / "old", {"chat": 0.7}, intervals=False)
    assert "tpot_p50_log_se" not in pd.read_csv(folder / "steps.csv").columns
    render_report(folder)
    md = (folder / "report.md").read_text()
    assert "This steps.csv predates the per-request interval columns" in md
    assert f"at concurrency 1 speculation is **{expected_speedup_c1(0.7):.2f}×** faster per " \
           f"output token (n = 40 spec / 40 base; interval unavailable" in md
    assert f"c ≈ {expected_crossover(0.7):.1f}" in md  # the window band still separates them
    assert "goodput tokens estimated" in md or "estimated" in md


def test_the_committed_docs_example_renders(tmp_path):
    out = render_report(ROOT / "docs" / "sweep-example", out=tmp_path / "example")
    md = Path(out.markdown).read_text()
    assert "## Cost and capacity" in md and "interval unavailable" not in md
    # the default sweep of the embedded pair (4k context, every RAG record whole): all three
    # workloads pay at c=1, RAG most — its answers quote their passages
    assert "**chat**: at concurrency 1 speculation is **1.45×** faster per output token " \
           "(n = 25 spec / 24 base; 95% interval 1.37×–1.53×" in md
    assert "**rag**: at concurrency 1 speculation is **1.71×** faster per output " \
           "token (n = 21 spec / 21 base; 95% interval 1.54×–1.90×" in md
    assert "Cost: speculation saves 33% per output token (n = 65 spec at c=8 / 42 base" in md


def test_the_committed_disaggregated_example_states_its_network_term(tmp_path):
    out = render_report(ROOT / "docs" / "disaggregated-example" / "disaggregated",
                        out=tmp_path / "example")
    md = Path(out.markdown).read_text()
    assert "in its own `spectest serve-draft` process" in md and "**Network term.**" in md
    assert "| chat | 1 | 4 | 0.148 | 1.61 (measured) |" in md


def test_compare_shows_the_network_term_of_a_disaggregated_sweep(tmp_path):
    """Co-located vs disaggregated: the engine-round table puts the network ms per round of B
    beside A's zero, and a sweep without round timings (another server) gets no such table."""
    a = write_sweep(tmp_path / "colocated", {"chat": 0.6})
    b = write_sweep(tmp_path / "disaggregated", {"chat": 0.6})
    for folder, net in ((a, 0.0), (b, 1.75)):
        t = pd.read_csv(folder / "steps.csv")
        spec = t.arm == "spec"
        t.loc[spec, "draft_ms_per_round"] = 3.0 + net
        t.loc[spec, "verify_ms_per_round"] = 9.0
        t.loc[spec, "network_ms_per_round"] = net
        t.to_csv(folder / "steps.csv", index=False)
    out = tmp_path / "cmp"
    compare_main(parse(add_compare_arguments, [str(a), str(b), "--out", str(out)]))
    md = (out / "compare.md").read_text()
    assert "## Engine round of the speculative arm" in md
    assert "| chat | 1 | 3.00 | 4.75 | 0.00 | 1.75 | 9.00 | 9.00 |" in md
    plain, folders = tmp_path / "plain", []
    for name in ("x", "y"):  # vLLM-like: no round timings on /metrics
        folder = write_sweep(tmp_path / name, {"chat": 0.6})
        t = pd.read_csv(folder / "steps.csv")
        t["draft_ms_per_round"] = t["verify_ms_per_round"] = float("nan")
        t.to_csv(folder / "steps.csv", index=False)
        folders.append(str(folder))
    compare_main(parse(add_compare_arguments, [*folders, "--out", str(plain)]))
    assert "Engine round" not in (plain / "compare.md").read_text()
