"""The sweep itself: rising concurrency, speculation on and off, per workload, into one folder.

For each workload and each concurrency step, the arms run back to back (the order alternates
from look to look, so a slow drift of the machine does not always favour the same arm):

* ``spec`` — speculation on: ``speculative: true`` per request, or the candidate host when a
  separate ``--baseline-host`` is given;
* ``base`` — speculation off: ``speculative: false``, or the baseline host;
* ``spec-advised`` — with ``--advised-host``: a server the user started with the advised
  configuration, run beside the two at every look.

**Decisive steps.** A step is measured in looks: each look runs every arm once
(``--step-time`` after the warm-up), then the step's TPOT and throughput ratios, over all its
looks so far, are judged at that look's critical value (``report.sequential``). The step stops
once both are settled (ahead, behind or even) or after the looks ``--max-step-time`` allows;
its rows say how many looks it took, the critical value of their intervals and whether it
settled or reached the cap. Looks after the first go to ``look2``, ``look3`` … inside the
first look's folder, and the row pools them (``summary.summarize``).

After every step the rows go into ``steps.csv`` (atomically rewritten) and ``sweep.json`` is
updated, so an interrupted sweep keeps every finished step. A series (workload × arm) stops
early once it is ``patience`` steps past its saturation knee, and the sweep says so. With the
embedded server and ``verify_advice``, the advised schedule (``report.schedule``, in spectest's
own flags) is then run as a third arm (``spec-advised``) on the verified workloads, by
restarting the server with it, for as many looks as each step took.

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

from spectest import procs
from spectest.files import write_atomic as atomic_write
from spectest.loadgen.scrape import detect_flavour
from spectest.report import schedule as sch
from spectest.report import sequential
from spectest.report.breakpoints import past_saturation
from spectest.report.table import COLUMNS, STEPS_CSV, SWEEP_JSON
from spectest.sweep.config import SweepConfig
from spectest.sweep.embedded import EmbeddedServer
from spectest.sweep.progress import Display
from spectest.sweep.step import StepOutcome, StepPlan, run_step
from spectest.sweep.summary import read_requests, summarize

ADVISED = "spec-advised"
VERIFY_ON, VERIFY_OFF = "verify-on", "verify-off"  # the references measured beside it


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
                 server_factory: Callable[..., EmbeddedServer] = EmbeddedServer,
                 pool_fn: Callable[..., dict | None] | None = None,
                 terminated: procs.Terminated | None = None):
        self.cfg = cfg
        # SIGTERM's flag (the CLI's): checked before each look and at each of its polls
        self.terminated = terminated or procs.Terminated()
        self.out = Path(cfg.out)
        self.display = display or Display()
        self.step_fn = step_fn
        self.server_factory = server_factory
        self.pool_fn = pool_fn or self._pool
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
        looks = (f"; a step runs up to {cfg.looks} looks of {cfg.step_time_s:g} s until its "
                 f"verdicts are settled" if cfg.looks > 1 else "")
        self.display.message(
            f"spectest sweep → {self.out}: workloads {', '.join(cfg.workloads)}; concurrency "
            f"{', '.join(map(str, cfg.steps))}; arms {', '.join(cfg.all_arms)}; "
            f"{cfg.warmup_s:g} s warm-up + {cfg.step_time_s:g} s per look "
            f"(about {cfg.estimated_s() / 60:.0f} min if every step settles at its first "
            f"look{looks})")
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
                        if cfg.verify_advice and self.rows:
                            self._verify_advice(url)
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
        arms = {"spec": (spec_host, "default" if two_hosts else "on"),
                "base": (base_host, "default" if two_hosts else "off")}
        if cfg.advised_host:
            self.info["hosts"][ADVISED] = cfg.advised_host
            self.info["advised_server"] = {"host": cfg.advised_host,
                                           "model": check_server(cfg.advised_host)}
            arms[ADVISED] = (cfg.advised_host, "default")
        self._write()
        total = len(cfg.workloads) * len(cfg.steps)
        index = 0
        for workload in cfg.workloads:
            name = workload_name(workload)
            for i, c in enumerate(cfg.steps):
                index += 1
                run = [a for a in cfg.all_arms if f"{name}/{a}" not in self.stopped]
                if not run:
                    break
                self._step(workload, c, {a: arms[a] for a in run}, index, total,
                           reverse=i % 2 == 1)
                if c < cfg.steps[-1]:  # stopping after the last step saves nothing
                    for arm in run:
                        self._maybe_stop(name, arm)

    def _step(self, workload: str, c: int, arms: dict[str, tuple[str, str]], index: int,
              total: int, reverse: bool = False, looks: int | None = None,
              z: float | None = None) -> dict:
        """One step: look after look of every arm in ``arms`` (name → (host, speculative))
        until the spec/base pair is settled or the looks run out (``looks``, ``z``: exactly
        that many looks at that critical value, as the verification arm matches the step it
        verifies). The rows go into the table."""
        cfg = self.cfg
        name = workload_name(workload)
        limit = looks or cfg.looks
        outcomes: dict[str, list] = {a: [] for a in arms}
        rows: dict[str, dict | None] = {}
        decision = None
        for k in range(1, limit + 1):
            order = list(arms)
            if reverse != (k % 2 == 0):
                order.reverse()
            for arm in order:
                host, speculative = arms[arm]
                outcomes[arm].append(self._look(workload, arm, c, host, speculative, k, limit,
                                                index, total))
            rows = {arm: self.pool_fn(self._run_dir(name, arm, c), outcomes[arm], workload=name,
                                      arm=arm, concurrency=c) for arm in arms}
            if any(r is None or _all_failed(r) for r in rows.values()):
                break  # nothing to measure, or nothing another look would settle
            if looks is not None:
                continue
            decision = self._judge(rows, k, limit, c)
            if decision is not None:
                self.display.message(f"    {name} c={c}: {decision.text()}")
                if decision.final:
                    break
            elif self._enough(rows):
                break
        k_done = min(len(v) for v in outcomes.values())
        z = sequential.z_at(k_done, limit) if z is None else z
        status = (decision.status if decision is not None and decision.final else
                  sequential.CAP if k_done >= limit and limit > 1 and looks is None else "")
        for arm, row in rows.items():
            if row is None:
                last = outcomes[arm][-1]
                reason = _last_error(last.log_tail)
                raise SweepFailed(f"{name} {arm} c={c}: Locust measured nothing "
                                  f"(exit code {last.returncode})"
                                  f"{': ' + reason if reason else ''}; log: "
                                  f"{self._run_dir(name, arm, c) / 'locust.log'}")
            row = {**row, "workload": name, "looks": k_done, "interval_z": round(z, 4),
                   "decided": status, "loadavg": round(os.getloadavg()[0], 2)}
            if arm == ADVISED and row.get("drafts") and row.get("draft_tokens") is not None:
                row["k"] = row["draft_tokens"] / row["drafts"]  # the mean K it ran
            self.rows.append(row)
        self._write()
        for arm, row in rows.items():
            if _all_failed(row):  # kept in the table above; no arm can be compared to it
                path = self._run_dir(name, arm, c) / "requests.jsonl"
                raise SweepFailed(f"{name} {arm} c={c}: every request failed ({row['failures']} "
                                  f"of {row['requests']}): {_common_error(path)}; requests: "
                                  f"{path}")
        return rows

    def _judge(self, rows: dict, k: int, looks: int, c: int):
        """The step after look k (None when it has no spec/base pair to judge)."""
        if not {"spec", "base"} <= set(rows):
            return None
        return sequential.judge(rows["spec"], rows["base"], k, looks, float(c),
                                self.cfg.min_requests_per_step)

    def _enough(self, rows: dict) -> bool:
        """One arm only: its look is enough once it has the requests a verdict needs."""
        from spectest.report.evidence import successful
        return all((successful(r) or 0) >= self.cfg.min_requests_per_step
                   for r in rows.values())

    def _run_dir(self, name: str, arm: str, c: int) -> Path:
        return self.out / "runs" / name / arm / f"c{c}"

    def _pool(self, run_dir: Path, outcomes: list, **kw) -> dict | None:
        """The row of an arm at a step over its looks so far (the first look's own row)."""
        if len(outcomes) == 1:
            return outcomes[0].row
        return summarize(run_dir, warmup_steps=1 if self.cfg.warmup_s > 0 else 0,
                         rel_to=self.out, **kw)

    def _look(self, workload: str, arm: str, c: int, host: str, speculative: str, k: int,
              looks: int, index: int, total: int) -> StepOutcome:
        cfg = self.cfg
        name = workload_name(workload)
        proc = getattr(self._running_server, "proc", None)
        if proc is not None and proc.poll() is not None:
            raise SweepFailed(f"the bundled server exited (code {proc.returncode}) before "
                              f"{name} {arm} c={c}; see {self._running_server.log_path}")
        run_dir = self._run_dir(name, arm, c)
        if k > 1:
            run_dir = run_dir / f"look{k}"
        plan = StepPlan(workload, arm, c, host, speculative, run_dir, cfg.window_s, cfg.windows,
                        cfg.warmup_s > 0, seed=cfg.seed + 1000 * (k - 1),
                        max_tokens=cfg.max_tokens,
                        max_prompt_chars=cfg.max_prompt_chars, temperature=cfg.temperature,
                        slo_ttft_ms=cfg.slo.ttft_p99_ms or 0, slo_tpot_ms=cfg.slo.tpot_p99_ms or 0,
                        slo_e2el_ms=cfg.slo.e2el_p99_ms or 0,
                        requests_per_step=cfg.requests_per_step, processes=cfg.processes)
        label = arm + (f" · look {k}/{looks}" if looks > 1 else "")
        self.display.start_step(name, label, c, index, total, plan.planned_s)
        def live(update) -> None:
            self.terminated.check()
            self.display.live(update)
        self.terminated.check()
        outcome = self.step_fn(plan, on_live=live, rel_to=self.out)
        note = ""
        if outcome.timed_out:
            note = "overran its time limit and was stopped"
        elif outcome.stopped_on_requests:
            note = f"ended after {cfg.requests_per_step} requests"
        self.display.end_step(outcome.row, note)
        return outcome

    def _maybe_stop(self, workload: str, arm: str) -> None:
        if not self.cfg.patience:
            return
        series = pd.DataFrame([r for r in self.rows
                               if r["workload"] == workload and r["arm"] == arm])
        why = past_saturation(series, self.cfg.patience)
        if why:
            self.stopped[f"{workload}/{arm}"] = why
            self.note(f"{workload} {arm}: stopping this series early — {why}")

    # --- the advice, run --------------------------------------------------------------
    def _verify_advice(self, url: str) -> None:
        """Start a second bundled server with the advised schedule and run it beside fresh
        always-on and off arms of the first (``verify-on``, ``verify-off``: measured in the same
        minutes, so that the machine's drift since the sweep does not decide the comparison) at
        every step of the verified workloads, for as many looks as each step took. An advice
        that is one of the two arms' own configuration (on at every batch size, or off) needs
        no run: that arm's measurement is its verification."""
        cfg = self.cfg
        table = pd.DataFrame(self.rows)
        names = [workload_name(w) for w in cfg.workloads]
        targets = [w for w in cfg.workloads if workload_name(w) in cfg.verify_workloads] \
            or cfg.workloads[:1]
        try:
            mix = sch.parse_mix(cfg.mix, names)
        except sch.MixError:
            mix = {}
        schedules = {s.name: s for s in sch.build_all(table, names, cfg.objective,
                                                      cfg.min_requests_per_step, mix)}
        chosen = schedules.get(sch.MIX) if cfg.mix else schedules.get(workload_name(targets[0]))
        flags = sch.spectest_serve_args(chosen) if chosen is not None else None
        if not flags:
            self.note("advice not verified: "
                      + (chosen.why if chosen is not None else "no schedule to run"))
            return
        self.info["advice_verified"] = {"schedule": chosen.name, "status": chosen.status,
                                        "ranges": [list(r) for r in chosen.ranges],
                                        "why": chosen.why, "serve_args": flags,
                                        "schedule_json": chosen.to_json()}
        if chosen.status in (sch.ALWAYS, sch.OFF):
            arm = "spec" if chosen.status == sch.ALWAYS else "base"
            self.info["advice_verified"]["same_as"] = arm
            self.note(f"advice ({chosen.name}): {chosen.why} — that is the {arm} arm's own "
                      f"configuration, so its measurement above is the verification; no "
                      f"third arm run")
            return
        self.display.message(f"verifying the advice ({chosen.name}: {chosen.why}) on "
                             f"{', '.join(workload_name(w) for w in targets)}, beside fresh "
                             f"always-on and off arms")
        args = _replace_k(cfg.serve_args(self._draft_url), flags)
        server = self._server(args, "server-advised.log", key="advised_server")
        main = self._running_server
        with server as advised_url:
            self._running_server = server
            self.info["advised_server"]["pid"] = getattr(getattr(server, "proc", None), "pid",
                                                         None)
            done = pd.DataFrame(self.rows)
            steps = [(w, r) for w in targets
                     for r in done[(done.workload == workload_name(w)) & (done.arm == "spec")]
                     .sort_values("concurrency").itertuples()]
            arms = {VERIFY_ON: (url, "on"), VERIFY_OFF: (url, "off"),
                    ADVISED: (advised_url, "on")}
            for index, (w, r) in enumerate(steps, 1):
                self._step(w, int(r.concurrency), arms, index, len(steps),
                           reverse=index % 2 == 0,
                           looks=int(r.looks) if r.looks == r.looks else 1,
                           z=float(r.interval_z) if r.interval_z == r.interval_z else None)
        self._running_server = main


def _replace_k(args: list[str], flags: list[str]) -> list[str]:
    """``serve_args`` with its ``--k`` replaced by the advised flags."""
    out, skip = [], False
    for a in args:
        if skip:
            skip = False
            continue
        if a == "--k":
            skip = True
            continue
        out.append(a)
    return out + flags


def _last_error(log_tail: str) -> str:
    for line in reversed(log_tail.splitlines()):
        if "spectest:" in line and ("ERROR" in line or "cannot" in line):
            return line.split("spectest:", 1)[1].strip()[:200]
    return ""


def _all_failed(row: dict | None) -> bool:
    """A step's arm where requests were sent and not one succeeded."""
    return bool(row and row.get("requests") and row.get("failures") == row["requests"])


def _common_error(requests_jsonl: Path) -> str:
    """The error most of a step's requests ended with, as its requests file records it."""
    frame = read_requests(requests_jsonl)
    if frame.empty or "error" not in frame:
        return "no error recorded"
    errors = frame.error.dropna().astype(str).str.slice(0, 200)
    return errors.mode().iloc[0] if not errors.empty else "no error recorded"
