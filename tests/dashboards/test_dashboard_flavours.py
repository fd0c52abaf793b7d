"""Selectors per server flavour (derived from spectest.flavours), and the PromQL text helpers the
checks rely on."""

from __future__ import annotations

import pytest

from dashboards.flavours import FLAVOURS, LLAMACPP, SPECTEST, VLLM, MissingMetric, for_server
from dashboards.panels import PanelSpec, Query, failed_share, rate, row, slo_share
from spectest import flavours
from dashboards.promql import (metric_names, parse_label_values, substitute, variables_in)
from spectest.telemetry import names


def test_spectest_selector_filters_on_the_labels_the_metric_has():
    assert SPECTEST.select(names.GENERATION_TOKENS) == (
        'spectest:generation_tokens_total{model_name=~"$model_name", drafter=~"$drafter", '
        'workload=~"$workload"}')
    # Engine gauges have no workload label, so the workload variable cannot filter them.
    assert SPECTEST.select(names.RUNNING) == (
        'spectest:num_requests_running{model_name=~"$model_name", drafter=~"$drafter"}')


def test_vllm_selector_uses_vllm_names_and_labels():
    assert VLLM.select(names.TTFT, "_bucket", le="0.5") == (
        'vllm:time_to_first_token_seconds_bucket{model_name=~"$model_name", le="0.5"}')
    assert VLLM.labels_of(names.SPEC_NUM_ACCEPTED_PER_POS) == ("model_name", "engine", "position")
    with pytest.raises(KeyError):
        VLLM.metric(names.SPEC_K)  # vLLM has no K gauge


def test_llamacpp_selector_uses_its_own_names_and_the_scrape_labels():
    assert LLAMACPP.select(names.GENERATION_TOKENS) == (
        'llamacpp:tokens_predicted_total{job=~"$job", instance=~"$instance"}')
    assert LLAMACPP.select(names.WAITING) == (
        'llamacpp:requests_deferred{job=~"$job", instance=~"$instance"}')
    assert LLAMACPP.select("prompt_tokens_cached") == (
        'llamacpp:prompt_tokens_cached_total{job=~"$job", instance=~"$instance"}')
    assert LLAMACPP.labels_of(names.SPEC_NUM_ACCEPTED_PER_POS) == ("position",)
    assert LLAMACPP.labels_of(names.RUNNING) == ()
    with pytest.raises(MissingMetric):
        LLAMACPP.metric(names.TTFT)  # no histograms
    with pytest.raises(MissingMetric):
        SPECTEST.select("busy_slots_per_decode")  # a llama.cpp extra


def test_flavours_are_the_rows_of_the_one_table():
    """Names come from spectest.flavours; dashboards add only variables and series_by."""
    for f in FLAVOURS:
        assert f.server is flavours.get(f.key)
        for spec in names.ALL:
            if f.has(spec):
                assert f.metric(spec, "_count" if spec.kind == "histogram" else "") \
                    .startswith(f.server.samples[spec.name])
    assert {f.key for f in FLAVOURS} == {"spectest", "vllm", "llamacpp"}
    assert (SPECTEST.variables, SPECTEST.series_by) == (("model_name", "drafter", "workload"),
                                                        ("model_name", "drafter"))
    assert (LLAMACPP.variables, LLAMACPP.series_by) == (("job", "instance"), ("job", "instance"))


def test_a_new_row_needs_only_its_deployment_labels():
    """A server added to spectest.flavours gets dashboards from its row alone."""
    row_ = flavours.Flavour(key="newsrv", display="New", prefix="new:",
                            samples={names.GENERATION_TOKENS.name: "new:gen_total"},
                            deployment_labels=("instance",))
    f = for_server(row_)
    assert rate(f, names.GENERATION_TOKENS) == (
        'sum by (instance) (rate(new:gen_total{instance=~"$instance"}[$__rate_interval]))')


def test_row_leaves_out_panels_whose_metric_is_missing():
    panel = lambda spec: lambda: PanelSpec(spec.name, "Healthy.", "short",  # noqa: E731
                                           (Query(rate(LLAMACPP, spec)),))
    kept = row("r", panel(names.GENERATION_TOKENS), panel(names.PREEMPTIONS),
               panel(names.PROMPT_TOKENS))
    assert [p.title for p in kept.panels] == [names.GENERATION_TOKENS.name,
                                              names.PROMPT_TOKENS.name]
    assert {p.width for p in kept.panels} == {12}
    assert row("r", panel(names.TTFT)) is None


def test_selector_rejects_wrong_parts_and_labels():
    with pytest.raises(ValueError):
        SPECTEST.metric(names.TTFT)  # a histogram needs _bucket/_sum/_count
    with pytest.raises(ValueError):
        SPECTEST.metric(names.RUNNING, "_sum")
    with pytest.raises(ValueError):
        SPECTEST.select(names.RUNNING, workload="chat")


def test_match_operators():
    sel = SPECTEST.select(names.REQUEST_SUCCESS, finished_reason="!~stop|length")
    assert 'finished_reason!~"stop|length"' in sel
    assert 'code=~"5.."' in SPECTEST.select(names.REQUEST_ERRORS, code="=~5..")


def test_slo_share_writes_le_as_the_client_exposes_it():
    assert 'le="1.0"' in slo_share(SPECTEST, names.TTFT, 1)
    assert 'le="0.1"' in slo_share(SPECTEST, names.TPOT, 0.1)


def test_failed_share_reads_zero_without_failures():
    # "(failed or total * 0) / total": no failure series still gives a 0 per deployment.
    expr = failed_share(VLLM)
    assert expr.startswith("(sum by (model_name) (") and " or sum by (model_name) (" in expr
    assert expr.count("* 0) /") == 1


def test_variable_query_chains_on_earlier_variables():
    assert SPECTEST.variable_query("model_name") == (
        "label_values(spectest:generation_tokens_total, model_name)")
    assert SPECTEST.variable_query("workload") == (
        'label_values(spectest:generation_tokens_total{model_name=~"$model_name", '
        'drafter=~"$drafter"}, workload)')


def test_substitute_and_variables():
    expr = 'rate(x{a=~"$a", b=~"${b}", c=~"[[c]]", d=~"${d:regex}"}[$__rate_interval])'
    assert variables_in(expr) == {"a", "b", "c", "d", "__rate_interval"}
    values = {"a": "1", "b": "2", "c": "3", "d": "4", "__rate_interval": "30s"}
    assert substitute(expr, values) == 'rate(x{a=~"1", b=~"2", c=~"3", d=~"4"}[30s])'
    with pytest.raises(KeyError, match=r"\$a"):
        substitute(expr, {})


def test_metric_names_and_label_values():
    expr = 'sum(rate(spectest:a_total[1m])) / on() vllm:b_bucket{le="0.5"} + up{job="spectest"}'
    assert metric_names(expr) == {"spectest:a_total", "vllm:b_bucket"}
    assert parse_label_values('label_values(m{a=~"$a"}, drafter)') == ('m{a=~"$a"}', "drafter")
    with pytest.raises(ValueError):
        parse_label_values("query_result(up)")
