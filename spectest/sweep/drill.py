"""The rollback drill: flip speculation off (and back on) under a live Locust run.

Owns: :func:`run_drill` — start the bundled server (:class:`EmbeddedServer`), run one headless
Locust workload against it, and at planned instants ``POST /admin/speculation`` (off, then on
again), reading the switch gauges on ``/metrics`` after each flip; and :func:`analyse` — the
Locust ``requests.jsonl`` plus the flips → a timeline of time per output token (TPOT) in fixed
bins, the level before and after each flip, and how long after each flip the TPOT users saw
crossed to the new level.  Every figure comes with the requests behind it.

How "time to changed TPOT" is measured: each streamed chunk is placed on the wall clock
(request start + TTFT + the inter-chunk gaps) and carries its request's tokens per chunk; a
bin's TPOT is its chunks' gaps over their tokens.  The level before a flip is the median of the
bins in the window before it, the level after is the median of the bins in the second half of
the window after it, and the change time is when the TPOT of the bins from there on first stays
nearer the new level than the old one.

Does not know: how the engine applies a switch (``engine.control``), or Locust's internals.
"""

from __future__ import annotations

import json
import statistics
import threading
import time
import urllib.request
from dataclasses import asdict, dataclass
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from spectest.loadgen.runner import LocustRun, run_locust
from spectest.sweep.embedded import EmbeddedServer
from spectest.telemetry import names as N

ADMIN = "/admin/speculation"
BIN_S = 0.5


@dataclass(frozen=True)
class Flip:
    at_s: float  # seconds after the Locust run started, as planned
    enabled: bool


@dataclass(frozen=True)
class FlipRecord:
    enabled: bool
    requested_at: float  # time.time() when the POST was sent
    effective_after_s: float | None  # the server: request → round boundary
    round: int | None
    gauge_enabled: float | None  # spectest_speculation_enabled read after the flip
    switches_total: float | None


@dataclass(frozen=True)
class FlipEffect:
    enabled: bool
    tpot_before_ms: float | None
    tpot_after_ms: float | None
    changed_after_s: float | None  # flip → TPOT users saw settled at the new level
    requests_before: int  # requests finished in the window before the flip
    requests_after: int  # requests run entirely under the new setting (until the next flip)
    drafted_after: int  # of those, requests that drafted (0 after "off", all after "on")


def _post(url: str, body: dict) -> dict:
    req = urllib.request.Request(url + ADMIN, json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as resp:
        return json.loads(resp.read())


def _gauges(url: str) -> tuple[float | None, float | None]:
    with urllib.request.urlopen(url + "/metrics", timeout=30) as resp:
        values = {s.name: s.value for family in text_string_to_metric_families(
            resp.read().decode()) for s in family.samples}
    return (values.get(N.SPECULATION_ENABLED.sample_name),
            values.get(N.SPECULATION_SWITCHES.sample_name))


def _flipper(url: str, flips: tuple[Flip, ...], t0: float, out: list[FlipRecord],
             stop: threading.Event) -> None:
    for flip in flips:
        if stop.wait(max(0.0, t0 + flip.at_s - time.time())):
            return
        sent = time.time()
        state = _post(url, {"enabled": flip.enabled})
        change = state.get("change") or {}
        enabled, switches = _gauges(url)
        out.append(FlipRecord(flip.enabled, sent, change.get("effective_after_s"),
                              change.get("round"), enabled, switches))


def run_drill(out: Path, serve_args: list[str], workload: str = "chat", users: int = 4,
              run_time_s: float = 40.0, flips: tuple[Flip, ...] = (Flip(15, False),
                                                                   Flip(28, True)),
              max_tokens: int = 0) -> dict:
    """Run the drill; writes ``drill.json`` (and Locust's folder under ``locust/``)."""
    out.mkdir(parents=True, exist_ok=True)
    records: list[FlipRecord] = []
    with EmbeddedServer(serve_args, out / "server.log") as url:
        t0 = time.time()  # the Locust run starts now; flips are planned from here
        stop = threading.Event()
        flipper = threading.Thread(target=_flipper, args=(url, flips, t0, records, stop),
                                   daemon=True)
        flipper.start()
        outcome = run_locust(LocustRun(workload, host=url, results_dir=out / "locust",
                                       users=users, run_time_s=run_time_s,
                                       max_tokens=max_tokens, stop_timeout_s=30))
        stop.set()
        flipper.join(30)
    rows = [json.loads(line) for line in
            (out / "locust" / "requests.jsonl").read_text().splitlines() if line.strip()]
    result = {"workload": workload, "users": users, "run_time_s": run_time_s,
              "started_at": t0, "locust_returncode": outcome.returncode,
              "flips": [asdict(r) for r in records], **analyse(rows, records, t0)}
    tmp = out / "drill.json.tmp"
    tmp.write_text(json.dumps(result, indent=1))
    tmp.replace(out / "drill.json")
    return result


def chunk_times(row: dict) -> list[tuple[float, float, float]]:
    """(arrival time, gap since the previous chunk in s, tokens in the chunk) per chunk after
    the first of one request row."""
    if not row.get("ok") or row.get("ttft_ms") is None:
        return []
    per_chunk = row.get("tokens_per_chunk") or 1.0
    t = row["started_at"] + row["ttft_ms"] / 1e3
    out = []
    for gap_ms in row.get("itl_ms") or ():
        t += gap_ms / 1e3
        out.append((t, gap_ms / 1e3, per_chunk))
    return out


def timeline(rows: list[dict], t0: float, bin_s: float = BIN_S) -> list[tuple[float, float]]:
    """[(bin start, seconds after t0; TPOT in ms)] for bins with streamed chunks."""
    bins: dict[int, list[float]] = {}
    for row in rows:
        for t, gap, tokens in chunk_times(row):
            acc = bins.setdefault(int((t - t0) // bin_s), [0.0, 0.0])
            acc[0] += gap
            acc[1] += tokens
    return [(i * bin_s, 1e3 * g / n) for i, (g, n) in sorted(bins.items()) if n > 0]


def _end(row: dict) -> float:
    return row["started_at"] + (row.get("e2el_ms") or 0) / 1e3


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def analyse(rows: list[dict], flips: list[FlipRecord], t0: float,
            bin_s: float = BIN_S) -> dict:
    """The drill's figures from Locust's request rows and the applied flips."""
    series = timeline(rows, t0, bin_s)
    at = [f.requested_at - t0 for f in flips]
    effects = []
    for i, flip in enumerate(flips):
        lo = at[i - 1] if i else 0.0
        hi = at[i + 1] if i + 1 < len(at) else float("inf")
        end = min(hi, max((t for t, _ in series), default=at[i]) + bin_s)
        before = [v for t, v in series if lo + (at[i] - lo) / 2 <= t and t + bin_s <= at[i]]
        after_all = [(t, v) for t, v in series if at[i] <= t and t + bin_s <= end]
        settled = [v for t, v in after_all if t >= at[i] + (end - at[i]) / 2]
        old, new = _median(before), _median(settled)
        changed = None
        if old is not None and new is not None and old != new:
            nearer_new = [abs(v - new) < abs(v - old) for _, v in after_all]
            for j, (t, _) in enumerate(after_all):  # from here on, mostly at the new level
                if nearer_new[j] and 2 * sum(nearer_new[j:]) > len(nearer_new) - j:
                    changed = t + bin_s - at[i]
                    break
        applied = flip.requested_at + (flip.effective_after_s or 0)
        next_flip = t0 + hi
        finished_before = [r for r in rows if r["started_at"] >= t0 + lo
                           and _end(r) <= flip.requested_at]
        # requests run entirely under the new setting: started after it applied, finished
        # before the next flip
        inside = [r for r in rows if applied <= r["started_at"] and _end(r) < next_flip]
        drafted = sum(1 for r in inside if r.get("ok")
                      and ((r.get("spec") or {}).get("draft_tokens") or 0) > 0)
        effects.append(asdict(FlipEffect(flip.enabled, old, new, changed,
                                         len(finished_before), len(inside), drafted)))
    return {"requests": len(rows), "failures": sum(1 for r in rows if not r.get("ok")),
            "bin_s": bin_s, "timeline": series, "effects": effects}
