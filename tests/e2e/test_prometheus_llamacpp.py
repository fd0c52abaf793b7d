"""A real Prometheus scrapes two real llama-servers — one speculative, one plain (``llama_pair``
in conftest.py) — every second while the official ``openai`` client sends a short, bounded load;
then every panel query of both llama.cpp dashboards returns data and every llama.cpp alert rule
parses, evaluates and is loaded healthy by Prometheus itself.

Panel queries are evaluated at the instant the load ended, with ``$__rate_interval`` = 10 s, so
the windows hold finished requests whatever the machine's speed (llama.cpp adds a request's
counts when the request finishes).  Skipped where llama-server or Prometheus is not installed,
failed instead under CI (``conftest._need``, ``prometheus_harness.prometheus_binary``).
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import openai
import pytest

from dashboards.build import build_dashboards
from dashboards.flavours import LLAMACPP
from dashboards.promql import (panel_queries, parse_label_values, rule_expressions, substitute,
                               variable_queries)
from dashboards.render import render_panels
from conftest import draft_spec
from prometheus_harness import assert_panel_has_data, running_prometheus

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "alerts" / "llamacpp.rules.yml"
BOARDS = {k: v for k, v in build_dashboards().items() if k.startswith(f"{LLAMACPP.key}-")}
PANEL_QUERIES = [q for board in BOARDS.values() for q in panel_queries(board)]
VARIABLE_QUERIES = [(board["uid"], var, query) for board in BOARDS.values()
                    for var, query in variable_queries(board).items()]
RULE_EXPRS = rule_expressions(RULES)
VALUES = {label: ".*" for label in LLAMACPP.variables}
VALUES |= {"__rate_interval": "10s", "__range": "15s"}
LOAD_SECONDS = 15
WORKERS_PER_SERVER = 2
JOBS = ("llama-spec", "llama-plain")

pytestmark = pytest.mark.timeout(240)


def _load(url: str, stop_at: float, worker: int, done: list, errors: list) -> None:
    i = 0
    while time.time() < stop_at:
        i += 1
        messages = [{"role": "user",
                     "content": f"List {3 + (worker + i) % 5} facts about the number {i}."}]
        # A client per request: llama-server closes the connection after a streamed response,
        # so a kept-alive one would fail the next request.
        with openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0,
                           timeout=60) as client:
            try:
                if i % 2:
                    stream = client.chat.completions.create(
                        model="smollm2", messages=messages, max_tokens=16, temperature=0,
                        stream=True)
                    text = "".join(c.choices[0].delta.content or "" for c in stream
                                   if c.choices)
                else:
                    text = client.chat.completions.create(
                        model="smollm2", messages=messages, max_tokens=16,
                        temperature=0).choices[0].message.content
                done.append(len(text))
            except openai.OpenAIError as err:
                errors.append(f"{url}: {err!r}")


@pytest.fixture(scope="module")
def loaded(llama_pair, tmp_path_factory):
    """(Prometheus, the instant the load ended, completed requests per job)."""
    spec_url, plain_url = llama_pair
    targets = {JOBS[0]: f"{spec_url}/metrics", JOBS[1]: f"{plain_url}/metrics"}
    with running_prometheus(targets, tmp_path_factory.mktemp("prom-llamacpp"),
                            rule_files=[RULES]) as prom:
        prom.wait_for_scrapes(2)
        stop_at = time.time() + LOAD_SECONDS
        done = {job: [] for job in JOBS}
        errors: list[str] = []
        threads = [threading.Thread(target=_load, args=(url, stop_at, w, done[job], errors))
                   for job, url in zip(JOBS, (spec_url, plain_url))
                   for w in range(WORKERS_PER_SERVER)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(90)
        ended = time.time()
        time.sleep(2.5)  # two more scrapes: the last finished requests reach Prometheus
        assert not errors, errors[:3]
        yield prom, ended, {job: len(v) for job, v in done.items()}


def test_load_was_served_and_scraped(loaded, smollm2_gguf):
    prom, ended, completed = loaded
    assert all(n >= 4 for n in completed.values()), completed
    assert prom.query('count({__name__=~"llamacpp_.+"})') == []  # colons survive the scrape
    drafts = {r["metric"]["job"]: r["value"] for r in
              prom.query("sum by (job) (llamacpp:spec_decode_num_drafts_total)", at=ended)}
    assert drafts[JOBS[0]] > 0 and drafts[JOBS[1]] == 0, drafts
    positions = prom.query("count(llamacpp:spec_decode_num_accepted_tokens_per_pos_total)")
    assert positions and positions[0]["value"] == draft_spec(smollm2_gguf).draft_max


@pytest.mark.parametrize("q", PANEL_QUERIES, ids=[f"{q.dashboard}:{q.panel}:{q.ref_id}"
                                                  for q in PANEL_QUERIES])
def test_every_llamacpp_panel_query_returns_data(loaded, q):
    prom, ended, _ = loaded
    assert_panel_has_data(prom, q, VALUES, at=ended)


@pytest.mark.parametrize("uid,var,query", VARIABLE_QUERIES,
                         ids=[f"{u}:{v}" for u, v, _ in VARIABLE_QUERIES])
def test_variable_query_offers_both_servers(loaded, uid, var, query):
    prom, _, _ = loaded
    selector, label = parse_label_values(substitute(query, VALUES))
    offered = prom.label_values(label, selector)
    assert len(offered) == 2 and (var != "job" or set(offered) == set(JOBS)), offered


@pytest.mark.parametrize("rule", RULE_EXPRS, ids=lambda r: r.name)
def test_every_llamacpp_alert_expression_evaluates(loaded, rule):
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
    assert prom.query('ALERTS{alertname="LlamacppMetricsAbsent"}') == []


def test_main_panels_render_to_png_from_the_same_data(loaded, tmp_path):
    """dashboards.render (the sweep report's panel PNG) draws llama.cpp's main panels."""
    prom, ended, _ = loaded
    out = tmp_path / "llamacpp.png"
    drawn = render_panels(prom.query_range, out, ended - LOAD_SECONDS, ended, LLAMACPP,
                          rate_window=VALUES["__rate_interval"])
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert len(drawn) >= 5 and all(drawn.values()), drawn
