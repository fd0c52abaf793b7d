"""Benchmark: what each audit profile catches on the bundled engine, and how often it alarms.

Runs ``spectest audit`` the way a user does — the CLI, default settings but ``--profile`` and
``--seed`` — once per (target, profile, seed), each against a freshly started ``spectest serve``
(the embedded pair, one thread, ``--kv-budget-tokens 4096`` so that the preemption condition
can be met), candidate and baseline on that one server through its per-request switch:

correct (every verdict but pass is a false alarm):
  * ``aa`` — speculation off on both sides: the target against itself;
  * ``spec`` — draft-model speculation against target-only decoding;
the conditional faults (``spectest.engine.faults.CONDITIONAL``; every verdict but drift /
candidate failed is a miss), each wrong only when ...:
  * ``mixed-batch-greedy`` — a sampled request shares its batch with greedy ones;
  * ``rewind-past-256`` — a sequence is past position 256;
  * ``prefix-hit-stale-kv`` — a prompt's prefix comes from the prefix cache;
  * ``draft-only-penalties`` — a request carries a penalty or logit_bias;
  * ``decay-after-requests`` — the server has served ``--fault-after`` requests (then more
    often with every request).

Each run appends one JSON line to ``--json`` (verdict, the failed checks by condition, which
conditions were reached, wall time), so a long measurement can be run in parts and resumed;
``--table`` prints, per target and profile, the detection (or false-alarm) rate with the runs
behind it and a 95 % Clopper-Pearson interval, and which condition caught each fault.

    python benchmarks/audit_conditions.py --profiles default --targets aa,spec --seeds 0-24
    python benchmarks/audit_conditions.py --profiles full --targets all --seeds 0-9 --jobs 2
    python benchmarks/audit_conditions.py --table runs.jsonl
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from scipy import stats

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from spectest import procs  # noqa: E402
from spectest.audit.servers import ServerProcess, ServerSpec, fault_args  # noqa: E402
from spectest.engine.faults import CONDITIONAL  # noqa: E402

CORRECT = ("aa", "spec")
TARGETS = CORRECT + tuple(CONDITIONAL)
OFF = '{"speculative": false}'


def run_one(target: str, profile: str, seed: int, fault_after: int, extra: list[str]) -> dict:
    faults = () if target in CORRECT else (target,)
    flags = ("--kv-budget-tokens", "4096", "--fault-after", str(fault_after))
    spec = ServerSpec(threads=1, extra_args=fault_args(faults) + flags)
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="spectest-conditions-") as tmp, \
            ServerProcess(spec) as url:
        argv = [*procs.python_argv("spectest", "audit"), "--candidate", url, "--baseline", url,
                "--profile", profile, "--seed", str(seed), "--out", tmp, "--no-progress",
                *extra]
        if target == "aa":
            argv += ["--candidate-extra", OFF, "--baseline-extra", OFF]
        proc = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT,
                              env=procs.python_env(), timeout=3600, check=False)
        try:
            report = json.loads((Path(tmp) / "report.json").read_text())
        except (OSError, json.JSONDecodeError):
            report = {"verdict": "no report", "checks": {}, "conditions": []}
    failed = sorted({f"{c.get('condition', 'base')}: {name.split(': ')[-1]}"
                     for name, c in report["checks"].items() if c["status"] == "fail"})
    return {"target": target, "profile": profile, "seed": seed, "fault_after": fault_after,
            "verdict": report["verdict"], "exit": proc.returncode, "failed": failed,
            "conditions": {c["name"]: c["status"] for c in report.get("conditions", [])},
            "wall_s": round(time.perf_counter() - t0, 1),
            "stderr": proc.stderr[-300:] if proc.returncode == 2 else ""}


def seeds(text: str) -> list[int]:
    out = []
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        out += list(range(int(lo), int(hi or lo) + 1))
    return out


def interval(k: int, n: int) -> str:
    ci = stats.binomtest(k, n).proportion_ci(method="exact")
    return f"{100 * ci.low:.0f}–{100 * ci.high:.0f} %"


def table(path: Path) -> str:
    runs = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    groups = defaultdict(list)
    for r in runs:
        groups[(r["target"], r["profile"])].append(r)
    lines = ["| target | profile | should | runs | rate | 95 % interval | caught by | wall |",
             "|---|---|---|---|---|---|---|---|"]
    for target in TARGETS:
        for profile in ("default", "full"):
            rs = groups.get((target, profile))
            if not rs:
                continue
            correct = target in CORRECT
            alarms = sum(r["verdict"] != "pass" for r in rs)
            k = alarms if correct else sum(r["verdict"] in ("drift", "candidate failed")
                                           for r in rs)
            caught = Counter(f for r in rs for f in r["failed"])
            where = "; ".join(f"{f} ({c})" for f, c in caught.most_common(4)) or "—"
            walls = sorted(r["wall_s"] for r in rs)
            lines.append(f"| {target} | {profile} | {'pass' if correct else 'fail'} | "
                         f"{len(rs)} | {'false alarms' if correct else 'caught'} {k}/{len(rs)}"
                         f" | {interval(k, len(rs))} | {where} | "
                         f"{walls[len(walls) // 2] / 60:.1f} min |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--targets", default="all", help=f"comma-separated: {', '.join(TARGETS)}"
                        " or all")
    parser.add_argument("--profiles", default="default,full")
    parser.add_argument("--seeds", default="0-9", help="e.g. 0-9 or 0,3,5")
    parser.add_argument("--fault-after", type=int, default=1000,
                        help="decay-after-requests starts after this many requests")
    parser.add_argument("--jobs", type=int, default=1, help="audits at once (one core each)")
    parser.add_argument("--json", type=Path, default=Path("audit-conditions.jsonl"),
                        help="runs are appended here (resumable: done runs are skipped)")
    parser.add_argument("--table", type=Path, default=None, help="print the table of a file")
    parser.add_argument("--audit-args", default="", help="more `spectest audit` flags")
    args = parser.parse_args()
    if args.table:
        print(table(args.table))
        return 0
    procs.exit_on_sigterm()
    targets = TARGETS if args.targets == "all" else tuple(args.targets.split(","))
    done = set()
    if args.json.exists():
        done = {(r["target"], r["profile"], r["seed"]) for r in
                map(json.loads, filter(str.strip, args.json.read_text().splitlines()))}
    jobs = [(t, p, s) for p in args.profiles.split(",") for s in seeds(args.seeds)
            for t in targets if (t, p, s) not in done]
    lock = threading.Lock()

    def one(job):
        row = run_one(*job, args.fault_after, args.audit_args.split())
        if "could not run: interrupted" in row["stderr"]:  # stopped from outside: no outcome
            print(f"{row['target']:>22} {row['profile']:>7} seed {row['seed']:>2}: interrupted, "
                  "not recorded (a rerun runs it)", flush=True)
            return
        with lock, args.json.open("a") as f:
            f.write(json.dumps(row) + "\n")
        print(f"{row['target']:>22} {row['profile']:>7} seed {row['seed']:>2}: "
              f"{row['verdict']:>16} {row['wall_s']:6.0f} s  {', '.join(row['failed'])[:90]}",
              flush=True)

    with ThreadPoolExecutor(args.jobs) as pool:
        list(pool.map(one, jobs))
    print(table(args.json))
    return 0


if __name__ == "__main__":
    sys.exit(main())
