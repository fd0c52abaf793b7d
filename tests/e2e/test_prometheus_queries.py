"""A real Prometheus, scraping a live target every second, evaluates every PromQL expression of
every dashboard panel and every alert rule through its HTTP API: each parses, each panel query
and template-variable query returns data, and Prometheus itself loads and evaluates every rule.

The target is ``metrics_targets`` below: the synthetic exporter (every metric of the names table,
plus the vLLM counterparts); set ``SPECTEST_E2E_TARGET`` to the ``/metrics`` URL of a
``spectest serve`` under load to check the spectest dashboards against the real server instead.
The llama.cpp dashboards and rules are checked against real llama-servers
(``test_prometheus_llamacpp.py``): its extra series are not in the names table.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from dashboards.build import build_dashboards
from dashboards.flavours import SPECTEST, VLLM
from dashboards.promql import (panel_queries, parse_label_values, rule_expressions, substitute,
                               variable_queries)
from dashboards.render import render_panels
from prometheus_harness import PromQLError, assert_panel_has_data, running_prometheus
from synthetic_exporter import SyntheticExporter

ROOT = Path(__file__).resolve().parents[2]
FLAVOURS = (SPECTEST, VLLM)  # what the synthetic exporter simulates
RULE_FILES = [ROOT / "alerts" / f"{f.key}.rules.yml" for f in FLAVOURS]
BOARDS = {k: v for k, v in build_dashboards().items()
          if k.split("-", 1)[0] in {f.key for f in FLAVOURS}}
SCRAPES = 8  # scrapes of every target before the first query (1 s apart)

# Grafana variables → values a plain Prometheus accepts: "All" for every label variable.
VALUES = {label: ".*" for f in FLAVOURS for label in f.variables}
VALUES |= {"__rate_interval": "30s", "__range": "1m"}

PANEL_QUERIES = [q for board in BOARDS.values() for q in panel_queries(board)]
VARIABLE_QUERIES = [(board["uid"], var, query) for board in BOARDS.values()
                    for var, query in variable_queries(board).items()]
RULE_EXPRS = [r for path in RULE_FILES for r in rule_expressions(path)]

pytestmark = pytest.mark.timeout(180)  # the whole module takes ~20 s; never hang CI


@pytest.fixture(scope="module")
def metrics_targets():
    """``{job: /metrics URL}`` to scrape; the parameter the real server will replace."""
    real = os.environ.get("SPECTEST_E2E_TARGET")
    with SyntheticExporter(FLAVOURS) as exporter:
        targets = dict(exporter.urls)
        if real:
            targets["spectest"] = real
        yield targets


@pytest.fixture(scope="module")
def prom(metrics_targets, tmp_path_factory):
    with running_prometheus(metrics_targets, tmp_path_factory.mktemp("prometheus"),
                            rule_files=RULE_FILES) as prometheus:
        prometheus.wait_for_scrapes(SCRAPES)
        yield prometheus


def test_metric_names_survive_the_scrape(prom):
    """Colons must reach Prometheus intact.  prometheus_client 0.26 rewrites ``spectest:x`` to
    ``spectest_x`` in OpenMetrics sample lines (client_python#1177), which Prometheus 2.x
    negotiates by default: a target must answer /metrics in text format 0.0.4."""
    mangled = prom.query('count by (job) ({__name__=~"(spectest|vllm)_.+"})')
    assert mangled == [], f"targets exposing underscore-mangled names: {mangled}"
    assert prom.query('count({__name__=~"spectest:.+"})'), "no spectest: series scraped"


@pytest.mark.parametrize("q", PANEL_QUERIES, ids=[f"{q.dashboard}:{q.panel}:{q.ref_id}"
                                                  for q in PANEL_QUERIES])
def test_panel_query_returns_data(prom, q):
    assert_panel_has_data(prom, q, VALUES)


@pytest.mark.parametrize("uid,var,query", VARIABLE_QUERIES,
                         ids=[f"{u}:{v}" for u, v, _ in VARIABLE_QUERIES])
def test_variable_query_returns_values(prom, uid, var, query):
    selector, label = parse_label_values(substitute(query, VALUES))
    assert label == var
    assert prom.label_values(label, selector), f"{uid}: ${var} would offer no values"


@pytest.mark.parametrize("rule", RULE_EXPRS, ids=[r.name for r in RULE_EXPRS])
def test_rule_expression_parses_and_evaluates(prom, rule):
    prom.query(rule.expr)  # raises PromQLError on a parse or execution error


def test_prometheus_loads_and_evaluates_every_rule(prom):
    deadline = time.monotonic() + 20
    while True:
        loaded = {r["name"]: r for r in prom.rules()}
        evaluated = all(not r["lastEvaluation"].startswith("0001") for r in loaded.values())
        if evaluated or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert set(loaded) == {r.name for r in RULE_EXPRS}
    for name, rule in loaded.items():
        assert rule["health"] == "ok" and not rule.get("lastError"), (name, rule)


def test_acceptance_alert_catches_the_bad_drafter(prom):
    """The synthetic ngram drafter accepts ~14%; the healthy one ~76%.  Prometheus's own rule
    evaluation must put exactly the ngram deployment into pending (for: 10m)."""
    deadline = time.monotonic() + 30
    while True:
        alerts = prom.query('ALERTS{alertname="SpecDecodeAcceptanceRateLow"}')
        if alerts or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert {a["metric"]["drafter"] for a in alerts} == {"ngram"}
    assert {a["metric"]["alertstate"] for a in alerts} == {"pending"}
    assert prom.query('ALERTS{alertname="SpectestMetricsAbsent"}') == []


def test_harness_reports_parse_errors_and_missing_data(prom):
    with pytest.raises(PromQLError) as err:
        prom.query("sum(rate(spectest:generation_tokens_total[30s])")
    assert err.value.error_type == "bad_data"
    assert prom.query("spectest:no_such_metric_total") == []


def test_main_panels_render_to_png_from_the_same_data(prom, tmp_path):
    """dashboards.render draws the main panels from this Prometheus, with the dashboards' PromQL."""
    end = time.time()
    for flavour in FLAVOURS:
        out = tmp_path / f"{flavour.key}.png"
        drawn = render_panels(prom.query_range, out, end - 30, end, flavour, rate_window="5s")
        assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert len(drawn) >= 6 and all(drawn.values()), drawn
