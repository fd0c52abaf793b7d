"""From verdict to configuration against real vLLM servers: a sweep of a speculative server
against a plain one advises a ``num_speculative_tokens_per_batch_size`` schedule; a third vLLM
server started with exactly that ``--speculative-config`` runs as the advised arm of a second
sweep, and the report sets it against the better of the two at every step.

Short on purpose (draft-model speculation on the embedded pair, code workload, c = 1 and 2,
5 s looks, 32 tokens): it checks that the advice
is produced from the measurement, that vLLM takes it as written, and that the verification is
measured and reported — not what the schedule is, which depends on the machine.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pandas as pd

from spectest.thirdparty.vllm_server import VllmServer
from tests.thirdparty.conftest import K, SPECS

ROOT = Path(__file__).resolve().parents[2]
COMMON = ["--workloads", "code", "--steps", "1,2", "--step-time", "5", "--warmup", "1",
          "--max-tokens", "32", "--min-requests-per-step", "5"]


def sweep(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "spectest", "sweep", *COMMON, *argv],
                          capture_output=True, text=True, timeout=600, cwd=ROOT)


def test_vllm_takes_the_advised_schedule_and_the_sweep_verifies_it(vllm, tmp_path):
    draft = SPECS["draft-model"]
    config = json.dumps(draft.speculative_config())
    first = tmp_path / "advise"
    proc = sweep("--host", vllm.draft, "--baseline-host", vllm.plain, "--max-step-time", "10",
                 "--speculative-config", config, "--out", str(first))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    plan = next(s for s in json.loads((first / "schedule.json").read_text())["schedules"]
                if s["name"] == "code")
    assert plan["status"] != "no schedule", plan["why"]  # the sweep placed the crossover
    ranges = plan["vllm_per_batch_size"]
    assert ranges[0][0] == 1 and all(r[2] in (0, K) for r in ranges)
    # the advice in vLLM's own words: the candidate's config, with the schedule in it where
    # it switches (on at every batch size it is the candidate's own config)
    assert plan["flags"]["vllm"].startswith("--speculative-config '{\"model\": ")
    assert (json.dumps(ranges) in plan["flags"]["vllm"]) == (plan["status"] == "schedule")
    md = (first / "report.md").read_text()
    assert "## Configuration: the schedule in each server's words" in md
    assert "vLLM (the server measured)" in md and "running-requests gauge" in md
    steps = pd.read_csv(first / "steps.csv")
    assert steps.running_mean.notna().all() and set(steps.decided) <= {"settled", "cap"}

    advised = VllmServer(replace(draft, name="embedded-advised", cpu=1,
                                 schedule=tuple(map(tuple, ranges))), vllm.logs / "advised.log")
    with advised as url:
        second = tmp_path / "verify"
        proc = sweep("--host", vllm.draft, "--baseline-host", vllm.plain, "--advised-host", url,
                     "--advised-schedule", f"{first / 'schedule.json'}:code",
                     "--max-step-time", "5", "--out", str(second))
    log = (vllm.logs / "advised.log").read_text(errors="replace")
    assert "num_speculative_tokens_per_batch_size" in log  # vLLM read the schedule
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    table = pd.read_csv(second / "steps.csv")
    assert set(table.arm) == {"spec", "base", "spec-advised"}
    adv = table[table.arm == "spec-advised"].set_index("concurrency")
    assert list(adv.index) == [1, 2] and (adv.failures == 0).all()
    for c, row in adv.iterrows():  # it speculated where its schedule says K > 0
        k = next(r[2] for r in ranges if r[0] <= c <= r[1]) if c <= ranges[-1][1] \
            else ranges[-1][2]
        assert (row.drafts > 0) == (k > 0) or row.running_min < c, (c, k, row.drafts)
    md = (second / "report.md").read_text()
    section = md.split("## Verification: the advice, run", 1)[1].split("\n## ", 1)[0]
    assert "| code | 1 |" in section and "| code | 2 |" in section
    assert "code's schedule, which the advised server ran" in section
    assert "n = " in section and "interval" in section
