"""Per-request log and per-step summary of a load run — the files the sweep report reads.

One run writes one folder (``--results-dir``; a new test start truncates it):

``requests.jsonl``  one JSON object per finished request, appended and flushed at least once a
    second (a reader should skip a torn last line after a hard kill). Keys: ``step``,
    ``started_at`` (unix s, when sent), ``sent_mono`` (the same instant on CLOCK_MONOTONIC, to
    join server-side stamps taken on the same host), ``worker``, ``workload``, ``record_id``,
    ``turn``, ``ok``, ``status``, ``error``, ``response_id``, ``trace_id`` (the W3C trace id
    sent), ``ttft_ms``, ``tpot_ms``, ``e2el_ms``, ``itl_ms`` (every chunk gap), ``chunks``,
    ``output_tokens``, ``prompt_tokens``, ``tokens_per_chunk``, ``usage_reported``, ``spec``
    (the server's per-response object or null), ``acceptance_rate`` (the response's own
    accepted / draft tokens, null without drafts), ``output_head`` (its first 80 characters
    of output), ``speculative`` (on|off|default, as requested),
    ``schedule_lag_ms`` (open loop: send time minus scheduled arrival), ``slo_ok``,
    ``reconnects`` (1 when the request was resent because the server had closed the kept-alive
    connection without reading it; see ``client.py``), ``client_cpu`` (the share of one core
    the sending Locust process used over the last second; ``cpu.py``). ``spec`` is normalised to spectest's
    shape whatever the server: llama.cpp's ``timings.draft_n`` / ``draft_n_accepted`` become
    ``draft_tokens`` / ``accepted_tokens`` with ``drafts`` null (it does not report them).
``steps.csv``  one row per (step, workload) plus a ``workload = all`` row per step; rewritten
    atomically (temp file + ``os.replace``) whenever it changes, so it is always complete up to
    the last flush. Read it with ``pandas.read_csv``. Columns, in order:

    ====================== ===============================================================
    step                   0-based step index
    workload               chat | code | rag | … | all
    users                  concurrent users in the step (open loop: the pool size)
    request_rate           target Poisson arrivals/s (open loop), empty when closed loop
    speculative            on | off | default (what the client asked for)
    started_at             unix seconds when the step began
    duration_s             step length (to its end, or to now while it runs); the last step
                           ends at the last token received, not at the final scrape
    requests               requests sent in the step that finished (ok + failed)
    failures               of those, failed
    reconnects             requests resent because the server closed a kept-alive connection
                           before reading them (not failures; see ``client.py``)
    usage_missing          successful responses without ``usage``: their output tokens are
                           counted as token chunks, an undercount when a chunk holds several
    errors                 JSON object: the ten most common error messages and their counts
    ttft_p50_ms … _p99_ms  time to first token percentiles (p50, p90, p99), successful only
    tpot_p50_ms …          (E2EL − TTFT) / (N − 1)
    itl_p50_ms …           gaps between streamed chunks (all chunks of all requests)
    e2el_p50_ms …          end-to-end latency
    output_tokens          sum of usage.completion_tokens of successful requests
    output_tokens_per_s    output_tokens / duration_s
    requests_per_s         successful requests / duration_s
    goodput_rps            requests meeting every SLO given / duration_s (DistServe)
    slo_attainment         share of successful requests meeting every SLO
    tokens_per_chunk       output_tokens / chunks (> 1 when a chunk carries a whole round)
    acceptance_source      where the acceptance figures are from: a flavour key (spectest |
                           vllm | sglang | llamacpp: counter deltas on /metrics), "responses"
                           (the per-request stats of the step's responses, summed: a workload
                           row where the server's counters carry no workload label — vLLM
                           with --per-request-spec-decode-metrics, llama.cpp's timings), or
                           empty
    drafts, draft_tokens, accepted_tokens
                           server counter deltas over the step (/metrics at both boundaries),
                           or the responses' sums ("responses"; drafts empty where a server
                           does not report rounds per request: llama.cpp)
    acceptance_rate        Δaccepted / Δdraft_tokens (empty when no drafts)
    mean_accepted_length   1 + Δaccepted / Δdrafts (SGLang: its gauge at the step's end)
    acceptance_note        why acceptance_rate or mean_accepted_length is empty, in words
    client_acceptance_rate, client_mean_accepted_length
                           the same figures summed from the per-response ``spec`` objects
    client_cpu             the busiest load-generating process's mean share of a core it ran
                           or waited to run (1.0 = one core) over the step's requests
    client_saturated       client_cpu ≥ 0.85: the client, not the server, may set the latency
    acceptance_pos_0 …     Δaccepted at draft position i / Δdrafts; as many columns as the
                           largest draft position seen in the run (always last)
    ====================== ===============================================================

    A request belongs to the step in which it was *sent*. vLLM counters have no workload
    label, so only the ``all`` rows carry server figures against a vLLM server.
``scrapes.jsonl``  every ``/metrics`` snapshot taken (step boundaries and live scrapes).
``run.json``  host, model, options, steps and ``status`` (running | finished | aborted).

This module knows nothing about Locust or HTTP: it is fed rows and snapshots.
"""

from __future__ import annotations

import bisect
import json
import math
import os
import time
from array import array
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from spectest import flavours
from spectest.loadgen import cpu as cpu_mod
from spectest.loadgen.client import StreamResult
from spectest.loadgen.scrape import ALL, Acceptance, Snapshot, acceptance

RESPONSES = "responses"  # acceptance_source of figures summed from per-request stats
PERCENTILES = (50, 90, 99)
LATENCIES = ("ttft", "tpot", "itl", "e2el")
COLUMNS = (["step", "workload", "users", "request_rate", "speculative", "started_at",
            "duration_s", "requests", "failures", "reconnects", "usage_missing", "errors"]
           + [f"{m}_p{p}_ms" for m in LATENCIES for p in PERCENTILES]
           + ["output_tokens", "output_tokens_per_s", "requests_per_s", "goodput_rps",
              "slo_attainment", "tokens_per_chunk", "acceptance_source", "drafts",
              "draft_tokens", "accepted_tokens", "acceptance_rate", "mean_accepted_length",
              "acceptance_note", "client_acceptance_rate", "client_mean_accepted_length", "client_cpu",
              "client_saturated"])


def request_acceptance(spec: dict | None) -> float | None:
    """A response's own acceptance rate (accepted / draft tokens), None without drafts."""
    if not spec or not spec.get("draft_tokens"):
        return None
    return round((spec.get("accepted_tokens") or 0) / spec["draft_tokens"], 6)


def request_row(r: StreamResult, *, worker: str, speculative: str, slo_ok: bool,
                schedule_lag_s: float | None = None, client_cpu: float | None = None) -> dict:
    """A StreamResult as one ``requests.jsonl`` object (times in ms, rounded to µs)."""
    ms = lambda s: None if s is None else round(s * 1e3, 3)  # noqa: E731
    return {"started_at": round(r.started_at, 6), "sent_mono": round(r.sent_mono, 6),
            "worker": worker, "workload": r.workload,
            "record_id": r.record_id, "turn": r.turn, "ok": r.ok, "status": r.status,
            "error": r.error, "response_id": r.response_id, "trace_id": r.trace_id,
            "ttft_ms": ms(r.ttft_s), "tpot_ms": ms(r.tpot_s), "e2el_ms": ms(r.e2el_s),
            "itl_ms": np.round(np.multiply(r.itl_s, 1e3), 3).tolist() if r.itl_s else [],
            "chunks": r.chunks,
            "output_tokens": r.output_tokens, "prompt_tokens": r.prompt_tokens,
            "tokens_per_chunk": r.tokens_per_chunk, "usage_reported": r.usage_reported,
            "spec": r.spec, "acceptance_rate": request_acceptance(r.spec),
            "output_head": r.head, "speculative": speculative,
            "schedule_lag_ms": ms(schedule_lag_s),
            "slo_ok": bool(r.ok and slo_ok), "reconnects": r.reconnects,
            "client_cpu": None if client_cpu is None else round(client_cpu, 3)}


@dataclass
class _Bucket:
    """Everything needed for one (step, workload) row."""
    requests: int = 0
    failures: int = 0
    slo_ok: int = 0
    output_tokens: int = 0
    chunks: int = 0
    spec_drafts: float = 0.0
    spec_draft_tokens: float = 0.0
    spec_accepted: float = 0.0
    spec_rows: int = 0  # responses that carried their own draft stats
    spec_rows_with_drafts: int = 0  # responses that said how many drafts (llama.cpp does not)
    reconnects: int = 0
    usage_missing: int = 0
    ttft: array = field(default_factory=lambda: array("d"))
    tpot: array = field(default_factory=lambda: array("d"))
    itl: array = field(default_factory=lambda: array("d"))
    e2el: array = field(default_factory=lambda: array("d"))
    errors: Counter = field(default_factory=Counter)
    cpu: list = field(default_factory=list)  # (worker, client_cpu) of every row

    @property
    def response_rate(self) -> float | None:
        return self.spec_accepted / self.spec_draft_tokens if self.spec_draft_tokens else None

    def response_mean_length(self, ok: int) -> float | None:
        """1 + accepted / drafts, where every successful response said how many drafts."""
        return (1 + self.spec_accepted / self.spec_drafts
                if self.spec_drafts and self.spec_rows_with_drafts == ok else None)

    def from_responses(self, ok: int) -> Acceptance | None:
        """The step's acceptance summed from its responses' own stats (None: no response
        carried any)."""
        if not self.spec_rows:
            return None
        complete = self.spec_rows_with_drafts == ok
        return Acceptance(source=RESPONSES, drafts=self.spec_drafts if complete else None,
                          draft_tokens=self.spec_draft_tokens, accepted=self.spec_accepted,
                          acceptance_rate=self.response_rate,
                          mean_accepted_length=self.response_mean_length(ok))

    def add(self, row: dict) -> None:
        self.requests += 1
        self.cpu.append((row.get("worker", "local"), row.get("client_cpu")))
        self.reconnects += row.get("reconnects") or 0
        if not row["ok"]:
            self.failures += 1
            self.errors[row["error"][:80]] += 1
            return
        self.slo_ok += bool(row["slo_ok"])
        self.usage_missing += not row.get("usage_reported", True)
        self.output_tokens += row["output_tokens"]
        self.chunks += row["chunks"]
        for name in ("ttft", "tpot", "e2el"):
            if row[f"{name}_ms"] is not None:
                getattr(self, name).append(row[f"{name}_ms"])
        self.itl.extend(row["itl_ms"])
        spec = row.get("spec") or {}
        if spec.get("draft_tokens") is not None:
            self.spec_rows += 1
            self.spec_draft_tokens += spec.get("draft_tokens") or 0
            self.spec_accepted += spec.get("accepted_tokens") or 0
            if spec.get("drafts") is not None:
                self.spec_drafts += spec.get("drafts") or 0
                self.spec_rows_with_drafts += 1


@dataclass
class Step:
    index: int
    users: int
    rate: float | None
    started_at: float
    ended_at: float | None = None
    start_snapshot: Snapshot | None = None
    end_snapshot: Snapshot | None = None
    buckets: dict[str, _Bucket] = field(default_factory=dict)


class ResultsSink:
    """Collects request rows and step boundaries on the process that owns the run."""

    def __init__(self, folder: str | os.PathLike, *, speculative: str, run_info: dict):
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.speculative = speculative
        self.run_info = {**run_info, "status": "running", "started_at": time.time()}
        self.steps: list[Step] = []
        self._starts: list[float] = []
        self.latest: Snapshot | None = None
        self.last_byte = 0.0  # unix time the last token of any request arrived
        self.max_positions = 0
        self._dirty = True
        self._cache: dict[int, list[dict]] = {}  # rows of steps that have not changed since
        self._next_csv = 0.0  # monotonic time before which a non-forced flush skips the CSV
        self._requests = open(self.folder / "requests.jsonl", "w", encoding="utf-8")
        self._scrapes = open(self.folder / "scrapes.jsonl", "w", encoding="utf-8")
        for stale in ("steps.csv",):
            (self.folder / stale).unlink(missing_ok=True)
        self.write_run_info()

    @property
    def closed(self) -> bool:
        return self._requests.closed

    # --- feeding -------------------------------------------------------------------------
    def begin_step(self, users: int, rate: float | None, snapshot: Snapshot | None,
                   at: float | None = None) -> Step:
        at = time.time() if at is None else at
        self.record_snapshot(snapshot, "boundary")
        if self.steps:
            self._close(self.steps[-1], at, snapshot)
        step = Step(len(self.steps), users, rate, at, start_snapshot=snapshot or self.latest)
        self.steps.append(step)
        self._cache.pop(step.index - 1, None)
        self._starts.append(at)
        self._dirty = True
        self.write_run_info()
        return step

    def add(self, rows: list[dict]) -> None:
        if not self.steps:
            self.begin_step(0, None, None)
        lines = []
        for row in rows:
            self.last_byte = max(self.last_byte,
                                 row["started_at"] + (row.get("e2el_ms") or 0.0) / 1e3)
            i = max(0, bisect.bisect_right(self._starts, row["started_at"]) - 1)
            step = self.steps[i]
            row = {"step": step.index, **row}
            lines.append(json.dumps(row))
            for key in (row["workload"], ALL):
                step.buckets.setdefault(key, _Bucket()).add(row)
            self._cache.pop(step.index, None)
        if lines:
            self._requests.write("\n".join(lines) + "\n")
            self._dirty = True

    def record_snapshot(self, snapshot: Snapshot | None, kind: str) -> None:
        if snapshot is None:
            return
        self.latest = snapshot
        self._scrapes.write(json.dumps({"kind": kind, "step": len(self.steps) - 1,
                                        **asdict(snapshot)}) + "\n")
        positions = max([len(c.per_pos) for c in snapshot.counters.values()] + [0])
        if positions > self.max_positions:
            self.max_positions = positions
            self._cache.clear()  # every row gains the new acceptance_pos_* columns
        self._dirty = True

    def finish(self, snapshot: Snapshot | None, status: str = "finished") -> None:
        self.record_snapshot(snapshot, "final")
        if self.steps and self.steps[-1].ended_at is None:
            # the last step ends with its last byte, not with the final /metrics scrape, which
            # a busy server can take seconds to answer after the load has stopped: every rate
            # of the step is per second requests were in flight
            end = time.time()
            if self.steps[-1].started_at < self.last_byte < end:
                end = self.last_byte
            self._close(self.steps[-1], end, snapshot)
        self.run_info.update(status=status, ended_at=time.time())
        self.flush(force=True)
        self._requests.close()
        self._scrapes.close()

    def _close(self, step: Step, at: float, snapshot: Snapshot | None) -> None:
        self._cache.pop(step.index, None)
        step.ended_at = at
        step.end_snapshot = snapshot or self.latest

    # --- output --------------------------------------------------------------------------
    def flush(self, force: bool = False) -> None:
        if self.closed:
            return
        self._requests.flush()
        self._scrapes.flush()
        if force or (self._dirty and time.monotonic() >= self._next_csv):
            t0 = time.monotonic()
            self._dirty = False
            _atomic_write(self.folder / "steps.csv", self.frame().to_csv(index=False))
            self.write_run_info()
            # huge steps make percentiles slow: then rewrite the CSV less often (≤ 10 % time)
            took = time.monotonic() - t0
            self._next_csv = t0 + 10 * took if took > 0.05 else 0.0

    def write_run_info(self) -> None:
        info = {**self.run_info, "steps": [
            {"index": s.index, "users": s.users, "request_rate": s.rate,
             "started_at": s.started_at, "ended_at": s.ended_at} for s in self.steps]}
        _atomic_write(self.folder / "run.json", json.dumps(info, indent=2, default=str))

    def rows(self, steps: list[Step] | None = None) -> list[dict]:
        out = []
        for step in self.steps if steps is None else steps:
            cached = self._cache.get(step.index)
            if cached is None:
                server = acceptance(step.start_snapshot, step.end_snapshot or self.latest)
                # a workload of this run whose counters moved in the step gets a row even if
                # none of its requests started in it (a long request that began in the step
                # before): otherwise its accepted tokens would be in no row at all
                seen = set().union(*(s.buckets for s in self.steps))
                moved = {k for k, a in server.items() if k in seen and a.drafts}
                keys = sorted((set(step.buckets) | moved) - {ALL}) + [ALL]
                cached = [self._row(step, key, step.buckets.get(key, _Bucket()), server.get(key))
                          for key in keys]
                if step.ended_at is not None:  # a running step changes every second
                    self._cache[step.index] = cached
            out.extend(cached)
        return out

    def common_error(self) -> str:
        """The most frequent error message of the latest step (one readable line)."""
        for step in reversed(self.steps):
            errors = step.buckets.get(ALL, _Bucket()).errors
            if errors:
                message, count = errors.most_common(1)[0]
                return f"{message!r} ({count}x)"
        return "no error recorded"

    def frame(self) -> pd.DataFrame:
        pos_cols = [f"acceptance_pos_{i}" for i in range(self.max_positions)]
        return pd.DataFrame(self.rows(), columns=COLUMNS + pos_cols)

    def _row(self, step: Step, key: str, b: _Bucket, server: Acceptance | None) -> dict:
        end = step.ended_at if step.ended_at is not None else time.time()
        duration = max(1e-9, end - step.started_at)
        ok = b.requests - b.failures
        row = {"step": step.index, "workload": key, "users": step.users,
               "request_rate": step.rate, "speculative": self.speculative,
               "started_at": round(step.started_at, 3), "duration_s": round(duration, 3),
               "requests": b.requests, "failures": b.failures, "reconnects": b.reconnects,
               "usage_missing": b.usage_missing,
               "errors": json.dumps(dict(b.errors.most_common(10))) if b.errors else None}
        for name in LATENCIES:
            values = np.frombuffer(getattr(b, name), dtype=float) if len(getattr(b, name)) else None
            qs = np.percentile(values, PERCENTILES) if values is not None else [None] * 3
            for p, q in zip(PERCENTILES, qs):
                row[f"{name}_p{p}_ms"] = None if q is None else round(float(q), 3)
        row.update(
            output_tokens=b.output_tokens, output_tokens_per_s=b.output_tokens / duration,
            requests_per_s=ok / duration, goodput_rps=b.slo_ok / duration,
            slo_attainment=b.slo_ok / ok if ok else None,
            tokens_per_chunk=b.output_tokens / b.chunks if b.chunks else None)
        acc = server if server is not None else b.from_responses(ok)
        row.update(
            acceptance_source=acc.source if acc else None,
            drafts=acc.drafts if acc else None, draft_tokens=acc.draft_tokens if acc else None,
            accepted_tokens=acc.accepted if acc else None,
            acceptance_rate=acc.acceptance_rate if acc else None,
            mean_accepted_length=acc.mean_accepted_length if acc else None,
            acceptance_note=_acceptance_note(key, acc, ok, self.latest),
            client_acceptance_rate=b.response_rate,
            client_mean_accepted_length=b.response_mean_length(ok),
            client_cpu=cpu_mod.busiest(b.cpu))
        row["client_saturated"] = cpu_mod.is_saturated(row["client_cpu"])
        for i in range(self.max_positions):
            per = acc.per_position if acc else ()
            row[f"acceptance_pos_{i}"] = per[i] if i < len(per) else None
        return row


def _acceptance_note(key: str, acc: Acceptance | None, ok: int,
                     latest: Snapshot | None) -> str | None:
    """Why a row has no acceptance rate or mean accepted length, in words (None: it has)."""
    if acc is not None and acc.acceptance_rate is not None and \
            acc.mean_accepted_length is not None:
        return None
    if not ok:
        return "no successful request in the step"
    source = latest.source if latest is not None else "none"
    flavour = flavours.BY_KEY.get(source) or flavours.BY_KEY.get(acc.source if acc else "")
    name = flavour.display if flavour else "the server"
    if acc is not None and acc.source == RESPONSES and acc.acceptance_rate is not None:
        return (f"{name} reports no draft rounds per request: the mean accepted length is on "
                f"the all row (its counters)")
    if acc is not None and not acc.draft_tokens and acc.source != RESPONSES and \
            acc.mean_accepted_length is None:
        return "no drafts in the step (speculation off, or nothing to draft)"
    if key != ALL and flavour is not None and not flavour.workload_label:
        how = (f"start it with {flavour.stats_flag}" if flavour.stats_flag
               else "it reports none")
        return (f"{name}'s counters carry no workload label and its responses no per-request "
                f"stats ({how}): see the all row")
    if acc is None:
        return ("no speculative-decoding counters on /metrics and no per-request stats in "
                "the responses (a server without speculation?)")
    return None


def summary_line(row: dict) -> str:
    """One console/log line for a step row."""
    def f(v, spec: str) -> str:
        return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else format(v, spec)
    extra = ""
    if row.get("reconnects"):
        extra += f" reconnects={row['reconnects']}"
    if row.get("usage_missing"):
        extra += (f" no_usage={row['usage_missing']} (tokens counted as chunks: an undercount "
                  f"when a chunk holds several)")
    source = " (from responses)" if row.get("acceptance_source") == RESPONSES else ""
    note = f" [{row['acceptance_note']}]" if row.get("acceptance_note") else ""
    flag = cpu_mod.flag_text(row.get("client_cpu"))
    if flag:
        extra += f" WARNING {flag}"
    return (f"step {row['step']} [{row['workload']}] users={row['users']} "
            f"req={row['requests']} fail={row['failures']} "
            f"ttft_p50={f(row['ttft_p50_ms'], '.1f')}ms tpot_p50={f(row['tpot_p50_ms'], '.2f')}ms "
            f"tok/s={f(row['output_tokens_per_s'], '.1f')} "
            f"acceptance={f(row['acceptance_rate'], '.3f')} "
            f"mean_len={f(row['mean_accepted_length'], '.2f')}{source}{extra}{note}")


def _atomic_write(path: Path, text: str) -> None:
    from spectest import files  # standard library only, as Locust's processes need
    files.write_atomic(path, text)
