"""Every metric a dashboard queries is one its flavour's row in spectest/flavours.py exposes
(the names table's metrics under that server's sample names — counters with _total, histograms
as _bucket/_sum/_count — or one of its extra series); the vLLM and llama.cpp names are
documented; and every template variable reaches every query whose metric carries that label."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from dashboards.build import build_dashboards
from dashboards.flavours import BY_KEY, LLAMACPP, SCRAPE_LABELS, VLLM
from dashboards.promql import PREFIXES, metric_names, panel_queries, variables_in
from spectest.telemetry import names

ROOT = Path(__file__).resolve().parents[2]
BOARDS = build_dashboards()
GRAFANA_BUILTINS = {"__rate_interval", "__range"}
_SELECTOR = re.compile(r"((?:%s)[\w:]+)\{([^}]*)\}" % "|".join(map(re.escape, PREFIXES)))


def flavour_of(file_name: str):
    return BY_KEY[file_name.split("-", 1)[0]]


def labels_of_sample(flavour, sample: str) -> tuple[str, ...]:
    """The server's own labels on a scraped series (extras have none)."""
    for spec in names.ALL:
        if flavour.has(spec) and sample.startswith(flavour.server.samples[spec.name]):
            return flavour.labels_of(spec)
    assert sample in flavour.server.extras.values(), sample
    return ()


@pytest.mark.parametrize("name", sorted(BOARDS))
def test_every_metric_is_in_the_table(name):
    flavour = flavour_of(name)
    allowed = flavour.sample_names()
    used = set()
    for q in panel_queries(BOARDS[name]):
        found = metric_names(q.expr)
        assert found, f"{q.panel}: no metric in {q.expr}"
        assert found <= set(allowed), f"{q.panel}: unknown metrics {found - set(allowed)}"
        used |= found
    assert all(m.startswith(flavour.prefix) for m in used)


@pytest.mark.parametrize("flavour", [VLLM, LLAMACPP], ids=lambda f: f.key)
def test_server_names_are_documented(flavour):
    readme = (ROOT / "dashboards" / "README.md").read_text()
    for sample in flavour.sample_names():
        base = sample.removesuffix("_total")
        for part in ("_bucket", "_sum", "_count"):
            base = base.removesuffix(part)
        assert f"`{base}`" in readme or f"`{sample}`" in readme, sample


def test_llamacpp_dashboards_filter_on_scrape_labels_only():
    for name in ("llamacpp-serving.json", "llamacpp-speculative-decoding.json"):
        for q in panel_queries(BOARDS[name]):
            for _, matchers in _SELECTOR.findall(q.expr):
                used = {m.split("=")[0].split("!")[0].strip() for m in matchers.split(",") if m}
                assert used <= set(SCRAPE_LABELS) | {"position"}, (q.panel, used)


def test_vllm_dashboards_only_filter_on_vllm_labels():
    for name in ("vllm-serving.json", "vllm-speculative-decoding.json"):
        text = str([q.expr for q in panel_queries(BOARDS[name])])
        assert "drafter" not in text and "workload" not in text


@pytest.mark.parametrize("name", sorted(BOARDS))
def test_every_variable_is_defined_and_reaches_every_selector(name):
    flavour = flavour_of(name)
    defined = {v["name"] for v in BOARDS[name]["templating"]["list"]}
    for q in panel_queries(BOARDS[name]):
        assert variables_in(q.expr) <= defined | GRAFANA_BUILTINS, q.panel
        for metric, matchers in _SELECTOR.findall(q.expr):
            for label in flavour.variables:
                if label in labels_of_sample(flavour, metric) + SCRAPE_LABELS:
                    assert f'{label}=~"${label}"' in matchers, \
                        f"{q.panel}: {metric} ignores ${label}"
