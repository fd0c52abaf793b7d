"""``--embedded``: the bundled ``spectest serve`` as a child process of the sweep.

``EmbeddedServer`` starts ``python -m spectest serve --host 127.0.0.1 --port 0 …`` with the
sweep's model, draft, K and batch limit (or, for ``--disaggregated``, ``spectest serve-draft``
first, whose URL the server then drafts from), waits until its start-up line names the URL and
``/health`` answers, and stops it (SIGTERM: the server drains, then SIGKILL after a grace) on
exit — also when the sweep is interrupted. The child gets SIGTERM from the kernel if the sweep
dies without cleaning up (``PR_SET_PDEATHSIG``), so no server outlives its sweep. The server's
output goes to a log file in the sweep folder.

It knows the serve command's flags, not the engine.
"""

from __future__ import annotations

import ctypes
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from spectest.loadgen.runner import REPO_ROOT

START_LINE = re.compile(r"spectest (?:serving|draft server) .* at (http://[0-9.]+:\d+)")
PR_SET_PDEATHSIG = 1


class ServerStartError(RuntimeError):
    """The bundled server did not come up; the message is one readable line."""


def die_with_parent() -> None:
    """A ``preexec_fn``: the kernel sends SIGTERM to the child when the sweep dies (Linux)."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    except OSError:  # not Linux/glibc: cleanup then relies on the sweep's own finally
        pass


class EmbeddedServer:
    """``with EmbeddedServer(args, log_path) as url:`` — the bundled server for one sweep."""

    def __init__(self, serve_args: list[str], log_path: Path, start_timeout_s: float = 300.0,
                 subcommand: str = "serve"):
        self.serve_args = list(serve_args)
        self.subcommand = subcommand  # "serve", or "serve-draft" for --disaggregated
        self.log_path = Path(log_path)
        self.start_timeout_s = start_timeout_s
        self.proc: subprocess.Popen | None = None
        self.url = ""

    @property
    def command(self) -> list[str]:
        return [sys.executable, "-m", "spectest", self.subcommand, "--host", "127.0.0.1",
                "--port", "0", *self.serve_args]

    def __enter__(self) -> str:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(
            filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))}
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(self.log_path, "a", encoding="utf-8")
        self._log.write(f"$ {' '.join(self.command)}\n")
        self._log.flush()
        # preexec_fn is safe here: the sweep starts servers only while no display thread runs
        self.proc = subprocess.Popen(self.command, stdout=self._log, stderr=subprocess.STDOUT,
                                     env=env, cwd=REPO_ROOT, start_new_session=True,
                                     preexec_fn=die_with_parent)
        deadline = time.monotonic() + self.start_timeout_s
        try:
            while time.monotonic() < deadline:
                if self.proc.poll() is not None:
                    raise ServerStartError(
                        f"the bundled server exited with code {self.proc.returncode}: "
                        f"{self._last_line()} (log: {self.log_path})")
                match = START_LINE.search(self.log_path.read_text(errors="replace"))
                if match and _healthy(match.group(1)):
                    self.url = match.group(1)
                    return self.url
                time.sleep(0.3)
            raise ServerStartError(f"the bundled server did not answer within "
                                   f"{self.start_timeout_s:.0f} s (log: {self.log_path})")
        except BaseException:
            self.__exit__(None, None, None)
            raise

    def _last_line(self) -> str:
        lines = [x for x in self.log_path.read_text(errors="replace").splitlines() if x.strip()]
        return lines[-1].strip() if lines else "no output"

    def __exit__(self, *exc) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if getattr(self, "_log", None) is not None and not self._log.closed:
            self._log.close()


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/health", timeout=3) as r:
            return r.status == 200
    except OSError:
        return False
