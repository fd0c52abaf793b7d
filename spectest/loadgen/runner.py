"""Run spectest's processes: a headless Locust test (and its results folder), or the stub.

``LocustProcess`` is the one way spectest starts Locust: ``locust -f <locustfile> --headless``
with the spectest flags (``locust_args``) — or, with ``workers``, a master that forks that many
workers (``--processes``) talking over a free loopback port — as a :class:`spectest.procs.Child`
whose output goes to ``locust.log`` in the results folder. Stopping it sends SIGTERM to the
master alone (Locust then stops its workers and closes its files), then SIGKILL to whatever of
its process group is left after a grace. ``run_locust(LocustRun(...))`` runs one to completion,
bounded by ``timeout_s``, and returns where ``requests.jsonl`` / ``steps.csv`` were written (see
``results``) with the exit code and the log; the sweep's step (``sweep.step``) watches one
while it runs.

``StubProcess`` starts ``spectest.loadgen.stub`` on a free port for tests and benchmarks.
Neither parses results or decides anything; they build command lines, wait and clean up. The
child-process mechanics (environment, log, process group, stop) are :mod:`spectest.procs`'.
"""

from __future__ import annotations

import math
import os
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from spectest import procs

WORKLOADS = procs.REPO_ROOT / "workloads"


@dataclass(frozen=True)
class LocustRun:
    locustfile: str  # a path, or a bundled workload name: chat | code | rag | mixed
    host: str
    results_dir: str | os.PathLike
    steps: tuple[int, ...] = ()
    request_rates: tuple[float, ...] = ()
    step_time_s: float = 30.0
    users: int = 1  # used when neither steps nor request_rates is given
    run_time_s: float | None = None
    speculative: str = "default"  # on | off | default
    model: str = ""
    dataset: str = ""
    seed: int = 0
    max_tokens: int = 0
    slo_ttft_ms: float = 0.0
    slo_tpot_ms: float = 0.0
    slo_e2el_ms: float = 0.0
    workers: int = 0  # 0: one process; N: a master and N workers it forks
    stop_timeout_s: float = 30.0
    nice: int = 0  # priority change for the Locust processes (< 0 needs privileges)
    extra_args: tuple[str, ...] = field(default_factory=tuple)


@dataclass(frozen=True)
class RunOutcome:
    returncode: int
    results_dir: Path
    log_path: Path
    timed_out: bool

    @property
    def steps_csv(self) -> Path:
        return self.results_dir / "steps.csv"

    @property
    def requests_jsonl(self) -> Path:
        return self.results_dir / "requests.jsonl"


def locustfile_path(name_or_path: str) -> str:
    bundled = WORKLOADS / f"{name_or_path}.py"
    return str(bundled) if bundled.is_file() else name_or_path


def locust_args(run: LocustRun) -> list[str]:
    """The spectest + Locust flags shared by the (single or master) process."""
    args = ["--host", run.host, "--headless", "--only-summary",
            "--results-dir", str(run.results_dir), "--step-time", str(run.step_time_s),
            "--speculative", run.speculative, "--seed", str(run.seed),
            "--stop-timeout", str(math.ceil(run.stop_timeout_s))]
    if run.steps:
        args += ["--steps", ",".join(map(str, run.steps))]
    elif run.request_rates:
        args += ["--request-rates", ",".join(map(str, run.request_rates))]
    else:
        args += ["--users", str(run.users)]
    if run.run_time_s:
        args += ["--run-time", f"{math.ceil(run.run_time_s)}s"]
    for flag, value in (("--spectest-model", run.model), ("--dataset", run.dataset),
                        ("--max-tokens", run.max_tokens), ("--slo-ttft-ms", run.slo_ttft_ms),
                        ("--slo-tpot-ms", run.slo_tpot_ms), ("--slo-e2el-ms", run.slo_e2el_ms)):
        if value:
            args += [flag, str(value)]
    return args + list(run.extra_args)


def planned_seconds(run: LocustRun) -> float:
    n = len(run.steps or run.request_rates)
    planned = n * run.step_time_s if n else (run.run_time_s or 0)
    return min(planned, run.run_time_s or planned)


def locust_argv(run: LocustRun) -> list[str]:
    """The whole command line: one process, or a master forking ``run.workers`` workers that
    reach it on a free loopback port."""
    argv = procs.python_argv("locust", "-f", locustfile_path(run.locustfile), *locust_args(run))
    if run.workers:
        port = str(procs.free_port())
        argv += ["--processes", str(run.workers), "--master-bind-host", "127.0.0.1",
                 "--master-bind-port", port, "--master-port", port,
                 "--expect-workers-max-wait", "60"]
    return argv


def locust_env(env: dict | None = None) -> dict[str, str]:
    env = procs.python_env(env)
    env.pop("LOCUST_SKIP_MONKEY_PATCH", None)  # a test process may set it; Locust needs gevent
    return env


class LocustProcess:
    """``with LocustProcess(run) as locust:`` — one Locust run, started; stopped on exit.

    ``terminate`` asks it to end now (SIGTERM to the master: Locust writes its summary and
    closes its files with what it measured so far); ``stop`` asks, if nobody has, waits up to
    ``grace_s`` and kills the whole process group (forked workers included).
    """

    def __init__(self, run: LocustRun, env: dict | None = None, grace_s: float = 15.0):
        self.results_dir = Path(run.results_dir)
        self.log_path = self.results_dir / "locust.log"
        self.grace_s = grace_s
        self.child = procs.Child(locust_argv(run), name="Locust", log_path=self.log_path,
                                 env=locust_env(env), nice=run.nice)
        self._asked = False

    def start(self) -> LocustProcess:
        self.child.start()  # creates the results folder, which holds its log
        return self

    def poll(self) -> int | None:
        return self.child.proc.poll()

    @property
    def returncode(self) -> int | None:
        return self.child.proc.returncode

    def wait(self, timeout_s: float) -> bool:
        """True when Locust ended within ``timeout_s``."""
        try:
            self.child.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return False
        return True

    def terminate(self) -> None:
        if self.poll() is None:
            self._asked = True
            self.child.proc.terminate()

    def stop(self) -> None:
        if not self._asked:
            self.terminate()
        self.wait(self.grace_s)
        self.child.kill()

    def __enter__(self) -> LocustProcess:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def run_locust(run: LocustRun, timeout_s: float | None = None,
               env: dict | None = None) -> RunOutcome:
    """Run to completion (or ``timeout_s``, default: the plan + stop timeout + 60 s)."""
    timeout_s = timeout_s or planned_seconds(run) + run.stop_timeout_s + 60
    timed_out = False
    with LocustProcess(run, env) as locust:
        if not locust.wait(timeout_s):
            timed_out = True
            locust.terminate()  # Locust writes its summary on SIGTERM
    return RunOutcome(locust.returncode, locust.results_dir, locust.log_path, timed_out)


class StubProcess(procs.Child):
    """``with StubProcess("--ttft-ms", "20") as url:`` — the stub in its own process.

    Started with ``--port 0``; the URL comes from its "listening on" line in its log (a
    temporary file, removed on exit). On exit it is stopped (SIGTERM, then SIGKILL). ``cpu``
    pins it to one core, ``nice`` changes its priority (best effort).
    """

    def __init__(self, *args: str, cpu: int | None = None, nice: int = 0,
                 start_timeout_s: float = 20.0):
        self.args = args
        super().__init__(procs.python_argv("spectest.loadgen.stub", "--port", "0", *args),
                         name="the stub", log_path=os.devnull, env=procs.python_env(),
                         ready_pattern=r"listening on (http://\S+)",
                         start_timeout_s=start_timeout_s, stop_timeout_s=5.0, cpu=cpu,
                         nice=nice)

    def start(self) -> StubProcess:
        self.log_path = procs.temp_log("spectest-stub-")
        return super().start()

    def __enter__(self) -> str:
        return super().__enter__().url

    def __exit__(self, *exc) -> None:
        super().__exit__(*exc)
        self.log_path.unlink(missing_ok=True)
