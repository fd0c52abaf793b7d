"""The bundled server as an audit endpoint: ``--candidate embedded`` / ``--baseline embedded``.

Owns: the command line of ``python -m spectest serve`` on a free loopback port (port 0; the
server prints the port it bound) and the audit's wording when it does not start.  Starting it,
waiting until its start-up line names the URL, and stopping it (SIGTERM, then SIGKILL) however
the audit ends are :class:`spectest.procs.Child`'s.  Also used by the auditor's tests and
benchmark to start candidates with injected faults.

Does not know: the checks.  The server's output goes to a temporary log, removed when the
server stops; its last lines are quoted (and the log kept) if the server fails to start.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

from spectest import procs
from spectest.audit.samples import AuditError
from spectest.engine.drafter_names import needs_checkpoint

# serve's start-up line (its URL is the last " at http://" in it; the log's first line, the
# command, never matches)
_BOUND = r"spectest serving .* at (http://127\.0\.0\.1:\d+)"


@dataclass(frozen=True)
class ServerSpec:
    model: str = "embedded"
    draft: str = "auto"
    drafter: str = "draft-model"
    k: int | None = None  # None: serve's default for the model
    threads: int | None = 1
    extra_args: tuple[str, ...] = ()
    device: str = "auto"  # serve --device

    def argv(self) -> list[str]:
        argv = procs.python_argv("spectest", "serve", "--host", "127.0.0.1", "--port", "0",
                                 "--model", self.model, "--drafter", self.drafter,
                                 "--drain-seconds", "1")
        if self.k is not None:
            argv += ["--k", str(self.k)]
        if needs_checkpoint(self.drafter):
            argv += ["--draft", self.draft]
        if self.threads:
            argv += ["--threads", str(self.threads)]
        if self.device != "auto":
            argv += ["--device", self.device]
        return argv + list(self.extra_args)


class ServerDidNotStart(AuditError, procs.ChildError):
    """The embedded server did not start: the audit cannot run (one readable line)."""


class ServerProcess(procs.Child):
    """``with ServerProcess(spec) as url: ...`` — a bundled server for the duration."""

    def __init__(self, spec: ServerSpec, start_timeout_s: float = 180.0):
        self.spec = spec
        argv = spec.argv()
        super().__init__(argv, name=f"the embedded server (spectest {' '.join(argv[3:])})",
                         log_path=os.devnull, env=procs.python_env(), ready_pattern=_BOUND,
                         start_timeout_s=start_timeout_s, error=ServerDidNotStart)

    def start(self) -> ServerProcess:
        self.log_path = procs.temp_log("spectest-audit-server-")
        return super().start()

    def __enter__(self) -> str:
        return super().__enter__().url

    def __exit__(self, *exc) -> None:  # the log of one that did not start stays: it is named
        super().__exit__(*exc)
        self.log_path.unlink(missing_ok=True)


def fault_args(faults: Sequence[str]) -> tuple[str, ...]:
    """Server flags that inject deliberate correctness faults (for the auditor's own tests)."""
    out: list[str] = []
    for f in faults:
        out += ["--inject-fault", f]
    return tuple(out + ["--i-understand-faults-break-correctness"]) if faults else ()

