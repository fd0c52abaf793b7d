"""Third-party servers spectest is tested against: llama.cpp's llama-server and vLLM.

Each module knows where its install script puts the server (one cache folder per pinned
version, :func:`cache_root`), the command line and environment for a speculative or plain
server on loopback, and nothing else: starting, waiting for ``/health``, logs and stopping are
:mod:`spectest.procs`' (:func:`launch`). spectest's measuring tools never need these modules —
they talk HTTP to whatever server the user runs; tests, benchmarks and the docs examples do.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path

from spectest import procs


class ThirdPartyError(procs.ChildError):
    """A third-party server is not installed or did not start; one readable line."""


def cache_root() -> Path:
    """``$SPECTEST_CACHE``, else ``$XDG_CACHE_HOME/spectest``, else ``~/.cache/spectest``."""
    base = os.environ.get("SPECTEST_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "spectest")
    return Path(base)


def launch(name: str, argv: Sequence[str], port: int, log_path: Path, *,
           env: Mapping[str, str] | None = None, cpu: int | None = None,
           start_timeout_s: float = 120.0, health_path: str = "/health") -> procs.Child:
    """A not-yet-started :class:`procs.Child` for a server on ``127.0.0.1:port``, ready when
    ``health_path`` answers 200 (use it as ``with launch(...) as child: child.url``)."""
    return procs.Child(argv, name=name, log_path=log_path, env=env,
                       url=f"http://127.0.0.1:{port}", health_path=health_path, cpu=cpu,
                       start_timeout_s=start_timeout_s, error=ThirdPartyError)
