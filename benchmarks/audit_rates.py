"""Benchmark: the auditor's false-alarm and detection rates against real llama-servers.

Runs ``spectest audit`` the way a user does — the CLI, default settings unless ``--checks`` or
``--audit-args`` say otherwise — once per seed (``--seed`` changes the sampled seeds, not the
prompts) against a plain llama-server baseline (SmolLM2, one thread, 2 slots, as in
``scripts/llamacpp_example.py``), with these candidates:

correct (every verdict but pass is a false alarm):
  * ``ngram`` — llama.cpp's n-gram speculation (``--spec-type ngram-simple``);
  * ``draft`` — draft-model speculation with the in-repo SmolLM2 draft (K = 4);
  * ``aa`` — a second plain llama-server: the target against itself (A/A);
impostors (every verdict but drift / candidate failed is a miss):
  * ``cooler`` — a proxy in front of the n-gram server that multiplies the temperature of
    sampled requests by 0.6 (a sampling setting that reaches one side only);
  * ``synth`` — llama.cpp's synthetic-acceptance benchmarking mode (``--spec-synth-rates
    0.9,0.7,0.5,0.3``: drafts accepted with fixed odds, whatever the target says).

Each rate is printed with the runs behind it and a 95 % Clopper-Pearson interval; a JSON file
keeps every run's verdict, the sampled check's p-values (the candidate's against the baseline's
own samples, and the control's), the noise floor and the wall time.

    python benchmarks/audit_rates.py --pairs ngram,draft,aa,cooler,synth --seeds 0-3
    python benchmarks/audit_rates.py --pairs ngram --seeds 0-9 --checks distribution

Needs ``scripts/install_llama_server.sh`` (llama-server) and SmolLM2's GGUF.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

from scipy import stats

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from spectest import files, procs  # noqa: E402
from spectest.engine.gguf_loader import find_smollm2  # noqa: E402
from spectest.thirdparty.llama_server import LlamaServer, LlamaServerSpec  # noqa: E402
from tests.proxies import TemperatureProxy  # noqa: E402

DRAFT_GGUF = ROOT / "spectest" / "models" / "smollm2-draft" / "smollm2-draft.gguf"
CORRECT = ("ngram", "draft", "aa")
IMPOSTORS = ("cooler", "synth")


def candidate(pair: str, model: Path, logs: Path, stack: ExitStack) -> tuple[str, list[str]]:
    """Start ``pair``'s candidate; returns its URL and the extra audit flags it needs."""
    specs = {"ngram": LlamaServerSpec(model, spec_type="ngram-simple"),
             "draft": LlamaServerSpec(model, spec_type="draft-simple", draft=DRAFT_GGUF,
                                      draft_max=4),
             "aa": LlamaServerSpec(model),
             "synth": LlamaServerSpec(model, spec_type="draft-simple", draft=DRAFT_GGUF,
                                      draft_max=4, synth_rates=(0.9, 0.7, 0.5, 0.3))}
    if pair == "cooler":
        url = stack.enter_context(LlamaServer(specs["ngram"], logs / "cooler-upstream.log"))
        return stack.enter_context(TemperatureProxy(url, 0.6)), ["--candidate-flavour", "llamacpp"]
    return stack.enter_context(LlamaServer(specs[pair], logs / f"{pair}.log")), []


def audit(cand: str, base: str, seed: int, out: Path, args: list[str]) -> dict:
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "spectest", "audit", "--candidate", cand,
                           "--baseline", base, "--seed", str(seed), "--out", str(out),
                           "--no-progress", *args], cwd=ROOT, capture_output=True, text=True,
                          env=procs.python_env())
    row = {"seed": seed, "exit": proc.returncode, "wall_s": round(time.monotonic() - t0, 1)}
    try:
        report = json.loads((out / "report.json").read_text())
    except (OSError, ValueError):
        row["verdict"] = "no report: " + (proc.stderr or proc.stdout).strip()[-300:]
        return row
    row["verdict"] = report.get("verdict")
    row["checks"] = {k: c.get("status") for k, c in report.get("checks", {}).items()}
    dist = report.get("checks", {}).get("distribution", {})
    test = dist.get("test") or {}
    row["p"] = test.get("p_value")
    row["p_parts"] = {k: test.get(k) for k in ("p_z", "p_ks", "p_cal", "p_support")}
    own = (dist.get("control") or {}).get("baseline_tokens_vs_its_scoring") or {}
    row["control_p"] = own.get("p_value")
    row["noise_floor_max_kl"] = (report.get("noise_floor") or {}).get("max_kl")
    return row


def rate(k: int, n: int) -> str:
    if not n:
        return "no runs"
    ci = stats.binomtest(k, n).proportion_ci(0.95)
    return (f"{k}/{n} ({100 * k / n:.0f} %; 95 % interval {100 * ci.low:.0f}–"
            f"{100 * ci.high:.0f} %)")


def seeds_of(text: str) -> list[int]:
    if "-" in text:
        lo, hi = text.split("-")
        return list(range(int(lo), int(hi) + 1))
    return [int(s) for s in text.split(",")]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pairs", default="ngram,draft,aa,cooler,synth")
    ap.add_argument("--seeds", default="0-3", help="e.g. 0-9 or 0,4,7")
    ap.add_argument("--checks", default="", help="passed to the audit (default: all)")
    ap.add_argument("--audit-args", default="", help="more audit flags, one string")
    ap.add_argument("--json", type=Path, default=None)
    a = ap.parse_args()
    procs.exit_on_sigterm()
    pairs = [p for p in a.pairs.split(",") if p]
    unknown = set(pairs) - set(CORRECT) - set(IMPOSTORS)
    if unknown:
        ap.error(f"unknown pair(s): {', '.join(sorted(unknown))}")
    model = find_smollm2()
    extra = (["--checks", a.checks] if a.checks else []) + a.audit_args.split()
    work = Path(tempfile.mkdtemp(prefix="audit-rates-"))
    results: dict[str, list[dict]] = {}
    t0 = time.monotonic()
    with LlamaServer(LlamaServerSpec(model), work / "baseline.log") as base:
        for pair in pairs:
            with ExitStack() as stack:
                cand, flags = candidate(pair, model, work, stack)
                for seed in seeds_of(a.seeds):
                    row = audit(cand, base, seed, work / f"{pair}-s{seed}", extra + flags)
                    results.setdefault(pair, []).append(row)
                    print(f"{pair} seed {seed}: {row['verdict']} (p = {row.get('p')}, control "
                          f"p = {row.get('control_p')}, {row['wall_s']:.0f} s)", flush=True)
    lines = []
    for pair, rows in results.items():
        if pair in CORRECT:
            k = sum(r["verdict"] != "pass" for r in rows)
            lines.append(f"{pair} (correct): false alarms {rate(k, len(rows))}")
        else:
            k = sum(r["verdict"] in ("drift", "candidate failed") for r in rows)
            lines.append(f"{pair} (impostor): detected {rate(k, len(rows))}")
    print("\n".join(lines))
    if a.json:
        files.write_atomic(a.json, json.dumps({
            "date": time.strftime("%Y-%m-%d"), "command": " ".join(sys.argv),
            "wall_s": round(time.monotonic() - t0), "summary": lines, "runs": results},
            indent=2) + "\n")
    print(f"work folder: {work}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
