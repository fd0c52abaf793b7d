"""The three clients of ``benchmarks/peer_agreement.py`` — spectest's Locust user, NVIDIA AIPerf
and GuideLLM — each run to completion against a server, with the CPU time it used, and its
per-request records read back as one frame (``spectest.report``'s request columns).

Owns the peers' pinned versions and where they are installed (``scripts/install_peers.sh``),
each tool's command line, the prompt files that make AIPerf and GuideLLM repeat spectest's
sequence of prompts, where the clients run (:func:`keep_off`: on the cores other than the
server's) and :class:`CpuMeter` (``RUSAGE_CHILDREN`` around a run, this process being the
subreaper of every descendant so that a tool's processes which outlive their parent are still
waited for and counted; any left running are killed, then counted; Linux: ``/proc``,
``prctl``). Knows nothing of the server's own metrics, or of how the records become figures,
rows and verdicts.
"""

from __future__ import annotations

import ctypes
import json
import os
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd

from spectest import files, procs
from spectest.loadgen.datasets import load_dataset
from spectest.loadgen.runner import LocustRun, run_locust
from spectest.report import peer_aiperf, peer_guidellm
from spectest.report.peer_step import PeerError
from spectest.thirdparty import cache_root

AIPERF, GUIDELLM = "aiperf-0.13.0", "guidellm-0.8.1"
PR_SET_CHILD_SUBREAPER = 36


def peer_python(tool: str) -> Path:
    python = cache_root() / "peers" / tool / "venv" / "bin" / "python"
    if not (python.parent.parent / ".spectest-complete").is_file():
        sys.exit(f"peer_agreement: {tool} is not installed: run scripts/install_peers.sh "
                 f"{tool.split('-')[0]}")
    return python


# --- a client's CPU time and where it runs -------------------------------------------------

def child_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def adopt_orphans() -> None:
    """Become the subreaper of every descendant: a tool's process whose parent exits is
    re-parented here (not to init), so its CPU time still reaches ``RUSAGE_CHILDREN``."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def children() -> dict[int, str]:
    """This process's children: pid → state letter (``Z``: exited, not yet waited for)."""
    out = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[1]) == os.getpid():
            out[int(stat.parent.name)] = fields[0]
    return out


def reap_adopted(known: set[int], grace_s: float = 5.0) -> int:
    """Wait for the children not in ``known`` (orphans adopted during a run); those still
    running after ``grace_s`` are killed. Returns how many had to be killed."""
    deadline, killed = time.monotonic() + grace_s, set()
    while adopted := {p: s for p, s in children().items() if p not in known}:
        for pid, state in adopted.items():
            try:
                if state == "Z":
                    os.waitpid(pid, 0)
                elif time.monotonic() > deadline and pid not in killed:
                    os.kill(pid, signal.SIGKILL)
                    killed.add(pid)
            except (ChildProcessError, ProcessLookupError):
                pass
        time.sleep(0.1)
    return len(killed)


class CpuMeter:
    """``with CpuMeter() as m:`` — ``m.cpu_s``, ``m.wall_s`` and ``m.killed`` of the children
    (and their adopted descendants) that ran inside the block."""

    def __enter__(self) -> CpuMeter:
        self.known = set(children())
        self.cpu0, self.t0 = child_cpu(), time.monotonic()
        return self

    def __exit__(self, *exc) -> None:
        self.killed = reap_adopted(self.known)
        self.cpu_s = child_cpu() - self.cpu0
        self.wall_s = time.monotonic() - self.t0


def keep_off(cpu: int | None) -> None:
    """Run this process, and so every client it starts, on the cores other than the server's
    (when one is left): a client's own CPU use then does not slow the server it measures."""
    cores = os.sched_getaffinity(0) - {cpu}
    if cpu is not None and cores:
        os.sched_setaffinity(0, cores)


# --- the prompts and the three clients -----------------------------------------------------

def load_prompts(workload: str, n: int) -> list[str]:
    """The user turns of the workload's first ``n`` single-turn chat records."""
    records = [r for r in load_dataset(workload, seed=0).records if r.messages][:n]
    return [next(m["content"] for m in r.messages if m["role"] == "user") for r in records]


def write_spectest_prompts(path: Path, texts: list[str], workload: str,
                           max_tokens: int) -> Path:
    """spectest's JSONL; prompt ``i`` is record ``p{i}`` (Locust picks records itself)."""
    files.write_atomic(path, "".join(json.dumps({
        "id": f"p{i}", "category": workload, "expected_output_tokens": max_tokens,
        "messages": [{"role": "user", "content": t}]}) + "\n" for i, t in enumerate(texts)))
    return path


def write_peer_prompts(folder: Path, texts: list[str], order: list[int]) -> dict[str, Path]:
    """One line per request, prompt ``order[j]`` on line ``j``, in AIPerf's ``single_turn``
    (``text``) and GuideLLM's JSONL (``prompt``): both send a file's lines in order, so they
    repeat spectest's sequence of prompts. The output length goes in the request body."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = {"aiperf": folder / "prompts.aiperf.jsonl",
             "guidellm": folder / "prompts.guidellm.jsonl"}
    for client, column in (("aiperf", "text"), ("guidellm", "prompt")):
        files.write_atomic(paths[client], "".join(json.dumps({column: texts[i]}) + "\n"
                                                  for i in order))
    return paths


def run_tool(name: str, argv: list[str], log: Path, timeout_s: float) -> int:
    """Run a peer tool to completion in its own process group (killed at ``timeout_s``), with
    ``HF_HUB_OFFLINE`` unset: both tools refuse offline mode for a local tokenizer folder."""
    env = {k: v for k, v in os.environ.items() if k != "HF_HUB_OFFLINE"}
    child = procs.Child(argv, name=name, log_path=log, env=env).start()
    try:
        return child.proc.wait(timeout_s)
    except subprocess.TimeoutExpired:
        child.stop()
        return 124
    finally:
        child.kill()  # what is left of its process group


def run_spectest(url: str, prompts: Path, users: int, seconds: float, max_tokens: int,
                 out: Path) -> pd.DataFrame:
    outcome = run_locust(LocustRun("chat", host=url, results_dir=out, steps=(users,),
                                   step_time_s=seconds, max_tokens=max_tokens,
                                   dataset=str(prompts), stop_timeout_s=120,
                                   extra_args=("--extra-body", '{"ignore_eos": true}')),
                         timeout_s=seconds + 300)
    if outcome.returncode != 0:
        raise SystemExit(f"peer_agreement: the Locust run failed (log: {outcome.log_path})")
    rows = [json.loads(x) for x in outcome.requests_jsonl.read_text().splitlines()]
    return pd.DataFrame([{
        "started_at": r["started_at"], "ok": r["ok"], "ttft_ms": r["ttft_ms"],
        "prompt": int(str(r["record_id"]).lstrip("p")),
        "tpot_ms": r["tpot_ms"], "output_tokens": r["output_tokens"],
        "ended_at": r["started_at"] + (r["e2el_ms"] or 0) / 1e3,
        **{k: (r.get("spec") or {}).get(k) for k in ("drafts", "draft_tokens",
                                                     "accepted_tokens")}} for r in rows])


def run_aiperf(url: str, model: str, tokenizer: Path, prompts: Path, users: int,
               requests: int, max_tokens: int, out: Path) -> pd.DataFrame:
    argv = [str(peer_python(AIPERF)), "-m", "aiperf", "profile", "--model", model, "--url", url,
            "--endpoint-type", "chat", "--streaming", "--tokenizer", str(tokenizer),
            "--input-file", str(prompts), "--custom-dataset-type", "single_turn",
            "--extra-inputs", f"max_tokens:{max_tokens}", "--extra-inputs", "ignore_eos:true",
            "--extra-inputs", "temperature:0", "--concurrency", str(users),
            "--request-count", str(requests), "--random-seed", "0", "--ui", "none",
            "--no-gpu-telemetry", "--workers-max", "2", "--export-level", "records",
            "--artifact-dir", str(out)]
    log = out.parent / f"{out.name}.log"
    rc = run_tool("AIPerf", argv, log, timeout_s=600 + 10 * requests)
    found = peer_aiperf.runs(out) if out.is_dir() else []
    if rc != 0 or not found:
        raise SystemExit(f"peer_agreement: AIPerf failed (exit {rc}; log: {log})")
    try:
        return peer_aiperf.read_run(found[-1]).requests
    except PeerError as e:
        raise SystemExit(f"peer_agreement: {e}") from None


def run_guidellm(url: str, model: str, tokenizer: Path, prompts: Path, users: int,
                 requests: int, max_tokens: int, out: Path) -> pd.DataFrame:
    backend = {"kind": "openai_http", "target": url, "model": model, "extras": {"body": {
        "max_tokens": max_tokens, "ignore_eos": True, "temperature": 0}}}
    result = out / "benchmarks.json"
    argv = [str(peer_python(GUIDELLM)), "-m", "guidellm", "run",
            "--backend", json.dumps(backend),
            "--profile", json.dumps({"kind": "concurrent", "streams": [users]}),
            "--constraint", f"kind=max_requests,count={requests}",
            "--tokenizer", f"kind=hf_auto,model={tokenizer}",
            "--data", f"kind=json_file,path={prompts}",
            "--output", f"kind=json,path={result}", "--disable-console-interactive"]
    log = out.parent / f"{out.name}.log"
    out.mkdir(parents=True, exist_ok=True)
    rc = run_tool("GuideLLM", argv, log, timeout_s=600 + 10 * requests)
    if rc != 0 or not result.is_file():
        raise SystemExit(f"peer_agreement: GuideLLM failed (exit {rc}; log: {log})")
    try:
        steps = [s for s in peer_guidellm.read(result) if s.concurrency == users]
    except PeerError as e:
        raise SystemExit(f"peer_agreement: {e}") from None
    if not steps:
        raise SystemExit(f"peer_agreement: {result} holds no benchmark at {users} streams")
    return steps[0].requests

