"""The sweep itself: rising concurrency, speculation on and off, per workload, into one folder.

For each workload and each concurrency step, both arms run back to back (the order alternates
from step to step, so a slow drift of the machine does not always favour the same arm):

* ``spec`` — speculation on: ``speculative: true`` per request, or the candidate host when a
  separate ``--baseline-host`` is given;
* ``base`` — speculation off: ``speculative: false``, or the baseline host.

After every step the row goes into ``steps.csv`` (atomically rewritten) and ``sweep.json`` is
updated, so an interrupted sweep keeps every finished step. A series (workload × arm) stops
early once it is ``patience`` steps past its saturation knee, and the sweep says so. With the
embedded server and ``validate_k``, the K advisor's recommendation is then run as a third arm
(``spec-advised``) on the first workload, by restarting the server with the goodput K policy.

``SweepRunner`` takes its step function and display as arguments (the real ones by default),
so its control flow can be exercised on synthetic steps. It does not plot or analyse beyond
the early-stop test; the report does that from the files.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from spectest.files import write_atomic as atomic_write
from spectest.loadgen.scrape import detect_flavour
from spectest.report import advisor
from spectest.report.breakpoints import past_saturation
from spectest.report.table import COLUMNS, STEPS_CSV, SWEEP_JSON
from spectest.sweep.config import SweepConfig
from spectest.sweep.embedded import EmbeddedServer
from spectest.sweep.progress import Display
from spectest.sweep.step import EXTEND, StepOutcome, StepPlan, run_step

PROFILE_JSON = "k_profile_validation.json"


class SweepFailed(RuntimeError):
    """The sweep cannot go on; the message is one readable line."""


@dataclass(frozen=True)
class SweepResult:
    folder: Path
    status: str  # finished | interrupted | failed
    steps: int
    message: str = ""


def workload_name(workload: str) -> str:
    return Path(workload).stem if workload.endswith(".py") else workload


def check_server(url: str) -> str:
    """The first model id of ``url``'s /v1/models; SweepFailed when it cannot be read."""
    try:
        with urllib.request.urlopen(url + "/v1/models", timeout=10) as r:
            data = json.loads(r.read())
    except (OSError, ValueError) as e:
        raise SweepFailed(f"cannot reach the server at {url} "
                          f"({getattr(e, 'reason', e)}); is it running?") from None
    ids = [m.get("id", "") for m in data.get("data", [])]
    return ids[0] if ids else ""


class SweepRunner:
    def __init__(self, cfg: SweepConfig, display: Display | None = None,
                 step_fn: Callable[..., StepOutcome] = run_step,
                 server_factory: Callable[..., EmbeddedServer] = EmbeddedServer):
        self.cfg = cfg
        self.out = Path(cfg.out)
        self.display = display or Display()
        self.step_fn = step_fn
        self.server_factory = server_factory
        self.rows: list[dict] = []
        self._running_server: EmbeddedServer | None = None
        self._draft_url = ""
        self.notes: list[str] = []
        self.stopped: dict[str, str] = {}
        self.info: dict = {}

    # --- files ----------------------------------------------------------------------------
    def _prepare(self) -> None:
        if (self.out / STEPS_CSV).exists() or (self.out / SWEEP_JSON).exists():
            raise SweepFailed(f"{self.out} already holds a sweep; choose another --out")
        self.out.mkdir(parents=True, exist_ok=True)
        self.info = {"label": self.out.name, "status": "running", "started_at": time.time(),
                     "config": self.cfg.to_json(),
                     "workloads": [workload_name(w) for w in self.cfg.workloads],
                     "slo": self.cfg.slo.to_json(), "hosts": {}, "server": {},
                     "machine": {"cpus": os.cpu_count(), "loadavg_at_start": os.getloadavg()},
                     "notes": self.notes, "stopped_series": self.stopped}
        self._write()

    def _write(self) -> None:
        self.info["ended_at"] = time.time()
        self.info["elapsed_s"] = round(self.info["ended_at"] - self.info["started_at"], 1)
        self.info["finished_steps"] = len(self.rows)
        atomic_write(self.out / SWEEP_JSON, json.dumps(self.info, indent=2, default=str) + "\n")
        if self.rows:
            frame = pd.DataFrame(self.rows)
            pos = sorted((c for c in frame.columns if c.startswith("acceptance_pos_")),
                         key=lambda c: int(c.rsplit("_", 1)[1]))
            atomic_write(self.out / STEPS_CSV,
                         frame.reindex(columns=COLUMNS + pos).to_csv(index=False))

    def note(self, text: str) -> None:
        self.notes.append(text)
        self.display.message(f"[yellow]{text}[/yellow]")

    # --- the sweep ------------------------------------------------------------------------
    def run(self) -> SweepResult:
        cfg = self.cfg
        if not cfg.embedded:  # an unreachable server: say so before creating anything
            try:
                for url in filter(None, (cfg.host, cfg.baseline_host)):
                    check_server(url)
            except SweepFailed as e:
                return SweepResult(self.out, "failed", 0, str(e))
        try:
            self._prepare()
        except SweepFailed as e:  # e.g. an existing sweep: leave its files alone
            return SweepResult(self.out, "failed", 0, str(e))
        self.display.message(
            f"spectest sweep → {self.out}: workloads {', '.join(cfg.workloads)}; concurrency "
            f"{', '.join(map(str, cfg.steps))}; arms {', '.join(cfg.arms)}; "
            f"{cfg.warmup_s:g} s warm-up + {cfg.step_time_s:g} s per step "
            f"(about {cfg.estimated_s() / 60:.0f} min; a step runs on, up to "
            f"{1 + EXTEND}x, until {cfg.min_requests_per_step} requests have succeeded)")
        status, message = "finished", ""
        try:
            if cfg.embedded:
                draft = self._draft_server()
                with draft as draft_url:
                    self._draft_url = draft_url
                    if draft_url:
                        self.info["draft_server"]["pid"] = getattr(
                            getattr(draft, "proc", None), "pid", None)
                    server = self._server(cfg.serve_args(draft_url), "server.log")
                    with server as url:
                        self._running_server = server
                        self.info["server"]["pid"] = getattr(getattr(server, "proc", None),
                                                             "pid", None)
                        self._sweep_hosts(url, url)
                    if cfg.validate_k and self.rows:
                        self._validate()
            else:
                self._sweep_hosts(cfg.host, cfg.baseline_host or cfg.host)
        except KeyboardInterrupt:
            status = "interrupted"
            message = (f"interrupted: {len(self.rows)} finished steps kept in "
                       f"{self.out / STEPS_CSV}")
            self.notes.append(message)
        except SweepFailed as e:
            status, message = "failed", str(e)
            self.notes.append(f"failed: {e}")
        finally:
            self.display.close()
            self.info["status"] = status
            self._write()
        return SweepResult(self.out, status, len(self.rows), message)

    def _draft_server(self):
        """``--disaggregated``: the draft model's own process for the whole sweep (its URL);
        otherwise nothing ("")."""
        if not self.cfg.disaggregated:
            return contextlib.nullcontext("")
        args = self.cfg.draft_server_args()
        self.display.message(f"starting the draft server (spectest serve-draft {' '.join(args)})")
        self.info["draft_server"] = {"embedded": True, "serve_args": args,
                                     "log": "draft-server.log"}
        return self.server_factory(args, self.out / "draft-server.log", subcommand="serve-draft")

    def _server(self, serve_args: list[str], log_name: str, key: str = "server"):
        self.display.message("starting the bundled server (spectest serve "
                             f"{' '.join(serve_args)})")
        server = self.server_factory(serve_args, self.out / log_name)
        self.info[key] = {"embedded": True, "serve_args": serve_args, "log": log_name}
        return server

    def _sweep_hosts(self, spec_host: str, base_host: str) -> None:
        cfg = self.cfg
        two_hosts = bool(cfg.baseline_host)
        self.info["hosts"] = {"spec": spec_host, "base": base_host}
        self.info["server"]["model"] = check_server(spec_host)
        flavour = detect_flavour(spec_host)
        self.info["server"]["flavour"] = flavour.key if flavour else None
        if two_hosts:
            self.info["server"]["baseline_model"] = check_server(base_host)
        elif "base" in cfg.arms and not (flavour and flavour.speculative_switch):
            name = flavour.display if flavour else "this server"
            raise SweepFailed(f"{name} at {spec_host} has no per-request switch that turns "
                              f"speculation off (requests would all speculate); start a second "
                              f"server without speculation and pass --baseline-host URL")
        self._write()
        arms = {"spec": (spec_host, "default" if two_hosts else "on"),
                "base": (base_host, "default" if two_hosts else "off")}
        total = len(cfg.workloads) * len(cfg.steps) * len(cfg.arms)
        index = 0
        for workload in cfg.workloads:
            for i, c in enumerate(cfg.steps):
                order = list(cfg.arms) if i % 2 == 0 else list(reversed(cfg.arms))
                for arm in order:
                    index += 1
                    key = f"{workload_name(workload)}/{arm}"
                    if key in self.stopped:
                        continue
                    host, speculative = arms[arm]
                    self._one_step(workload, arm, c, host, speculative, index, total)
                    if c < cfg.steps[-1]:  # stopping after the last step saves nothing
                        self._maybe_stop(workload_name(workload), arm)
                if all(f"{workload_name(workload)}/{a}" in self.stopped for a in cfg.arms):
                    break

    def _one_step(self, workload: str, arm: str, c: int, host: str, speculative: str,
                  index: int, total: int) -> dict | None:
        cfg = self.cfg
        name = workload_name(workload)
        proc = getattr(self._running_server, "proc", None)
        if proc is not None and proc.poll() is not None:
            raise SweepFailed(f"the bundled server exited (code {proc.returncode}) before "
                              f"{name} {arm} c={c}; see {self._running_server.log_path}")
        run_dir = self.out / "runs" / name / arm / f"c{c}"
        plan = StepPlan(workload, arm, c, host, speculative, run_dir, cfg.window_s, cfg.windows,
                        cfg.warmup_s > 0, seed=cfg.seed, max_tokens=cfg.max_tokens,
                        max_prompt_chars=cfg.max_prompt_chars, temperature=cfg.temperature,
                        slo_ttft_ms=cfg.slo.ttft_p99_ms or 0, slo_tpot_ms=cfg.slo.tpot_p99_ms or 0,
                        slo_e2el_ms=cfg.slo.e2el_p99_ms or 0,
                        requests_per_step=cfg.requests_per_step,
                        min_requests=cfg.min_requests_per_step, processes=cfg.processes)
        self.display.start_step(name, arm, c, index, total, plan.planned_s)
        outcome = self.step_fn(plan, on_live=self.display.live, rel_to=self.out)
        row = outcome.row
        note = ""
        if outcome.timed_out:
            note = "overran its time limit and was stopped"
        elif outcome.stopped_on_requests:
            note = f"ended after {cfg.requests_per_step} requests"
        elif outcome.extended_s > 0:
            note = (f"ran {outcome.extended_s:.0f} s longer to reach "
                    f"{cfg.min_requests_per_step} successful requests")
        if row is not None:
            row = {**row, "workload": name, "loadavg": round(os.getloadavg()[0], 2)}
            if arm == "spec-advised" and row.get("drafts"):
                row["k"] = row["draft_tokens"] / row["drafts"]  # mean K the policy chose
            self.rows.append(row)
            self._write()
        self.display.end_step(row, note)
        if row is None:
            reason = _last_error(outcome.log_tail)
            raise SweepFailed(f"{name} {arm} c={c}: Locust measured nothing "
                              f"(exit code {outcome.returncode}){': ' + reason if reason else ''}"
                              f"; log: {run_dir / 'locust.log'}")
        return row

    def _maybe_stop(self, workload: str, arm: str) -> None:
        if not self.cfg.patience:
            return
        series = pd.DataFrame([r for r in self.rows
                               if r["workload"] == workload and r["arm"] == arm])
        why = past_saturation(series, self.cfg.patience)
        if why:
            self.stopped[f"{workload}/{arm}"] = why
            self.note(f"{workload} {arm}: stopping this series early — {why}")

    # --- K advisor validation -------------------------------------------------------------
    def _validate(self) -> None:
        cfg = self.cfg
        first = workload_name(cfg.workloads[0])
        table = pd.DataFrame(self.rows)
        profile = advisor.profile_json(table[table.workload == first])
        if profile is None:
            self.note("K advisor: no validation run (the sweep has no acceptance or cost "
                      "figures to advise from)")
            return
        path = self.out / PROFILE_JSON
        atomic_write(path, advisor.profile_text(profile))
        done = table[(table.workload == first) & (table.arm == "spec")].concurrency.tolist()
        self.display.message(f"K advisor: running its recommendation on {first} "
                             f"(goodput K policy from {path.name})")
        args = cfg.serve_args(self._draft_url) + [
            "--k-policy", "goodput", "--profile", str(path.resolve()), "--k-max",
            str(advisor.K_MAX)]
        server = self._server(args, "server-advised.log", key="advised_server")
        with server as url:
            self._running_server = server
            self.info["advised_server"]["pid"] = getattr(getattr(server, "proc", None), "pid",
                                                         None)
            for i, c in enumerate(done):
                self._one_step(cfg.workloads[0], "spec-advised", int(c), url, "on", i + 1,
                               len(done))


def _last_error(log_tail: str) -> str:
    for line in reversed(log_tail.splitlines()):
        if "spectest:" in line and ("ERROR" in line or "cannot" in line):
            return line.split("spectest:", 1)[1].strip()[:200]
    return ""


@contextlib.contextmanager
def sigterm_as_interrupt():
    """Within the block, SIGTERM raises KeyboardInterrupt (the same clean stop as Ctrl-C)."""
    import signal

    def handler(signum, frame):
        raise KeyboardInterrupt
    old = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)
