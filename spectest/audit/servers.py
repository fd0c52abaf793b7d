"""The bundled server as an audit endpoint: ``--candidate embedded`` / ``--baseline embedded``.

Owns: starting ``python -m spectest serve`` as a child process on a free loopback port (port 0;
the server prints the port it bound), waiting until it answers, and stopping it (SIGTERM, then
SIGKILL) however the audit ends.  Also used by the auditor's tests and benchmark to start
candidates with injected faults.

Does not know: the checks.  The server's stderr goes to a temporary log whose last line is
quoted if the server fails to start.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from spectest.audit.samples import AuditError
from spectest.engine.drafter_names import needs_checkpoint

_BOUND = re.compile(r"at (http://127\.0\.0\.1:\d+)")


@dataclass(frozen=True)
class ServerSpec:
    model: str = "embedded"
    draft: str = "auto"
    drafter: str = "draft-model"
    k: int | None = None  # None: serve's default for the model
    threads: int | None = 1
    extra_args: tuple[str, ...] = ()

    def argv(self) -> list[str]:
        argv = [sys.executable, "-m", "spectest", "serve", "--host", "127.0.0.1", "--port", "0",
                "--model", self.model, "--drafter", self.drafter, "--drain-seconds", "1"]
        if self.k is not None:
            argv += ["--k", str(self.k)]
        if needs_checkpoint(self.drafter):
            argv += ["--draft", self.draft]
        if self.threads:
            argv += ["--threads", str(self.threads)]
        return argv + list(self.extra_args)


class ServerProcess:
    """``with ServerProcess(spec) as url: ...`` — a bundled server for the duration."""

    def __init__(self, spec: ServerSpec, start_timeout_s: float = 180.0):
        self.spec = spec
        self.start_timeout_s = start_timeout_s
        self.proc: subprocess.Popen | None = None
        self.url: str | None = None
        self._log = None

    def __enter__(self) -> str:
        self._log = tempfile.NamedTemporaryFile("w+", prefix="spectest-audit-server-",
                                                suffix=".log", delete=False)
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        root = str(Path(__file__).resolve().parents[2])
        env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
        self.proc = subprocess.Popen(self.spec.argv(), stdout=subprocess.PIPE,
                                     stderr=self._log, text=True, env=env,
                                     start_new_session=True)
        found: list[str] = []
        reader = threading.Thread(target=self._read_start_line, args=(found,), daemon=True)
        reader.start()
        reader.join(self.start_timeout_s)
        if not found:
            self.stop()
            raise AuditError(f"the embedded server ({' '.join(self.spec.argv()[3:])}) did not "
                             f"start: {self._last_log_line()}")
        self.url = found[0]
        return self.url

    def _read_start_line(self, found: list[str]) -> None:
        for line in self.proc.stdout:  # the start line, then nothing until shutdown
            m = _BOUND.search(line)
            if m:
                found.append(m.group(1))
                return

    def _last_log_line(self) -> str:
        if self.proc is not None and self.proc.poll() is None:
            return "no start line within the timeout"
        try:
            lines = [x for x in Path(self._log.name).read_text().splitlines() if x.strip()]
        except OSError:
            lines = []
        return lines[-1].strip() if lines else f"exit code {self.proc.returncode}"

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        if self.proc is not None and self.proc.stdout:
            self.proc.stdout.close()
        if self._log is not None:
            self._log.close()
            Path(self._log.name).unlink(missing_ok=True)
            self._log = None

    def __exit__(self, *exc) -> None:
        self.stop()


def fault_args(faults: Sequence[str]) -> tuple[str, ...]:
    """Server flags that inject deliberate correctness faults (for the auditor's own tests)."""
    out: list[str] = []
    for f in faults:
        out += ["--inject-fault", f]
    return tuple(out + ["--i-understand-faults-break-correctness"]) if faults else ()

