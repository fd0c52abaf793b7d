"""Run spectest's processes: a headless Locust test (and its results folder), or the stub.

``run_locust(LocustRun(...))`` is what a sweep calls for each (workload, speculation) pair:
it starts ``locust -f <locustfile> --headless`` with the spectest flags — or one master plus
``workers`` worker processes on loopback — waits for it (bounded by ``timeout_s``), and returns
where ``requests.jsonl`` / ``steps.csv`` were written (see ``results``) with the exit code and
the log. The Locust processes are always reaped; a timed-out run is terminated, and whatever
it measured so far is still in the folder.

``StubProcess`` starts ``spectest.loadgen.stub`` on a free port for tests and benchmarks.
Neither parses results or decides anything; they build command lines, wait and clean up.
"""

from __future__ import annotations

import math
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
WORKLOADS = REPO_ROOT / "workloads"


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
    workers: int = 0  # 0: one process; N: a master and N workers
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


def run_locust(run: LocustRun, timeout_s: float | None = None,
               env: dict | None = None) -> RunOutcome:
    """Run to completion (or ``timeout_s``, default: the plan + stop timeout + 60 s)."""
    out = Path(run.results_dir)
    out.mkdir(parents=True, exist_ok=True)
    log_path = out / "locust.log"
    locustfile = locustfile_path(run.locustfile)
    env = {**os.environ, **(env or {})}
    env.pop("LOCUST_SKIP_MONKEY_PATCH", None)  # a test process may set it; Locust needs gevent
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    base = [sys.executable, "-m", "locust", "-f", locustfile]
    timeout_s = timeout_s or planned_seconds(run) + run.stop_timeout_s + 60
    procs: list[subprocess.Popen] = []
    with open(log_path, "w", encoding="utf-8") as log:
        if run.workers:
            port = free_port()
            master = base + locust_args(run) + ["--master", "--master-bind-host", "127.0.0.1",
                                                "--master-bind-port", str(port),
                                                "--expect-workers", str(run.workers),
                                                "--expect-workers-max-wait", "60"]
            procs.append(subprocess.Popen(master, stdout=log, stderr=subprocess.STDOUT, env=env,
                                          preexec_fn=_renice(run.nice)))
            for _ in range(run.workers):
                procs.append(subprocess.Popen(
                    base + ["--worker", "--master-host", "127.0.0.1", "--master-port", str(port)],
                    stdout=log, stderr=subprocess.STDOUT, env=env, preexec_fn=_renice(run.nice)))
        else:
            procs.append(subprocess.Popen(base + locust_args(run), stdout=log,
                                          stderr=subprocess.STDOUT, env=env,
                                          preexec_fn=_renice(run.nice)))
        timed_out = False
        try:
            procs[0].wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
            procs[0].send_signal(signal.SIGTERM)  # Locust writes its summary on SIGTERM
        finally:
            _reap(procs)
    return RunOutcome(procs[0].returncode, out, log_path, timed_out)


def _reap(procs: list[subprocess.Popen], grace_s: float = 15.0) -> None:
    deadline = time.monotonic() + grace_s
    for p in procs:
        try:
            p.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def _renice(nice: int, cpu: int | None = None):
    """A ``preexec_fn``: change priority (best effort) and pin to one core, if asked."""
    if not nice and cpu is None:
        return None

    def apply() -> None:
        if nice:
            try:
                os.nice(nice)
            except OSError:  # not allowed here: run at normal priority
                pass
        if cpu is not None:
            os.sched_setaffinity(0, {cpu})
    return apply


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class StubProcess:
    """``with StubProcess("--ttft-ms", "20") as url:`` — the stub in its own process.

    Started with ``--port 0``; the URL comes from its "listening on" line. On exit it is
    terminated (SIGTERM, then SIGKILL). ``cpu`` pins it to one core (``os.sched_setaffinity``),
    ``nice`` changes its priority (best effort).
    """

    def __init__(self, *args: str, cpu: int | None = None, nice: int = 0,
                 start_timeout_s: float = 20.0):
        self.args, self.cpu, self.nice = args, cpu, nice
        self.start_timeout_s = start_timeout_s
        self.proc: subprocess.Popen | None = None
        self._reader: threading.Thread | None = None
        self.url = ""

    def __enter__(self) -> str:
        root = str(Path(__file__).resolve().parents[2])
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(
            filter(None, [root, os.environ.get("PYTHONPATH")]))}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "spectest.loadgen.stub", "--port", "0", *self.args],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
            preexec_fn=_renice(self.nice, self.cpu))
        deadline = time.monotonic() + self.start_timeout_s
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if "listening on " in line:
                self.url = line.rsplit("listening on ", 1)[1].strip()
                self.output = deque(maxlen=200)  # keep draining so the pipe never fills
                self._reader = threading.Thread(target=self.output.extend,
                                                args=(self.proc.stdout,), daemon=True)
                self._reader.start()
                return self.url
            if not line and self.proc.poll() is not None:
                break
        self.__exit__(None, None, None)
        raise RuntimeError(f"stub did not start (args {self.args})")

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def __exit__(self, *exc) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.kill()
        if self._reader is not None:
            self._reader.join(timeout=5)
        self.proc.stdout.close()
