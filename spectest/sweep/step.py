"""Run one sweep step: a headless Locust process at one concurrency, watched while it runs.

The step is planned as ``1 + n`` equal Locust steps at the same user count (warm-up, then n
measured windows; no warm-up: n windows). While Locust runs, this module polls its results
folder twice a second to

* report live progress (requests so far, acceptance, TPOT p50) to a callback;
* read the server's engine-round metrics when the first measured window begins and when the
  last one ends (``engine_metrics``);
* end the step early once ``requests_per_step`` measured requests have finished (SIGTERM: Locust
  then closes its files with status ``interrupted``), or when it overruns its time limit;
* write the engine-round figures of the measured span to ``engine.json`` in the run folder.

Whether a step needs more data is decided by the sweep after both arms ran (``sweep.run``:
another *look* of each arm, in ``look2`` … inside this folder, until the step's verdicts are
settled); this module runs one look of one arm.

Ctrl-C / SIGTERM of the sweep reaches here as ``KeyboardInterrupt``: Locust is stopped and
reaped, and the interrupt is re-raised — the step does not count. Locust is started and stopped
by ``spectest.loadgen.runner.LocustProcess`` (command line, environment, log, process group), as
``run_locust`` does; this module watches it while it runs.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from spectest.files import write_atomic
from spectest.loadgen.runner import LocustProcess, LocustRun
from spectest.sweep import engine_metrics
from spectest.sweep.summary import ENGINE_JSON, summarize

POLL_S = 0.5
SCRAPE_INTERVAL_S = 1.0  # live /metrics scrapes: the running-requests gauge, once a second


@dataclass(frozen=True)
class StepPlan:
    workload: str
    arm: str  # spec | base | spec-advised
    concurrency: int
    host: str
    speculative: str  # on | off | default (what the requests carry)
    run_dir: Path
    window_s: float
    windows: int
    warmup: bool
    seed: int = 0
    max_tokens: int = 0
    max_prompt_chars: int = 0
    temperature: float = 0.0
    slo_ttft_ms: float = 0.0
    slo_tpot_ms: float = 0.0
    slo_e2el_ms: float = 0.0
    requests_per_step: int = 0
    stop_timeout_s: float = 30.0
    metrics_url: str = ""  # "" → host + /metrics
    processes: int = 1  # load-generating Locust processes (> 1: a master and that many workers)

    @property
    def warmup_steps(self) -> int:
        return 1 if self.warmup else 0

    @property
    def planned_s(self) -> float:
        return (self.warmup_steps + self.windows) * self.window_s

    def locust_run(self) -> LocustRun:
        extra = ["--temperature", str(self.temperature),
                 "--scrape-interval", str(SCRAPE_INTERVAL_S)]
        if self.max_prompt_chars:
            extra += ["--max-prompt-chars", str(self.max_prompt_chars)]
        if self.metrics_url:
            extra += ["--metrics-url", self.metrics_url]
        return LocustRun(self.workload, host=self.host, results_dir=self.run_dir,
                         steps=(self.concurrency,) * (self.warmup_steps + self.windows),
                         step_time_s=self.window_s, speculative=self.speculative,
                         seed=self.seed, max_tokens=self.max_tokens,
                         slo_ttft_ms=self.slo_ttft_ms, slo_tpot_ms=self.slo_tpot_ms,
                         slo_e2el_ms=self.slo_e2el_ms, stop_timeout_s=self.stop_timeout_s,
                         workers=self.processes if self.processes > 1 else 0,
                         extra_args=tuple(extra))


@dataclass(frozen=True)
class Live:
    """What the progress display shows while a step runs."""
    elapsed_s: float
    planned_s: float
    measuring: bool
    requests: int
    failures: int
    acceptance_rate: float | None
    tpot_p50_ms: float | None


@dataclass(frozen=True)
class StepOutcome:
    row: dict | None
    returncode: int
    timed_out: bool
    stopped_on_requests: bool
    log_tail: str


def run_step(plan: StepPlan, on_live: Callable[[Live], None] | None = None,
             rel_to: Path | None = None) -> StepOutcome:
    plan.run_dir.mkdir(parents=True, exist_ok=True)
    metrics_url = plan.metrics_url or plan.host.rstrip("/") + "/metrics"
    limit = plan.planned_s + plan.stop_timeout_s + 60
    start_reading = end_reading = None
    stopped_on_requests = timed_out = False
    t0 = time.monotonic()
    # Own session: a terminal Ctrl-C reaches only the sweep, which stops Locust cleanly (SIGTERM
    # to its master, which ends its forked workers; 20 s later, SIGKILL to the whole group).
    locust = LocustProcess(plan.locust_run(), grace_s=20.0)
    with locust:
        measure_start = None
        while locust.poll() is None:
            time.sleep(POLL_S)
            info = _json(plan.run_dir / "run.json")
            steps = (info or {}).get("steps") or []
            if measure_start is None and len(steps) > plan.warmup_steps:
                measure_start = time.monotonic()
                start_reading = engine_metrics.scrape(metrics_url)
            live = _live(plan, time.monotonic() - t0, measure_start is not None)
            if on_live is not None:
                on_live(live)
            capped = (plan.requests_per_step and live.measuring
                      and live.requests >= plan.requests_per_step)
            if end_reading is None and capped:
                end_reading = engine_metrics.scrape(metrics_url)
                stopped_on_requests = True
                locust.terminate()
            if time.monotonic() - t0 > limit and not timed_out:
                timed_out = True
                locust.terminate()
    if end_reading is None and start_reading is not None:  # Locust ended by itself
        end_reading = engine_metrics.scrape(metrics_url)
    engine = engine_metrics.round_figures(start_reading, end_reading,
                                          speculative=plan.speculative != "off")
    write_atomic(plan.run_dir / ENGINE_JSON, json.dumps(engine) + "\n")
    row = summarize(plan.run_dir, workload=plan.workload, arm=plan.arm,
                    concurrency=plan.concurrency, warmup_steps=plan.warmup_steps,
                    engine=engine, rel_to=rel_to)
    tail = locust.log_path.read_text(encoding="utf-8", errors="replace")[-2000:]
    return StepOutcome(row, locust.returncode, timed_out, stopped_on_requests, tail)


def _json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return None


def _live(plan: StepPlan, elapsed: float, measuring: bool) -> Live:
    """The latest window's figures from Locust's live ``steps.csv`` (all measured requests)."""
    requests = failures = 0
    acc = tpot = None
    try:
        df = pd.read_csv(plan.run_dir / "steps.csv")
    except (OSError, pd.errors.EmptyDataError, pd.errors.ParserError):
        df = None
    if df is not None and not df.empty:
        rows = df[df.workload == "all"]
        measured = rows[rows.step >= plan.warmup_steps]
        requests = int(measured.requests.sum())
        failures = int(measured.failures.sum())
        last = rows.iloc[-1]
        acc = _num(last.get("acceptance_rate"))
        if acc is None:
            acc = _num(last.get("client_acceptance_rate"))
        tpot = _num(last.get("tpot_p50_ms"))
    return Live(elapsed, plan.planned_s, measuring, requests, failures, acc, tpot)


def _num(v) -> float | None:
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None
