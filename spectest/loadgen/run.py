"""The state of one spectest load run inside one Locust process (``environment.spectest``).

A ``LoadRun`` plays one of three roles, from Locust's runner:

* ``local`` (plain ``locust``) and ``master`` own the run: they check the server is there,
  resolve the model, scrape ``/metrics`` at step boundaries and every ``--scrape-interval``,
  hold the ``ResultsSink`` and stop the run if the server stays unreachable;
* ``worker`` sends requests and ships its request rows to the master with each stats report
  (``report_to_master``), and all remaining rows when the master asks it to drain at the end.

Users call ``next_record`` / ``submit``; the shape calls ``plan`` / ``on_step``; the event
wiring in ``plugin.py`` calls the rest. It knows the protocol between Locust processes, not
the HTTP details of a completion.
"""

from __future__ import annotations

import json
import logging
import time
import urllib.error
import urllib.request
from collections.abc import Iterator

import gevent
from locust.runners import MasterRunner, WorkerRunner

from spectest.loadgen import results
from spectest.loadgen.client import TraceIds
from spectest.loadgen.cpu import CpuMeter
from spectest.loadgen.datasets import Dataset, DatasetError, Record, load_dataset
from spectest.loadgen.live import LiveSeries
from spectest.loadgen.options import OptionsError, SpecOptions
from spectest.loadgen.scrape import Scraper, Snapshot
from spectest.loadgen.shapes import PlannedStep, PoissonPacer, plan_steps

log = logging.getLogger("spectest")
MSG_STEP, MSG_DRAIN, MSG_ROWS = "spectest_step", "spectest_drain", "spectest_rows"


class RunAborted(RuntimeError):
    """The run cannot start; the message is one readable line for the user."""


class LoadRun:
    def __init__(self, environment, default_workload: str = "chat"):
        self.env = environment
        runner = environment.runner
        self.role = ("master" if isinstance(runner, MasterRunner)
                     else "worker" if isinstance(runner, WorkerRunner) else "local")
        self.default_workload = default_workload
        self.opts = SpecOptions()
        self.model = ""
        self.active = False
        self.aborted = False
        self.stop_requested = False
        self.trace = TraceIds()
        self.pacer = PoissonPacer(0)
        self.sink: results.ResultsSink | None = None
        self.scraper: Scraper | None = None
        self.outbox: list[dict] = []
        self.drained: set[str] = set()
        self._plan: tuple[PlannedStep, ...] = ()
        self._datasets: dict[str, Iterator[Record]] = {}
        self._ticker: gevent.Greenlet | None = None
        self.last_ok = self.last_fail = self.started = 0.0
        self.cpu = CpuMeter()  # this process's CPU share, stamped on every request row
        self.live_charts = False  # the web UI is on: keep ``live`` (its charts' series)
        self.live: LiveSeries | None = None
        self._finishing = False  # ``finish`` is writing the last files
        self._interrupt_pending = False  # a stop asked for meanwhile (``defer_interrupt``)

    @property
    def owner(self) -> bool:
        return self.role != "worker"

    # --- start ---------------------------------------------------------------------------
    def begin(self) -> None:
        """Set up a new run (idempotent until ``finish``). Raises RunAborted."""
        if self.active:
            return
        self.active, self.aborted, self.stop_requested = True, False, False
        try:
            self.opts = SpecOptions.from_parsed(self.env.parsed_options)
        except OptionsError as e:
            raise RunAborted(str(e)) from None
        worker = max(0, getattr(self.env.runner, "worker_index", 0) or 0)
        self.pacer = PoissonPacer(self.opts.seed * 1000 + worker)
        self._datasets, self.outbox, self.drained = {}, [], set()
        self.started = self.last_ok = time.time()
        self.last_fail = 0.0
        self.dataset(self.default_workload)  # fail early on a bad --dataset
        self.model = self.opts.model
        if not self.owner:
            return
        host = (self.env.host or "").rstrip("/")
        if not host:
            raise RunAborted("no server given: pass --host http://HOST:PORT")
        self.model = self._preflight(host)
        self.env.parsed_options.spectest_model = self.model  # workers get it with the spawn
        url = self.opts.metrics_url or f"{host}/metrics"
        self.scraper = None if url == "off" else Scraper(url)
        num_users = getattr(self.env.parsed_options, "num_users", None)
        run_time = getattr(self.env.parsed_options, "run_time", None)
        self._plan = plan_steps(self.opts, num_users, run_time)
        self.sink = results.ResultsSink(self.opts.results_dir,
                                        speculative=self.opts.speculative_label, run_info={
            "host": host, "model": self.model, "locustfile": self.env.locustfile,
            "role": self.role, "dataset": self.opts.dataset or self.default_workload,
            "options": {k: v for k, v in vars(self.opts).items() if k != "api_key"}})
        if self.live_charts:
            self.live = LiveSeries(self.opts.step_time if self.opts.steps
                                   or self.opts.request_rates else None)
        self._ticker = gevent.spawn(self._tick_forever)
        log.info("spectest: %s, model %s, results in %s", host, self.model, self.opts.results_dir)

    def _preflight(self, host: str) -> str:
        req = urllib.request.Request(f"{host}/v1/models", headers=self._auth())
        try:
            with urllib.request.urlopen(req, timeout=10) as resp:
                ids = [m.get("id", "") for m in json.loads(resp.read()).get("data", [])]
        except urllib.error.HTTPError as e:
            if self.opts.model:
                log.warning("spectest: GET %s/v1/models answered %s; using --spectest-model %s",
                            host, e.code, self.opts.model)
                return self.opts.model
            raise RunAborted(f"GET {host}/v1/models answered HTTP {e.code}; "
                             "pass --spectest-model") from None
        except (OSError, ValueError) as e:
            reason = getattr(e, "reason", e)
            raise RunAborted(f"cannot reach the server at {host} ({reason}); is it running? "
                             "(check --host)") from None
        if self.opts.model:
            if ids and self.opts.model not in ids:
                log.warning("spectest: model %r is not in /v1/models %s", self.opts.model, ids)
            return self.opts.model
        if not ids:
            raise RunAborted(f"{host}/v1/models lists no model; pass --spectest-model")
        return ids[0]

    def _auth(self) -> dict:
        return {"Authorization": f"Bearer {self.opts.api_key}"} if self.opts.api_key else {}

    def abort(self, message: str, stop_runner: bool = False) -> None:
        """Log one readable line and mark the run failed (exit code 2).

        The shape stops the run itself when it sees ``aborted``; other callers pass
        ``stop_runner`` to have the runner stopped from a fresh greenlet.
        """
        log.error("spectest: %s", message)
        self.env.process_exit_code = 2
        if self.sink is not None:
            self.finish(status="aborted")
        self.active, self.aborted = False, True
        if stop_runner:
            self.stop_runner()

    # --- used by users and the shape -----------------------------------------------------
    def dataset(self, name: str) -> Iterator[Record]:
        key = self.opts.dataset or name
        if key not in self._datasets:
            try:
                ds: Dataset = (load_dataset(key)
                               .with_max_prompt_chars(self.opts.max_prompt_chars)
                               .with_system_prompt(self.opts.system_prompt))
            except DatasetError as e:
                raise RunAborted(str(e)) from None
            worker = max(0, getattr(self.env.runner, "worker_index", 0) or 0)
            self._datasets[key] = ds.stream(self.opts.seed, worker)
        return self._datasets[key]

    def plan(self) -> tuple[PlannedStep, ...]:
        return self._plan

    def ensure_started(self) -> bool:
        """Begin the run if needed (the shape's first tick comes before ``test_start``)."""
        try:
            self.begin()
        except RunAborted as e:
            self.abort(str(e))
        return not self.aborted

    def on_step(self, step: PlannedStep) -> None:
        if self.sink is None:
            return
        snap = self.scrape()
        if self.sink.steps:
            for row in self.sink.rows(self.sink.steps[-1:]):
                log.info("spectest: %s", results.summary_line(row))
        now = time.time()
        self.sink.begin_step(step.users, step.rate, snap, at=now)
        if self.live is not None:
            self.live.begin_step(step.index, step.users)
        if self.role == "master":
            per_worker = step.rate / max(1, self.env.runner.worker_count) if step.rate else None
            self.env.runner.send_message(MSG_STEP, {"rate": per_worker, "origin": now})
        else:
            self.pacer.start(step.rate, now)

    def on_step_message(self, data: dict) -> None:  # worker side of MSG_STEP
        self.pacer.start(data.get("rate"), data.get("origin"))

    def submit(self, row: dict) -> None:
        if self.owner:
            self.ingest([row])
        else:
            self.outbox.append(row)

    def take_outbox(self) -> list[dict]:
        rows, self.outbox = self.outbox, []
        return rows

    def ingest(self, rows: list[dict]) -> None:
        if self.sink is None or not rows:
            return
        for row in rows:
            if row["ok"]:
                self.last_ok = max(self.last_ok, row["started_at"])
            else:
                self.last_fail = max(self.last_fail, row["started_at"])
        if not self.sink.closed:
            self.sink.add(rows)
        if self.live is not None:
            self.live.add(rows)

    def scrape(self) -> Snapshot | None:
        if self.scraper is None:
            return None
        snap = self.scraper.scrape()
        if snap is None:
            log.debug("spectest: /metrics scrape failed: %s", self.scraper.last_error)
        return snap

    # --- background and end --------------------------------------------------------------
    def _tick_forever(self) -> None:
        last_scrape = time.time()
        while self.sink is not None and not self.sink.closed:
            gevent.sleep(1.0)
            if self.sink is None or self.sink.closed:
                return
            if time.time() - last_scrape >= self.opts.scrape_interval:
                last_scrape = time.time()
                self.sink.record_snapshot(self.scrape(), "live")
            self.sink.flush()
            if self.live is not None:
                self.live.tick()
            self._watchdog()

    def _watchdog(self) -> None:
        grace = self.opts.server_down_grace
        if not grace or self.last_fail <= self.last_ok or self.stop_requested:
            return
        if time.time() - self.last_ok > grace:
            log.error("spectest: no request has succeeded for %.0f s and requests are failing "
                      "(most often: %s); stopping the run. Results so far are in %s", grace,
                      self.sink.common_error() if self.sink else "?", self.opts.results_dir)
            self.stop_runner()

    def stop_runner(self) -> None:
        """End the test the way Locust ends a shape: the shape's next tick returns None.

        (Calling ``runner.quit()`` from here would race Locust's own quit and stop users
        twice.) Without the spectest shape, stop the runner from a fresh greenlet.
        """
        self.stop_requested = True
        if self.env.shape_class is None:
            headless = bool(getattr(self.env.parsed_options, "headless", False))
            gevent.spawn(self.env.runner.quit if headless else self.env.runner.stop)

    def drain_workers(self) -> None:
        """Master, at test stop: have every worker stop its users and send its last rows."""
        runner = self.env.runner
        expected = {c.id for c in runner.clients.all}
        if not expected:
            return
        runner.send_message(MSG_DRAIN, {})
        deadline = time.time() + (self.env.stop_timeout or 0) + 10
        while not expected <= self.drained and time.time() < deadline:
            gevent.sleep(0.1)
        if not expected <= self.drained:
            log.warning("spectest: %d worker(s) did not send their last rows",
                        len(expected - self.drained))

    def defer_interrupt(self) -> bool:
        """A stop (SIGTERM) arrived: True when ``finish`` is writing the last files, which then
        raises it itself once they are written. A stop asked for just as a step ends (the final
        /metrics scrape of a busy server takes seconds) must not cost that step's files."""
        if self._finishing:
            self._interrupt_pending = True
        return self._finishing

    def finish(self, status: str = "finished") -> None:
        if not self.active:
            return
        self.active = False
        self._finishing = True
        try:
            if self._ticker is not None and self._ticker is not gevent.getcurrent():
                self._ticker.kill(block=False)
            if self.sink is not None and not self.sink.closed:
                self.sink.finish(self.scrape(), status=status)
                for row in self.sink.rows():
                    log.info("spectest: %s", results.summary_line(row))
                log.info("spectest: results in %s", self.opts.results_dir)
        finally:
            self._finishing = False
        if self._interrupt_pending:  # the stop asked for while the files were written
            self._interrupt_pending = False
            interrupt()


def interrupt() -> None:
    """Ctrl-C, raised in a greenlet of its own: gevent's hub re-raises it in the main greenlet,
    where Locust ends the run gracefully. Raised in the frame a signal happens to interrupt, it
    would kill one of Locust's greenlets (exit code 2) or a write half-way."""
    gevent.spawn(_raise_interrupt)


def _raise_interrupt() -> None:
    raise KeyboardInterrupt
