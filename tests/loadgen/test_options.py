"""The spectest flags, parsed by Locust's own parser."""

import pytest
from locust.argument_parser import get_parser

from spectest.loadgen import options


def parse(*argv):
    parser = get_parser()
    options.add_arguments(parser)
    return options.SpecOptions.from_parsed(parser.parse_args(["-f", "x.py", *argv]))


def test_defaults():
    o = parse()
    assert o.speculative is None and o.speculative_label == "default"
    assert o.steps == () and o.request_rates == () and o.max_tokens == 0


def test_ab_alternates_the_switch_request_by_request():
    o = parse("--speculative", "ab")
    assert o.alternate and o.speculative is None and o.speculative_label == "ab"
    assert not parse("--speculative", "on").alternate


def test_flags_are_kebab_case_and_parsed():
    o = parse("--spectest-model", "m", "--max-tokens", "64", "--temperature", "0.7",
              "--speculative", "off", "--dataset", "rag", "--seed", "3", "--steps", "1, 2,4",
              "--step-time", "10", "--slo-ttft-ms", "200", "--extra-body", '{"ignore_eos": true}')
    assert (o.model, o.max_tokens, o.temperature, o.speculative, o.dataset, o.seed) == \
        ("m", 64, 0.7, False, "rag", 3)
    assert o.steps == (1, 2, 4) and o.step_time == 10 and o.slo_ttft_ms == 200
    assert dict(o.extra_body) == {"ignore_eos": True}


@pytest.mark.parametrize("argv, needle", [
    (("--steps", "1,x"), "comma-separated"),
    (("--steps", "1.5"), "whole numbers"),
    (("--steps", "1", "--request-rates", "2"), "not both"),
    (("--request-rates", "0"), "positive"),
    (("--extra-body", "[1]"), "JSON object"),
    (("--extra-body", "{"), "not valid JSON"),
    (("--max-tokens", "-1"), ">= 0"),
    (("--max-prompt-chars", "-1"), ">= 0"),
])
def test_bad_values_give_one_readable_line(argv, needle):
    with pytest.raises(options.OptionsError, match=needle) as e:
        parse(*argv)
    assert "\n" not in str(e.value)


def test_goodput_counts_requests_meeting_every_slo():
    o = parse("--slo-ttft-ms", "100", "--slo-tpot-ms", "10")
    assert o.slo_ok(0.05, 0.009, 1.0)
    assert not o.slo_ok(0.15, 0.009, 1.0)
    assert not o.slo_ok(0.05, 0.011, 1.0)
    assert o.slo_ok(0.05, None, 0.05)  # a one-token answer has no TPOT
    assert parse().slo_ok(9.0, 9.0, 9.0)  # no SLO given: everything counts


def test_flags_also_come_from_locust_environment_variables(monkeypatch):
    monkeypatch.setenv("LOCUST_STEPS", "2,4")
    monkeypatch.setenv("LOCUST_SPECULATIVE", "on")
    o = parse()
    assert o.steps == (2, 4) and o.speculative is True
