"""A real Prometheus scrapes the real bundled server (`spectest serve`) while a short load runs;
then every PromQL expression of every spectest dashboard panel returns data and every alert
rule parses and evaluates — through Prometheus's HTTP API, on loopback, bounded in time.

(``test_prometheus_queries.py`` covers the vLLM-flavoured dashboards with a synthetic exporter,
since no vLLM server can run here.)
"""

from __future__ import annotations

import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import requests

from dashboards.build import build_dashboards
from dashboards.flavours import FLAVOURS
from dashboards.promql import panel_queries, rule_expressions
from prometheus_harness import assert_panel_has_data, running_prometheus

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "alerts" / "spectest.rules.yml"
BOARDS = {k: v for k, v in build_dashboards().items() if k.startswith("spectest")}
PANEL_QUERIES = [q for board in BOARDS.values() for q in panel_queries(board)]
VALUES = {label: ".*" for f in FLAVOURS for label in f.variables}
VALUES |= {"__rate_interval": "30s", "__range": "1m"}
LOAD_SECONDS = 14

pytestmark = pytest.mark.timeout(240)


@pytest.fixture(scope="module")
def server():
    proc = subprocess.Popen([sys.executable, "-m", "spectest", "serve", "--port", "0",
                             "--threads", "1", "--max-num-seqs", "4"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = None
    deadline = time.time() + 90
    while time.time() < deadline and url is None:
        line = proc.stdout.readline()
        match = re.search(r"(http://127\.0\.0\.1:\d+)", line or "")
        if match:
            url = match.group(1)
        elif proc.poll() is not None:
            break
    if url is None:
        proc.kill()
        pytest.fail("spectest serve did not start")
    threading.Thread(target=proc.stdout.read, daemon=True).start()  # drain the pipe
    yield url
    proc.terminate()
    proc.wait(20)


def _load(url: str, stop: float, worker: int) -> None:
    session = requests.Session()
    workloads = ("chat", "code", "rag")
    i = 0
    while time.time() < stop:
        i += 1
        headers = {"X-Spectest-Workload": workloads[(worker + i) % 3]}
        body = {"model": "spectest-demo", "max_tokens": 24, "temperature": 0,
                "messages": [{"role": "user", "content": f"Explain list number {i}."}],
                "stream": True, "stream_options": {"include_usage": True},
                "speculative": i % 4 != 0}
        with session.post(f"{url}/v1/chat/completions", json=body, headers=headers,
                          stream=True, timeout=30) as resp:
            for _ in resp.iter_lines():
                pass
        if i % 5 == 0:  # some refused requests, for the error panels
            session.post(f"{url}/v1/completions", json={"model": "nope", "prompt": "x"})


@pytest.fixture(scope="module")
def prom(server, tmp_path_factory):
    target = {"spectest": f"{server}/metrics"}
    with running_prometheus(target, tmp_path_factory.mktemp("prom-bundled"),
                            rule_files=[RULES]) as prometheus:
        stop = time.time() + LOAD_SECONDS
        workers = [threading.Thread(target=_load, args=(server, stop, w)) for w in range(3)]
        for w in workers:
            w.start()
        for w in workers:
            w.join(60)
        prometheus.wait_for_scrapes(2)
        yield prometheus


def test_real_server_metrics_reach_prometheus(prom):
    assert prom.query('sum(spectest:spec_decode_num_drafts_total) > 0')
    assert prom.query('count({__name__=~"spectest_.+"})') == []  # colons survive the scrape


@pytest.mark.parametrize("q", PANEL_QUERIES, ids=[f"{q.dashboard}:{q.panel}:{q.ref_id}"
                                                  for q in PANEL_QUERIES])
def test_every_spectest_panel_query_returns_data(prom, q):
    assert_panel_has_data(prom, q, VALUES)


@pytest.mark.parametrize("rule", rule_expressions(RULES), ids=lambda r: r.name)
def test_every_alert_expression_evaluates(prom, rule):
    prom.query(rule.expr)  # raises PromQLError on a parse or evaluation error
