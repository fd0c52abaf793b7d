"""Reproduce docs/llamacpp-example/: spectest against llama.cpp's llama-server + SmolLM2.

Starts real llama-servers on loopback (``spectest.thirdparty.llama_server``; build the binary
first with ``scripts/install_llama_server.sh``) and runs the user-facing commands against
them, exactly as a user would type them:

* ``spectest sweep --host <speculative> --baseline-host <plain>`` for each speculation type
  (n-gram, and draft-model with the in-repo SmolLM2 draft when its GGUF exists), chat, code and
  RAG traffic;
* ``spectest audit --candidate <speculative> --baseline <plain>`` for each.

    python scripts/llamacpp_example.py --out docs/llamacpp-example [--quick]
    SPECTEST_SMOKE=1 python scripts/llamacpp_example.py --quick --kinds draft --out /tmp/x

``--quick`` shortens the steps and the audits; with ``SPECTEST_SMOKE=1`` (spectest.smoke) the
sweeps and audits shrink to token sizes: the short mode the docs' tests run.

Each server gets one thread and 2 slots (``-np 2``), the sizes a 2-core machine can hold two
of. It prints the commands it runs; the folders it writes are what the docs commit.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from spectest.engine.gguf_loader import find_smollm2  # noqa: E402
from spectest.procs import exit_on_sigterm  # noqa: E402
from spectest.thirdparty.llama_server import LlamaServer, LlamaServerSpec  # noqa: E402

DRAFT_GGUF = ROOT / "spectest" / "models" / "smollm2-draft" / "smollm2-draft.gguf"


def run(cmd: list[str]) -> int:
    print("$", " ".join(cmd), flush=True)
    return subprocess.call(cmd, cwd=ROOT)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "llamacpp-example")
    ap.add_argument("--quick", action="store_true", help="short steps (a smoke run)")
    ap.add_argument("--kinds", default="ngram,draft", help="speculation types to run")
    ap.add_argument("--steps", default="1,2")
    ap.add_argument("--step-time", default="20")
    ap.add_argument("--skip-sweep", action="store_true", help="run the audits only")
    a = ap.parse_args()
    exit_on_sigterm()  # a killed run stops its servers
    model = find_smollm2()
    kinds = {"ngram": LlamaServerSpec(model, spec_type="ngram-simple")}
    if DRAFT_GGUF.exists():
        kinds["draft"] = LlamaServerSpec(model, spec_type="draft-simple", draft=DRAFT_GGUF,
                                         draft_max=4)
    else:
        print(f"no draft GGUF at {DRAFT_GGUF}: draft-model runs skipped (no draft sharing "
              f"SmolLM2's tokenizer ships yet)", flush=True)
    wanted = [k for k in a.kinds.split(",") if k in kinds]
    a.out.mkdir(parents=True, exist_ok=True)
    logs = a.out / "server-logs"
    status = 0
    with LlamaServer(LlamaServerSpec(model), logs / "plain.log") as plain:
        for kind in wanted:
            t0 = time.time()
            with LlamaServer(kinds[kind], logs / f"{kind}.log") as spec:
                sweep = [sys.executable, "-m", "spectest", "sweep", "--host", spec,
                         "--baseline-host", plain, "--workloads", "chat,code,rag", "--steps", a.steps,
                         "--step-time", "4" if a.quick else a.step_time,
                         "--out", str(a.out / f"sweep-{kind}")]
                if a.quick:
                    sweep += ["--min-requests-per-step", "3", "--warmup", "0"]
                if not a.skip_sweep:
                    status |= run(sweep)
                audit = [sys.executable, "-m", "spectest", "audit", "--candidate", spec,
                         "--baseline", plain, "--out", str(a.out / f"audit-{kind}"),
                         "--no-progress"]
                if a.quick:
                    audit += ["--num-prompts", "4", "--samples-per-prompt", "2"]
                rc = run(audit)
                status |= rc if rc != 1 else 0  # drift found is a finding, not a failure
            print(f"{kind}: {time.time() - t0:.0f} s", flush=True)
    return status


if __name__ == "__main__":
    sys.exit(main())
