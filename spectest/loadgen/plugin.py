"""Wires spectest into Locust's event hooks; a locustfile calls ``install(events, workload)``.

Listeners it adds:

* ``init_command_line_parser`` — the spectest flags (``options.add_arguments``);
* ``init`` — creates the ``LoadRun`` as ``environment.spectest``, registers the master/worker
  messages, makes SIGTERM stop the run cleanly (Locust 2.47 installs its own SIGTERM handler only
  after a headless shape test ends, so during one SIGTERM killed the process before it wrote its
  files; now it is handled as Ctrl-C, which Locust ends gracefully — after the run's last files
  are written when it arrives while they are: ``LoadRun.defer_interrupt``), checks the flags
  (headless: one readable line and exit code 2 on bad input), and
  adds a "Speculative decoding" tab to the web UI with live per-workload latency and
  acceptance plus a download of ``steps.csv``, and above that table a chart per workload over
  time (``live.py`` keeps the series, ``live_ui.js`` draws them: Locust's extension points
  take tables only, so the page gets the script through its index HTML);
* ``test_start`` / ``test_stop`` / ``quitting`` — begin the run, drain workers, write the final
  rows (status ``finished``, or ``interrupted`` when Locust quits first, e.g. Ctrl-C);
* ``report_to_master`` / ``worker_report`` — ship request rows from workers to the master.

It holds no state of its own: everything lives on the environment's ``LoadRun``.
"""

from __future__ import annotations

import logging
import signal
import sys
from pathlib import Path

from locust.env import Environment

from spectest import smoke
from spectest.loadgen import options as options_mod
from spectest.loadgen.datasets import DatasetError, load_dataset
from spectest.loadgen.run import MSG_DRAIN, MSG_ROWS, MSG_STEP, LoadRun, RunAborted, interrupt

log = logging.getLogger("spectest")
TAB_KEY = "spectest"
LIVE_SCRIPT = "/spectest/live.js"
LIVE_COLUMNS = (("workload", "Workload"), ("users", "Users"), ("requests", "Requests"),
                ("failures", "Failures"), ("ttft_p50_ms", "TTFT p50 (ms)"),
                ("ttft_p99_ms", "TTFT p99 (ms)"), ("tpot_p50_ms", "TPOT p50 (ms)"),
                ("itl_p50_ms", "Chunk ITL p50 (ms)"), ("output_tokens_per_s", "Output tok/s"),
                ("goodput_rps", "Goodput (req/s)"), ("tokens_per_chunk", "Tokens/chunk"),
                ("acceptance_rate", "Acceptance rate"),
                ("mean_accepted_length", "Mean accepted length"),
                ("client_acceptance_rate", "Acceptance (responses)"))


def install(events, workload: str = "chat") -> None:
    """Register every listener on Locust's ``events``; ``workload`` is the default dataset."""

    @events.init_command_line_parser.add_listener
    def _flags(parser, **_kw):
        options_mod.add_arguments(parser)

    @events.init.add_listener
    def _init(environment: Environment, **_kw):
        signal.signal(signal.SIGTERM, lambda signum, frame: _sigterm_as_interrupt(environment))
        run = LoadRun(environment, default_workload=workload)
        environment.spectest = run
        parsed = environment.parsed_options
        if run.role != "worker" and parsed is not None:
            _check_flags(parsed, workload, headless=bool(getattr(parsed, "headless", False)))
        runner = environment.runner
        if run.role == "worker":
            runner.register_message(MSG_STEP, lambda environment, msg, **k:
                                    environment.spectest.on_step_message(msg.data))
            runner.register_message(MSG_DRAIN, _worker_drain, concurrent=True)
            environment.events.report_to_master.add_listener(
                lambda client_id, data, **k: data.__setitem__("spectest_rows", run.take_outbox()))
        elif run.role == "master":
            runner.register_message(MSG_ROWS, _master_rows)
            environment.events.worker_report.add_listener(
                lambda client_id, data, **k: run.ingest(data.get("spectest_rows") or []))
        if environment.web_ui is not None:
            _extend_web_ui(environment)

    @events.test_start.add_listener
    def _test_start(environment: Environment, **_kw):
        run: LoadRun = environment.spectest
        if run.active:  # the shape's first step already began the run
            return
        try:
            run.begin()
        except RunAborted as e:
            run.abort(str(e), stop_runner=run.owner)

    @events.test_stop.add_listener
    def _test_stop(environment: Environment, **_kw):
        run: LoadRun = environment.spectest
        if run.role == "master" and run.active:
            run.drain_workers()
        run.finish("finished")

    @events.quitting.add_listener
    def _quitting(environment: Environment, **_kw):
        run: LoadRun = getattr(environment, "spectest", None)
        if run is not None and run.owner and run.active:
            run.finish("interrupted")


def _sigterm_as_interrupt(environment: Environment) -> None:
    run: LoadRun | None = getattr(environment, "spectest", None)
    if run is not None and run.defer_interrupt():
        return  # the run is writing its last files and interrupts when they are written
    interrupt()


def _check_flags(parsed, workload: str, headless: bool) -> None:
    try:
        opts = options_mod.SpecOptions.from_parsed(parsed)
        if smoke.active() and (opts.steps or opts.request_rates):
            smoke.note("locust", f"{opts.step_time:g} s per step")
        load_dataset(opts.dataset or workload).with_max_prompt_chars(opts.max_prompt_chars)
    except (options_mod.OptionsError, DatasetError) as e:
        if headless:
            print(f"spectest: {e}", file=sys.stderr)
            sys.exit(2)
        log.error("spectest: %s", e)


def _worker_drain(environment: Environment, msg, **_kw) -> None:
    """Worker: stop users (they finish their request within --stop-timeout), send all rows."""
    environment.runner.stop()
    environment.runner.send_message(MSG_ROWS, {"rows": environment.spectest.take_outbox(),
                                               "final": True})


def _master_rows(environment: Environment, msg, **_kw) -> None:
    run: LoadRun = environment.spectest
    run.ingest(msg.data.get("rows") or [])
    if msg.data.get("final"):
        run.drained.add(msg.node_id)


def _extend_web_ui(environment: Environment) -> None:
    import json

    from flask import Response, request

    web_ui = environment.web_ui
    environment.spectest.live_charts = True  # the run keeps the charts' series
    web_ui.template_args["extended_tabs"] = [{"title": "Speculative decoding", "key": TAB_KEY}]
    web_ui.template_args["extended_tables"] = [{"key": TAB_KEY, "structure": [
        {"key": k, "title": t} for k, t in LIVE_COLUMNS]}]
    web_ui.template_args["extended_csv_files"] = [
        {"href": "/spectest/steps.csv", "title": "Download spectest per-step summary (CSV)"}]

    def live_rows() -> list[dict]:
        run: LoadRun = environment.spectest
        if run.sink is None or not run.sink.steps:
            return []
        rows = run.sink.rows(run.sink.steps[-1:])
        return [{k: _fmt(r.get(k)) for k, _ in LIVE_COLUMNS} for r in rows]

    @web_ui.app.after_request
    def _add_stats(response):
        if request.path == "/" and response.mimetype == "text/html":  # the charts' script
            page = response.get_data(as_text=True)
            if LIVE_SCRIPT not in page and "</body>" in page:
                response.set_data(page.replace(
                    "</body>", f'<script src="{LIVE_SCRIPT}"></script></body>', 1))
            return response
        if request.path != "/stats/requests" or not response.is_json:
            return response
        body = response.get_json()
        body["extended_stats"] = [{"key": TAB_KEY, "data": live_rows()}]
        response.set_data(json.dumps(body))
        return response

    @web_ui.app.route(LIVE_SCRIPT)
    def _live_script():
        return Response((Path(__file__).with_name("live_ui.js")).read_text(encoding="utf-8"),
                        mimetype="application/javascript")

    @web_ui.app.route("/spectest/live.json")
    def _live_json():
        run: LoadRun = environment.spectest
        data = run.live.to_json() if run.live is not None else {"workloads": {}}
        return Response(json.dumps(data, allow_nan=False, default=_nan_to_none),
                        mimetype="application/json")

    @web_ui.app.route("/spectest/steps.csv")
    def _steps_csv():
        run: LoadRun = environment.spectest
        text = run.sink.frame().to_csv(index=False) if run.sink is not None else ""
        return Response(text, mimetype="text/csv", headers={
            "Content-Disposition": "attachment; filename=spectest-steps.csv"})


def _nan_to_none(v):
    return None


def _fmt(v):
    if isinstance(v, float):
        return round(v, 3)
    return "" if v is None else v
