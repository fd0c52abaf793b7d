"""``spectest sweep`` end to end against the bundled engine: real server, real Locust, real files.

The model pair comes from ``$SPECTEST_TEST_MODELS`` (a folder with ``target/`` and ``draft/``),
default the embedded pair. One bounded sweep — two workloads, concurrency 1, 2, 4, both arms,
1 s warm-up + 2 s per look, up to two looks per step — must produce every file of the sweep and
of the report, with figures that agree with the runs they came from, say which steps settled,
and advise a schedule in every server's words (the embedded pair's speculation pays at every
step, so the advice is the always-on arm's own configuration and no third arm runs: the
third-arm path is ``test_sweep_runner``'s and, against real vLLM servers,
``tests/thirdparty/test_vllm_schedule.py``'s). A second sweep
is stopped with SIGTERM after its first step: it exits 130, keeps that step, leaves no server or
Locust process behind, and ``spectest report`` renders it.
"""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from spectest.engine.api import MODELS_DIR
from spectest.sweep.summary import look_dirs

ROOT = Path(__file__).resolve().parents[2]
MODELS = Path(os.environ.get("SPECTEST_TEST_MODELS", MODELS_DIR))
pytestmark = pytest.mark.skipif(not (MODELS / "target" / "config.json").is_file(),
                                reason=f"no model pair in {MODELS} (set SPECTEST_TEST_MODELS)")
FIGURES = {"speedup", "throughput", "tpot", "ttft", "acceptance", "acceptance_per_position",
           "k_advisor", "cost"}


def sweep_cmd(out: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "spectest.sweep.cli", "--model", str(MODELS / "target"),
            "--draft", str(MODELS / "draft"), "--step-time", "2", "--warmup", "1",
            "--max-tokens", "24", "--out", str(out), *extra]


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}").exists() and "zombie" not in \
        Path(f"/proc/{pid}/status").read_text().lower()


def processes_mentioning(text: str) -> list[int]:
    found = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit() and int(proc.name) != os.getpid():
            try:
                if text in (proc / "cmdline").read_bytes().decode(errors="replace"):
                    found.append(int(proc.name))
            except OSError:
                continue
    return found


def test_a_short_sweep_writes_every_file(tmp_path):
    out = tmp_path / "sweep"
    proc = subprocess.run(sweep_cmd(out, "--workloads", "chat,code", "--steps", "1,2,4",
                                    "--max-step-time", "4"),
                          capture_output=True, text=True, cwd=ROOT, timeout=400)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "chat · spec · look 1/2 · c=1 · step 1/6" in proc.stdout
    assert f"report: {out / 'report.html'}" in proc.stdout

    info = json.loads((out / "sweep.json").read_text())
    assert info["status"] == "finished" and info["finished_steps"] == 12
    assert not alive(info["server"]["pid"])
    table = pd.read_csv(out / "steps.csv")
    grid = {(r.workload, r.arm, r.concurrency) for r in table.itertuples()}
    assert grid == {(w, a, c) for w in ("chat", "code") for a in ("spec", "base")
                    for c in (1, 2, 4)}
    assert (table.requests > 0).all() and (table.failures == 0).all()
    # decisive steps: one or two looks each, said so, the critical value of their looks
    assert set(table.looks) <= {1, 2} and set(table.decided) <= {"settled", "cap"}
    assert (table[table.looks == 2].interval_z > 2.15).all()
    for r in table[table.looks == 2].itertuples():
        assert (out / r.run_dir / "look2" / "requests.jsonl").is_file()
    assert (table.running_mean > 0).all() and (table.running_max <= table.concurrency).all()
    assert (table.output_tokens_per_s > 0).all() and (table.verify_ms_per_round > 0).all()
    spec, base = table[table.arm == "spec"], table[table.arm == "base"]
    assert (spec.k == 4).all() and (spec.drafts > 0).all() and (spec.draft_ms_per_round > 0).all()
    assert (base.drafts == 0).all() and base.acceptance_rate.isna().all()
    assert (spec.acceptance_source == "spectest").all()
    for r in table.itertuples():  # each row summarises its own Locust folders (its looks)
        sent = [json.loads(x) for run in look_dirs(out / r.run_dir)
                for x in (run / "requests.jsonl").read_text().splitlines()]
        assert r.requests == sum(1 for x in sent if x["step"] >= 1)
        assert {x["speculative"] for x in sent} == {"off" if r.arm == "base" else "on"}

    for name in ("report.html", "report.md", "breakpoints.csv", "k_advice.csv", "cost.csv",
                 "k_profile.json", "schedule.json", "server.log"):
        assert (out / name).stat().st_size > 0, name
    assert {p.stem for p in (out / "plots").glob("*.png")} == FIGURES
    md = (out / "report.md").read_text()
    # 2 s steps: a verdict or "not enough data", but always with the requests behind it
    for w in ("chat", "code"):
        assert f"**{w}**: at concurrency 1 " in md
        line = next(x for x in md.splitlines() if x.startswith(f"- **{w}**"))
        assert "n = " in line and ("interval" in line or "not enough data" in line)
    two = table.requests - table.failures >= 2  # a step with 2+ successes has an interval
    assert table[two].tpot_p50_log_se.notna().all() and table[~two].tpot_p50_log_se.isna().all()
    bps = pd.read_csv(out / "breakpoints.csv")
    assert set(bps.kind) == {"crossover_tpot", "crossover_throughput", "slo", "knee",
                             "max_goodput"}
    advice = pd.read_csv(out / "k_advice.csv")
    assert set(advice.workload) == {"chat", "code"}
    assert "## Configuration: the schedule in each server's words" in md
    assert "Settled:" in md and "repeated confidence intervals" in md
    schedules = json.loads((out / "schedule.json").read_text())["schedules"]
    assert [s["name"] for s in schedules] == ["chat", "code", "mix"]
    for s in schedules:  # in every flavour's words, whatever the verdict
        assert set(s["flags"]) == {"spectest", "vllm", "sglang", "llamacpp"}


def test_sigterm_keeps_finished_steps_and_cleans_up(tmp_path):
    out = tmp_path / "stopped"
    proc = subprocess.Popen(sweep_cmd(out, "--workloads", "chat", "--steps", "1,2,4",
                                      "--max-step-time", "2"),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            cwd=ROOT)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and proc.poll() is None:
            if (out / "steps.csv").exists():
                break
            time.sleep(0.3)
        assert (out / "steps.csv").exists(), "no step finished in time"
        proc.send_signal(signal.SIGTERM)
        output, _ = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    # a dropped interrupt prints "Exception ignored in ..." where it was dropped: show it
    dropped = [line for line in output.splitlines() if "ignored" in line or "Interrupt" in line]
    assert proc.returncode == 130, "\n".join(dropped) + "\n" + output[-3000:]
    assert "render it with: spectest report" in output
    info = json.loads((out / "sweep.json").read_text())
    assert info["status"] == "interrupted"
    rows = pd.read_csv(out / "steps.csv")
    assert 1 <= len(rows) == info["finished_steps"] < 6
    assert not alive(info["server"]["pid"])
    assert processes_mentioning(str(out)) == []  # no Locust left running
    report = subprocess.run([sys.executable, "-m", "spectest.report.cli", "report", str(out)],
                            capture_output=True, text=True, cwd=ROOT, timeout=180)
    assert report.returncode == 0, report.stderr
    assert "status is 'interrupted'" in report.stdout and (out / "report.html").is_file()


def test_a_disaggregated_sweep_measures_the_network_term(tmp_path):
    """``--disaggregated``: the draft in its own ``spectest serve-draft``; the steps carry the
    network milliseconds per round, the report states the term, both servers are gone after."""
    out = tmp_path / "disaggregated"
    proc = subprocess.run(sweep_cmd(out, "--workloads", "chat", "--steps", "1,2",
                                    "--disaggregated", "--verify-advice", "off",
                                    "--max-step-time", "2"),
                          capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    info = json.loads((out / "sweep.json").read_text())
    assert info["config"]["disaggregated"] and info["draft_server"]["serve_args"]
    assert "--draft-url" in info["server"]["serve_args"]
    assert not alive(info["server"]["pid"]) and not alive(info["draft_server"]["pid"])
    table = pd.read_csv(out / "steps.csv")
    spec, base = table[table.arm == "spec"], table[table.arm == "base"]
    assert (spec.drafts > 0).all() and (table.failures == 0).all()
    assert (spec.network_ms_per_round > 0).all()
    assert (spec.network_ms_per_round < spec.draft_ms_per_round).all()
    assert (table.draft_errors == 0).all()
    assert base.network_ms_per_round.fillna(0).eq(0).all()  # no drafts, no round trips
    md = (out / "report.md").read_text()
    assert "in its own `spectest serve-draft` process" in md and "**Network term.**" in md
    advice = pd.read_csv(out / "k_advice.csv")
    assert (advice.network_source == "measured").all() and (advice.network_ms_per_round > 0).all()
