"""``--embedded``: the bundled ``spectest serve`` as a child process of the sweep.

``EmbeddedServer`` starts ``python -m spectest serve --host 127.0.0.1 --port 0 …`` with the
sweep's model, draft, K and batch limit (or, for ``--disaggregated``, ``spectest serve-draft``
first, whose URL the server then drafts from), waits until its start-up line names the URL and
``/health`` answers, and stops it (SIGTERM: the server drains, then SIGKILL after a grace) on
exit — also when the sweep is interrupted. The server's output goes to a log file in the sweep
folder. Starting, waiting, the log and stopping are :class:`spectest.procs.Child`'s (which also
has the kernel stop the server if the sweep dies without cleaning up).

It knows the serve command's flags and start-up line, not the engine.
"""

from __future__ import annotations

from pathlib import Path

from spectest import procs

START_LINE = r"spectest (?:serving|draft server) .* at (http://[0-9.]+:\d+)"


class ServerStartError(procs.ChildError):
    """The bundled server did not come up; the message is one readable line."""


class EmbeddedServer(procs.Child):
    """``with EmbeddedServer(args, log_path) as url:`` — the bundled server for one sweep."""

    def __init__(self, serve_args: list[str], log_path: Path, start_timeout_s: float = 300.0,
                 subcommand: str = "serve"):
        self.serve_args = list(serve_args)  # may change until it starts
        self.subcommand = subcommand  # "serve", or "serve-draft" for --disaggregated
        super().__init__(
            self.command, log_path=log_path, env=procs.python_env(), cwd=procs.REPO_ROOT,
            name="the draft server" if subcommand == "serve-draft" else "the bundled server",
            ready_pattern=START_LINE, health_path="/health", start_timeout_s=start_timeout_s,
            stop_timeout_s=30.0, error=ServerStartError)

    @property
    def command(self) -> list[str]:
        return procs.python_argv("spectest", self.subcommand, "--host", "127.0.0.1",
                                 "--port", "0", *self.serve_args)

    def start(self) -> EmbeddedServer:
        # preexec_fn is safe here: the sweep starts servers only while no display thread runs
        self.argv = self.command
        return super().start()

    def __enter__(self) -> str:
        return super().__enter__().url
