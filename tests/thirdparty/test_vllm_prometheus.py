"""A real Prometheus scrapes three real vLLM servers — plain, n-gram and draft-model — every
second while the official ``openai`` client sends a short, bounded load to each; then every panel
query of both vLLM dashboards returns data, every template variable offers the three servers, and
every vLLM alert rule parses, evaluates and is loaded healthy by Prometheus itself. The synthetic
exporter (``tests/e2e/synthetic_exporter.py``) stays for the unit tests; this is the real thing.

Panel queries are evaluated at the instant the load ended with ``$__rate_interval`` = 10 s.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import openai
import pytest

from dashboards.build import build_dashboards
from dashboards.flavours import VLLM
from dashboards.promql import (panel_queries, parse_label_values, rule_expressions, substitute,
                               variable_queries)
from tests.e2e.prometheus_harness import assert_panel_has_data, running_prometheus

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "alerts" / "vllm.rules.yml"
BOARDS = {k: v for k, v in build_dashboards().items() if k.startswith(f"{VLLM.key}-")}
PANEL_QUERIES = [q for board in BOARDS.values() for q in panel_queries(board)]
VARIABLE_QUERIES = [(board["uid"], var, query) for board in BOARDS.values()
                    for var, query in variable_queries(board).items()]
RULE_EXPRS = rule_expressions(RULES)
VALUES = {label: ".*" for label in VLLM.variables}
VALUES |= {"__rate_interval": "10s", "__range": "15s"}
LOAD_SECONDS = 15
JOBS = ("vllm-plain", "vllm-ngram", "vllm-draft")

pytestmark = pytest.mark.timeout(300)


def _load(url: str, stop_at: float, worker: int, done: list, errors: list) -> None:
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0, timeout=60)
    model = client.models.list().data[0].id
    i = 0
    while time.time() < stop_at:
        i += 1
        messages = [{"role": "user",
                     "content": f"List {3 + (worker + i) % 5} facts about the number {i}."}]
        try:
            if i % 2:
                stream = client.chat.completions.create(
                    model=model, messages=messages, max_tokens=24, temperature=0, stream=True)
                text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
            else:
                text = client.chat.completions.create(
                    model=model, messages=messages, max_tokens=24,
                    temperature=0).choices[0].message.content
            done.append(len(text))
        except openai.OpenAIError as err:
            errors.append(f"{url}: {err!r}")


@pytest.fixture(scope="module")
def loaded(vllm, tmp_path_factory):
    """(Prometheus, the instant the load ended, completed requests per job)."""
    urls = dict(zip(JOBS, (vllm.plain, vllm.ngram, vllm.draft)))
    targets = {job: f"{url}/metrics" for job, url in urls.items()}
    with running_prometheus(targets, tmp_path_factory.mktemp("prom-vllm"),
                            rule_files=[RULES]) as prom:
        prom.wait_for_scrapes(2)
        stop_at = time.time() + LOAD_SECONDS
        done = {job: [] for job in JOBS}
        errors: list[str] = []
        threads = [threading.Thread(target=_load, args=(url, stop_at, w, done[job], errors))
                   for job, url in urls.items() for w in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        ended = time.time()
        time.sleep(2.5)  # two more scrapes
        assert not errors, errors[:3]
        yield prom, ended, {job: len(v) for job, v in done.items()}


def test_load_was_served_and_scraped(loaded):
    prom, ended, completed = loaded
    assert all(n >= 3 for n in completed.values()), completed
    assert prom.query('count({__name__=~"vllm_.+"})') == []  # colons survive the scrape
    drafts = {r["metric"]["job"]: r["value"] for r in
              prom.query("sum by (job) (vllm:spec_decode_num_drafts_total)", at=ended)}
    assert drafts.get("vllm-ngram", 0) > 0 and drafts.get("vllm-draft", 0) > 0, drafts
    assert "vllm-plain" not in drafts  # a plain server has no speculative counters at all


@pytest.mark.parametrize("q", PANEL_QUERIES, ids=[f"{q.dashboard}:{q.panel}:{q.ref_id}"
                                                  for q in PANEL_QUERIES])
def test_every_vllm_panel_query_returns_data(loaded, q):
    prom, ended, _ = loaded
    assert_panel_has_data(prom, q, VALUES, at=ended)


@pytest.mark.parametrize("uid,var,query", VARIABLE_QUERIES,
                         ids=[f"{u}:{v}" for u, v, _ in VARIABLE_QUERIES])
def test_variable_query_offers_the_servers(loaded, uid, var, query):
    prom, _, _ = loaded
    selector, label = parse_label_values(substitute(query, VALUES))
    offered = set(prom.label_values(label, selector))
    assert {"embedded-ngram", "embedded-dm"} <= offered, offered


@pytest.mark.parametrize("rule", RULE_EXPRS, ids=lambda r: r.name)
def test_every_vllm_alert_expression_evaluates(loaded, rule):
    prom, _, _ = loaded
    prom.query(rule.expr)  # raises PromQLError on a parse or evaluation error


def test_prometheus_loads_every_rule_healthy_and_nothing_is_absent(loaded):
    prom, _, _ = loaded
    deadline = time.monotonic() + 20
    while True:
        loaded_rules = {r["name"]: r for r in prom.rules()}
        if all(not r["lastEvaluation"].startswith("0001") for r in loaded_rules.values()) \
                or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert set(loaded_rules) == {r.name for r in RULE_EXPRS}
    for name, rule in loaded_rules.items():
        assert rule["health"] == "ok" and not rule.get("lastError"), (name, rule)
    assert prom.query('ALERTS{alertname="VllmMetricsAbsent"}') == []
