"""Every metric a dashboard queries is in spectest/telemetry/names.py (scraped form: counters with
_total, histograms as _bucket/_sum/_count), or is a documented vllm: counterpart; and every
template variable reaches every query whose metric carries that label."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from dashboards.build import build_dashboards
from dashboards.flavours import FLAVOURS, SPECTEST, VLLM, VLLM_METRICS
from dashboards.promql import metric_names, panel_queries, variables_in
from spectest.telemetry import names

ROOT = Path(__file__).resolve().parents[2]
BOARDS = build_dashboards()
GRAFANA_BUILTINS = {"__rate_interval", "__range"}
_SELECTOR = re.compile(r"((?:spectest|vllm):[\w:]+)\{([^}]*)\}")


def sample_names(prefix: str, specs) -> dict[str, names.MetricSpec]:
    out = {}
    for spec in specs:
        base = names.renamed(spec, prefix)
        if spec.kind == "counter":
            out[base + "_total"] = spec
        elif spec.kind == "histogram":
            out.update({base + part: spec for part in ("_bucket", "_sum", "_count")})
        else:
            out[base] = spec
    return out


def flavour_of(file_name: str):
    return next(f for f in FLAVOURS if file_name.startswith(f.key + "-"))


@pytest.mark.parametrize("name", sorted(BOARDS))
def test_every_metric_is_in_the_table(name):
    flavour = flavour_of(name)
    allowed = sample_names(flavour.prefix, names.ALL if flavour is SPECTEST else VLLM_METRICS)
    used = set()
    for q in panel_queries(BOARDS[name]):
        found = metric_names(q.expr)
        assert found, f"{q.panel}: no metric in {q.expr}"
        assert found <= set(allowed), f"{q.panel}: unknown metrics {found - set(allowed)}"
        used |= found
    assert all(m.startswith(flavour.prefix) for m in used)


def test_vllm_counterparts_are_documented():
    readme = (ROOT / "dashboards" / "README.md").read_text()
    for spec in VLLM_METRICS:
        assert f"`{names.renamed(spec, VLLM.prefix)}`" in readme, spec.name


def test_vllm_dashboards_only_filter_on_vllm_labels():
    for name in ("vllm-serving.json", "vllm-speculative-decoding.json"):
        text = str([q.expr for q in panel_queries(BOARDS[name])])
        assert "drafter" not in text and "workload" not in text


@pytest.mark.parametrize("name", sorted(BOARDS))
def test_every_variable_is_defined_and_reaches_every_selector(name):
    flavour = flavour_of(name)
    defined = {v["name"] for v in BOARDS[name]["templating"]["list"]}
    specs = sample_names(flavour.prefix, names.ALL)
    for q in panel_queries(BOARDS[name]):
        assert variables_in(q.expr) <= defined | GRAFANA_BUILTINS, q.panel
        for metric, matchers in _SELECTOR.findall(q.expr):
            for label in flavour.variables:
                if label in flavour.labels_of(specs[metric]):
                    assert f'{label}=~"${label}"' in matchers, \
                        f"{q.panel}: {metric} ignores ${label}"
