"""Live spectest servers for the server tests, on real sockets on 127.0.0.1.

This module owns two ways to run the server under test:

* :class:`LiveServer` — ``Server(...).app()`` served by an aiohttp ``AppRunner`` on a free port
  in a background thread with its own event loop (the same runner settings as ``spectest
  serve``). Models are loaded once (:func:`load_pair`) and shared by every engine built from
  them, so a test module pays for loading once.
* :class:`ServeProcess` — ``python -m spectest serve --port 0 ...`` as a subprocess, ready once
  its start-up line names the URL; for the CLI, signals, fault flags and RSS measurements.

It also has the small HTTP helpers the tests share (:func:`scrape` for ``/metrics``). It does
not know what the tests assert. The model directory comes from one place, ``models_dir()``:
``$SPECTEST_TEST_MODELS`` (a directory holding ``target/`` and ``draft/``), default the
embedded pair.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import requests
from aiohttp import web
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from spectest.engine.api import MODELS_DIR, make_drafter
from spectest.engine.engine import EngineConfig, SpecEngine
from spectest.engine.loader import LoadedModel, load_checkpoint
from spectest.engine.policies import make_policy
from spectest.engine.scheduler import SchedulerConfig
from spectest.server.app import Server, ServerConfig
from spectest.telemetry.tracing import build_tracer_provider

MODEL = "spectest-test"
REPO = Path(__file__).resolve().parents[2]
START_LINE = re.compile(r"spectest serving .* at (http://[0-9.]+:\d+)")


def models_dir() -> Path:
    return Path(os.environ.get("SPECTEST_TEST_MODELS", MODELS_DIR))


@dataclass(frozen=True)
class ModelPair:
    target: LoadedModel
    draft: LoadedModel


def load_pair(root: Path | None = None) -> ModelPair:
    root = root or models_dir()
    return ModelPair(load_checkpoint(root / "target"), load_checkpoint(root / "draft"))


def make_engine(pair: ModelPair, *, drafter: str = "draft-model", k: int = 4,
                max_num_seqs: int = 4, max_model_len: int = 256,
                max_waiting: int = 64, prefix_cache_tokens: int = 0) -> SpecEngine:
    """A fresh engine (own caches and scheduler) over the already-loaded weights."""
    policy = make_policy("fixed", k=k)
    config = EngineConfig(SchedulerConfig(max_num_seqs=max_num_seqs, max_model_len=max_model_len,
                                          max_waiting=max_waiting, spec_slots=k + 1),
                          prefix_cache_tokens=prefix_cache_tokens)
    return SpecEngine(pair.target.model, pair.target.tokenizer,
                      make_drafter(drafter, pair.draft, max_num_seqs, max_model_len),
                      policy, config, model_name=pair.target.name)


def make_server(pair: ModelPair, *, api_key: str | None = None, trace_file: Path | None = None,
                trace_content: bool = False, drain_seconds: float = 2.0,
                admin_key: str | None = None, **engine_kw) -> Server:
    provider = build_tracer_provider("spectest-test", trace_file, environ={}) \
        if trace_file else None
    return Server(make_engine(pair, **engine_kw),
                  ServerConfig(MODEL, api_key, trace_content, drain_seconds,
                               admin_key=admin_key),
                  CollectorRegistry(), provider)


class LiveServer:
    """``with LiveServer(server) as live: requests.get(live.url + "/health")``; ``host`` is
    the bind address (the URL always names 127.0.0.1); ``sndbuf`` sets the send buffer of
    the listening socket, which accepted connections inherit (a socket that fills fast)."""

    def __init__(self, server: Server, host: str = "127.0.0.1", sndbuf: int | None = None):
        self.server, self.host, self.sndbuf = server, host, sndbuf
        self.url = ""
        self._loop = asyncio.new_event_loop()
        self._runner: web.AppRunner | None = None
        self._thread = threading.Thread(target=self._loop.run_forever, name="live-server",
                                        daemon=True)

    @property
    def base_url(self) -> str:
        return self.url + "/v1"

    def __enter__(self) -> "LiveServer":
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(30)
        return self

    async def _start(self) -> None:
        self._runner = web.AppRunner(self.server.app(), handler_cancellation=True,
                                     shutdown_timeout=self.server.config.drain_seconds + 1)
        await self._runner.setup()
        if self.sndbuf is None:
            site = web.TCPSite(self._runner, self.host, 0)
        else:
            listener = socket.create_server((self.host, 0))
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, self.sndbuf)
            site = web.SockSite(self._runner, listener)
        await site.start()
        self.port = self._runner.addresses[0][1]
        self.url = f"http://127.0.0.1:{self.port}"

    def __exit__(self, *exc) -> None:
        try:
            if self._runner is not None:
                asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(30)
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)
            self._loop.close()

    # small HTTP helpers --------------------------------------------------------------------
    def post(self, path: str, body=None, **kw) -> requests.Response:
        return requests.post(self.url + path, json=body, timeout=kw.pop("timeout", 60), **kw)

    def get(self, path: str, **kw) -> requests.Response:
        return requests.get(self.url + path, timeout=kw.pop("timeout", 30), **kw)

    def healthy(self) -> bool:
        return self.get("/health").status_code == 200


def scrape(url: str) -> dict[tuple[str, frozenset], float]:
    """``/metrics`` as {(sample name, frozenset(label items)): value}."""
    text = requests.get(url.rstrip("/") + "/metrics", timeout=30).text
    return {(s.name, frozenset(s.labels.items())): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


def metric_sum(samples: dict, name: str, **labels) -> float:
    """Sum of the samples called ``name`` whose labels include ``labels``."""
    want = set(labels.items())
    return sum(v for (n, lab), v in samples.items() if n == name and want <= lab)


def sse_events(resp: requests.Response) -> list:
    """Every ``data:`` payload of a streamed response, read to EOF (``[DONE]`` kept as str)."""
    events = []
    for line in resp.iter_lines():
        if line.startswith(b"data: "):
            payload = line[6:]
            events.append(payload.decode() if payload == b"[DONE]" else json.loads(payload))
    return events


class ServeProcess:
    """``spectest serve`` in a subprocess on a free port (``--port 0``; the URL is read from
    the start-up line); ``args`` are extra CLI flags (``threads=None``: no ``--threads``, the
    server's default), ``env`` extra environment (inherited ``OTEL_*`` variables are dropped).
    Stopped with SIGTERM (then killed) on exit.
    """

    def __init__(self, *args: str, models: Path | None = None, startup_timeout: float = 90.0,
                 env: dict[str, str] | None = None, threads: int | None = 1):
        root = models or models_dir()
        self.argv = [sys.executable, "-m", "spectest", "serve", "--port", "0",
                     "--model", str(root / "target"), "--draft", str(root / "draft"),
                     *(("--threads", str(threads)) if threads else ()), *args]
        self.startup_timeout = startup_timeout
        self.env = {**{k: v for k, v in os.environ.items() if not k.startswith("OTEL_")},
                    **(env or {}), "PYTHONUNBUFFERED": "1"}
        self.proc: subprocess.Popen | None = None
        self.url = ""
        self.lines: list[str] = []
        self._reader: threading.Thread | None = None
        self._started = threading.Event()

    def __enter__(self) -> "ServeProcess":
        self.proc = subprocess.Popen(self.argv, cwd=REPO, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True, env=self.env)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        if not self._started.wait(self.startup_timeout) or not self.url:
            self._kill()
            raise RuntimeError("spectest serve did not start:\n" + "".join(self.lines))
        return self

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.append(line)
            match = START_LINE.search(line)
            if match and not self.url:
                self.url = match.group(1)
                self._started.set()
        self._started.set()  # EOF: the process ended (maybe before starting)

    @property
    def output(self) -> str:
        return "".join(self.lines)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def rss_bytes(self) -> int:
        with open(f"/proc/{self.proc.pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
        raise RuntimeError("no VmRSS")

    def signal_and_wait(self, sig: int = signal.SIGTERM, timeout: float = 30.0) -> int:
        self.proc.send_signal(sig)
        rc = self.proc.wait(timeout)
        self._reader.join(5)
        return rc

    def _kill(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def __exit__(self, *exc) -> None:
        if self.proc and self.proc.poll() is None:
            try:
                self.signal_and_wait(signal.SIGTERM, 20)
            except subprocess.TimeoutExpired:
                self._kill()
        if self.proc and self.proc.stdout:
            self.proc.stdout.close()


def run_cli(*args: str, timeout: float = 90.0) -> subprocess.CompletedProcess:
    """``python -m spectest serve ARGS`` to completion (for start-up errors)."""
    return subprocess.run([sys.executable, "-m", "spectest", "serve", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=timeout)


def run_benchmark(script: str, *args: str, timeout: float = 900.0) -> subprocess.CompletedProcess:
    """``python benchmarks/SCRIPT ARGS`` from the repository, to completion, output captured."""
    return subprocess.run([sys.executable, f"benchmarks/{script}", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=timeout)


def wait_until(predicate, timeout: float = 10.0, interval: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return bool(predicate())
