"""A real Prometheus for tests: started on 127.0.0.1, scraping given targets, queried over HTTP.

This module owns the Prometheus side of the end-to-end checks: finding the binary (skip with a
reason where it is not installed, fail under CI where it must be), a free port, a temporary config
and data directory, a 1 s scrape and rule-evaluation interval, waiting until ready and until the
targets have been scraped, stopping, and the HTTP API calls the tests need (instant queries, label
values, rule state).  It does not know what it scrapes: targets are ``{job name: URL}``.

    with running_prometheus({"spectest": "http://127.0.0.1:8000/metrics"}, tmp_path) as prom:
        prom.wait_for_scrapes(5)
        prom.query('sum(rate(spectest:generation_tokens_total[30s]))')
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Mapping, Sequence

import pytest
import yaml

from spectest.procs import free_port


class PromQLError(Exception):
    """Prometheus refused a query (parse error, bad data, execution error)."""

    def __init__(self, expr: str, error_type: str, message: str):
        super().__init__(f"{error_type}: {message} — in {expr}")
        self.expr, self.error_type, self.message = expr, error_type, message


def prometheus_binary(name: str = "prometheus") -> str:
    """Path to ``prometheus`` / ``promtool``; skip (fail under CI) where it is not installed."""
    path = os.environ.get(f"SPECTEST_{name.upper()}") or shutil.which(name)
    if path is None:
        msg = f"{name} not found: run scripts/install_prometheus.sh (Debian package prometheus)"
        if os.environ.get("CI"):
            pytest.fail(msg)
        pytest.skip(msg)
    return path


def _config(targets: Mapping[str, str], rule_files: Sequence[Path], interval: str) -> dict:
    jobs = []
    for job, url in targets.items():
        parts = urllib.parse.urlsplit(url)
        jobs.append({"job_name": job, "scheme": parts.scheme or "http",
                     "metrics_path": parts.path or "/metrics",
                     "static_configs": [{"targets": [parts.netloc]}]})
    return {"global": {"scrape_interval": interval, "scrape_timeout": interval,
                       "evaluation_interval": interval},
            "rule_files": [str(Path(p).resolve()) for p in rule_files],
            "scrape_configs": jobs}


class Prometheus:
    """A running Prometheus process and its HTTP API."""

    def __init__(self, url: str, process: subprocess.Popen, log: Path):
        self.url, self.process, self.log = url, process, log

    def _get(self, path: str, params: Sequence[tuple[str, str]] = (), timeout: float = 10):
        query = urllib.parse.urlencode(list(params))
        try:
            with urllib.request.urlopen(f"{self.url}{path}?{query}", timeout=timeout) as resp:
                return json.load(resp)
        except urllib.error.HTTPError as err:  # 4xx/5xx bodies carry the error JSON
            body = err.read()
            try:
                return json.loads(body)
            except ValueError:
                raise RuntimeError(f"GET {path}: HTTP {err.code}: {body[:200]!r}") from None

    def query(self, expr: str, at: float | None = None) -> list[dict]:
        """Instant query; the result as a list of ``{"metric": {...}, "value": float}``."""
        params = [("query", expr)] + ([("time", f"{at:.3f}")] if at is not None else [])
        body = self._get("/api/v1/query", params)
        if body.get("status") != "success":
            raise PromQLError(expr, body.get("errorType", "?"), body.get("error", "?"))
        data = body["data"]
        if data["resultType"] in ("scalar", "string"):
            return [{"metric": {}, "value": float(data["result"][1])}]
        return [{"metric": r["metric"], "value": float(r["value"][1])} for r in data["result"]]

    def query_range(self, expr: str, start: float, end: float, step: float) -> list[dict]:
        """Range query; ``{"metric": {...}, "values": [(t, v), ...]}`` per series."""
        body = self._get("/api/v1/query_range", [("query", expr), ("start", f"{start:.3f}"),
                                                  ("end", f"{end:.3f}"), ("step", f"{step}")])
        if body.get("status") != "success":
            raise PromQLError(expr, body.get("errorType", "?"), body.get("error", "?"))
        return [{"metric": r["metric"], "values": [(float(t), float(v)) for t, v in r["values"]]}
                for r in body["data"]["result"]]

    def label_values(self, label: str, match: str) -> list[str]:
        body = self._get(f"/api/v1/label/{urllib.parse.quote(label)}/values",
                         [("match[]", match)])
        if body.get("status") != "success":
            raise PromQLError(match, body.get("errorType", "?"), body.get("error", "?"))
        return body["data"]

    def rules(self) -> list[dict]:
        """Every loaded rule with its group name, health, lastError and evaluation time."""
        groups = self._get("/api/v1/rules")["data"]["groups"]
        return [{**rule, "group": g["name"]} for g in groups for rule in g["rules"]]

    def wait_for_scrapes(self, n: int, timeout: float = 60) -> None:
        """Block until every target is up and has been scraped at least ``n`` times."""
        expr = f"min(count_over_time(up[5m])) >= {n} and min(up) == 1"
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.query(expr):
                return
            time.sleep(0.25)
        targets = self._get("/api/v1/targets")["data"]["activeTargets"]
        errors = {t["labels"]["job"]: (t["health"], t["lastError"]) for t in targets}
        raise TimeoutError(f"targets not scraped {n} times within {timeout}s: {errors}")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=5)


def _wait_ready(prom: Prometheus, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if prom.process.poll() is not None:
            break
        try:
            with urllib.request.urlopen(f"{prom.url}/-/ready", timeout=2) as resp:
                if resp.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        time.sleep(0.1)
    tail = prom.log.read_text(errors="replace")[-2000:] if prom.log.exists() else ""
    prom.stop()
    raise RuntimeError(f"prometheus did not become ready within {timeout}s:\n{tail}")


@contextmanager
def running_prometheus(targets: Mapping[str, str], workdir: Path, *,
                       rule_files: Sequence[Path] = (), interval: str = "1s",
                       ready_timeout: float = 30) -> Iterator[Prometheus]:
    """Start Prometheus on 127.0.0.1 (free port, data in ``workdir``), yield it, stop it."""
    binary = prometheus_binary()
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    config = workdir / "prometheus.yml"
    config.write_text(yaml.safe_dump(_config(targets, rule_files, interval)))
    port = free_port()
    log = workdir / "prometheus.log"
    with open(log, "wb") as log_fh:
        process = subprocess.Popen(
            [binary, f"--config.file={config}", f"--storage.tsdb.path={workdir / 'data'}",
             f"--web.listen-address=127.0.0.1:{port}", "--storage.tsdb.retention.time=1h",
             "--log.level=warn"],
            cwd=workdir, stdout=log_fh, stderr=subprocess.STDOUT)
    prom = Prometheus(f"http://127.0.0.1:{port}", process, log)
    try:
        _wait_ready(prom, ready_timeout)
        yield prom
    finally:
        prom.stop()


def assert_panel_has_data(prom: "Prometheus", query, values: Mapping[str, str],
                          at: float | None = None) -> None:
    """A dashboard panel query, variables substituted, returns at least one finite sample
    (evaluated now, or at the instant ``at``)."""
    import math

    from dashboards.promql import substitute
    expr = substitute(query.expr, values)
    result = prom.query(expr, at=at)
    assert result, f"{query.dashboard} / {query.panel}: no data for {expr}"
    assert any(math.isfinite(r["value"]) for r in result), \
        f"{query.dashboard} / {query.panel}: only NaN/Inf for {expr}: {result}"
