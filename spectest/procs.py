"""Child processes spectest starts and owns: servers (its own, llama-server, vLLM), Locust, the stub.

Owns, once for every caller: a free loopback port, the environment a child gets (this checkout
on ``PYTHONPATH`` when spectest runs from a source tree; one core, a priority), starting the
child in its own process group with its output in a log file, waiting until it is *ready* with a
deadline (an HTTP URL answers 200, or a line of its output matches a pattern — whichever the
caller gives), quoting the log's last lines when it dies or never gets ready, and stopping it:
SIGTERM to the whole group, then SIGKILL after a grace. The kernel also sends it SIGTERM when
spectest itself dies without cleaning up (``PR_SET_PDEATHSIG``; from the main thread only: the
signal follows the thread that forked) — a signal a busy server may take its time over, which is
why scripts that own servers also call :func:`exit_on_sigterm`; commands that keep what they
finished use :func:`sigterm_as_interrupt` instead (SIGTERM as Ctrl-C).

Does not know: what the child is for. :class:`Child` is used as ``with Child(...) as child``;
``child.url`` is the base URL: the caller's (it chose the port), or the first group of the
ready pattern (the child chose it and printed it). Failures raise :class:`ChildError` (or a subclass the caller names) with one readable
line that names the log.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
PR_SET_PDEATHSIG = 1
TAIL_LINES = 5


class ChildError(RuntimeError):
    """A child process did not start or get ready; the message is one readable line."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nobody listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def python_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """This process's environment for a Python child that imports spectest: a source checkout
    goes first on ``PYTHONPATH`` (an installed spectest needs nothing)."""
    env = {**os.environ, **(extra or {})}
    if (REPO_ROOT / "pyproject.toml").is_file():
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT),
                                                          env.get("PYTHONPATH")]))
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


def preexec(cpu: int | None = None, nice: int = 0, die_with_parent: bool = True):
    """A ``preexec_fn``: die with the parent (Linux), pin to one core, lower the priority
    (best effort: an unprivileged raise is ignored)."""
    def apply() -> None:
        if die_with_parent:
            try:
                ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
            except OSError:  # not Linux/glibc: cleanup relies on the caller's stop()
                pass
        if nice:
            try:
                os.nice(nice)
            except OSError:
                pass
        if cpu is not None:
            os.sched_setaffinity(0, {cpu})
    return apply


def temp_log(prefix: str) -> Path:
    """A new empty log file in the temporary folder, for a child whose log nobody keeps (its
    owner removes it)."""
    fd, path = tempfile.mkstemp(prefix=prefix, suffix=".log")
    os.close(fd)
    return Path(path)


def log_tail(path: Path, lines: int = TAIL_LINES) -> str:
    """The last non-blank lines of a log, joined with " | " (one readable line)."""
    try:
        text = Path(path).read_text(errors="replace")
    except OSError:
        return "(no log)"
    kept = [x.strip() for x in text.splitlines() if x.strip()][-lines:]
    return " | ".join(x[:300] for x in kept) if kept else "(empty log)"


def healthy(url: str, timeout: float = 3.0) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return resp.status == 200
    except (OSError, urllib.error.HTTPError, ValueError):
        return False


class Child:
    """One child process. Ready when ``ready_pattern`` (if given) matches a line of its log —
    its first group, if any, becomes ``url`` — and ``url + health_path`` (if given) answers
    200. A child given neither (one that runs to completion, as Locust does) is only
    ``start``-ed: ``with`` needs a readiness condition."""

    def __init__(self, argv: Sequence[str], *, name: str, log_path: str | os.PathLike,
                 env: Mapping[str, str] | None = None, url: str = "", health_path: str = "",
                 ready_pattern: str = "", start_timeout_s: float = 120.0,
                 stop_timeout_s: float = 15.0, cpu: int | None = None, nice: int = 0,
                 cwd: str | os.PathLike | None = None, error: type[ChildError] = ChildError):
        self.argv = [str(a) for a in argv]
        self.name = name
        self.log_path = Path(log_path)
        self.env = dict(env) if env is not None else dict(os.environ)
        self.url = url
        self.health_path = health_path
        self.ready = re.compile(ready_pattern) if ready_pattern else None
        self.start_timeout_s = start_timeout_s
        self.stop_timeout_s = stop_timeout_s
        self.cpu, self.nice, self.cwd = cpu, nice, cwd
        self.error = error
        self.proc: subprocess.Popen | None = None
        self.started_s = 0.0  # seconds from spawn to ready
        self._spawned = 0.0  # time.monotonic() at spawn
        self._header = 0  # bytes of the command line heading the log (never read as output)
        self._matched = False

    # --- start ---------------------------------------------------------------------------
    def start(self) -> Child:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "w", encoding="utf-8") as log:
            header = f"$ {' '.join(self.argv)}\n"
            log.write(header)
            log.flush()
            self._header = len(header.encode())
            # the kernel's parent-death signal fires when the *thread* that forked exits, so a
            # child started from a worker thread (a thread pool) would die with that thread
            main = threading.current_thread() is threading.main_thread()
            self._spawned = time.monotonic()
            try:
                self.proc = subprocess.Popen(self.argv, stdout=log, stderr=subprocess.STDOUT,
                                             stdin=subprocess.DEVNULL, env=self.env,
                                             cwd=self.cwd, start_new_session=True,
                                             preexec_fn=preexec(self.cpu, self.nice, main))
            except OSError as exc:
                raise self.error(f"cannot start {self.name} ({self.argv[0]}): "
                                 f"{exc.strerror or exc}") from None
        return self

    def wait_ready(self) -> str:
        """Block until ready (returns ``url``); on death or timeout stop it and raise."""
        if not (self.health_path or self.ready):
            raise ValueError(f"{self.name}: a child needs a health_path or a ready_pattern "
                             f"to be waited for")
        t0 = time.monotonic()
        deadline = t0 + self.start_timeout_s
        while True:
            if self.proc.poll() is not None:
                code = self.proc.returncode
                self.stop()
                raise self.error(f"{self.name} exited with code {code} before it was ready: "
                                 f"{log_tail(self.log_path)} (log: {self.log_path})")
            if self._is_ready():
                # from spawn: several children started together, then waited for one by one
                self.started_s = time.monotonic() - (self._spawned or t0)
                return self.url
            if time.monotonic() > deadline:
                self.stop()
                raise self.error(f"{self.name} was not ready within {self.start_timeout_s:.0f} s: "
                                 f"{log_tail(self.log_path)} (log: {self.log_path})")
            time.sleep(0.3)

    def _is_ready(self) -> bool:
        if self.ready is not None and not self._matched:
            with open(self.log_path, "rb") as log:
                log.seek(self._header)
                match = self.ready.search(log.read().decode(errors="replace"))
            if match is None:
                return False
            self._matched = True
            if match.groups():
                self.url = match.group(1)
        return not self.health_path or healthy(self.url + self.health_path)

    # --- stop ----------------------------------------------------------------------------
    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self) -> None:
        """SIGTERM to the child's process group, SIGKILL after ``stop_timeout_s``."""
        if self.proc is None or self.proc.poll() is not None:
            return
        _signal_group(self.proc, signal.SIGTERM)
        try:
            self.proc.wait(self.stop_timeout_s)
        except subprocess.TimeoutExpired:
            _signal_group(self.proc, signal.SIGKILL)
            self.proc.wait(10)

    def kill(self) -> None:
        """SIGKILL to the whole group — also to what is left of it once the child has exited
        (processes it forked, such as Locust's workers)."""
        if self.proc is None:
            return
        _signal_group(self.proc, signal.SIGKILL)
        if self.proc.poll() is None:
            self.proc.wait(10)

    def __enter__(self) -> Child:
        self.start()
        try:
            self.wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def _signal_group(proc: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        try:
            proc.send_signal(sig)
        except ProcessLookupError:
            pass


class Terminated:
    """What :func:`sigterm_as_interrupt` yields: whether SIGTERM came. Its handler raises
    ``KeyboardInterrupt`` at once, but Python drops an exception raised while a ``__del__`` or
    a weakref callback runs ("Exception ignored in …"), and the command would run on; so loops
    that must stop call :meth:`check` at their safe points (a sweep's every poll), which raises
    it again."""

    def __init__(self) -> None:
        self.signalled = False

    def check(self) -> None:
        if self.signalled:
            raise KeyboardInterrupt


@contextlib.contextmanager
def sigterm_as_interrupt():
    """Within the block, SIGTERM raises KeyboardInterrupt: the same clean stop as Ctrl-C, for
    commands that keep what they finished (a cancelled CI job sends SIGTERM). It raises it
    itself rather than re-sending SIGINT, which a job a script started in the background
    ignores. Yields a :class:`Terminated`. The main thread only (elsewhere the block runs as
    it is, and SIGTERM is left alone)."""
    terminated = Terminated()
    if threading.current_thread() is not threading.main_thread():
        yield terminated
        return

    def handler(signum, frame):
        terminated.signalled = True
        raise KeyboardInterrupt
    old = signal.signal(signal.SIGTERM, handler)
    try:
        yield terminated
    finally:
        signal.signal(signal.SIGTERM, old)


def exit_on_sigterm() -> None:
    """Make SIGTERM end this process the way Ctrl-C does: ``SystemExit`` unwinds the ``with``
    blocks, so every :class:`Child` is stopped with its whole process group (SIGKILL after the
    grace). Without it SIGTERM ends the process at once and the children get only the kernel's
    parent-death SIGTERM, which llama-server and vLLM take as a request for a graceful
    shutdown: both were seen running on after their script was killed. For scripts that own
    servers; call it from the main thread."""
    def _exit(signum, frame) -> None:
        raise SystemExit(128 + signum)
    signal.signal(signal.SIGTERM, _exit)


def python_argv(module: str, *args: str) -> list[str]:
    """``python -m module args…`` with this interpreter."""
    return [sys.executable, "-m", module, *args]
