"""Cost per 1M output tokens, replicas and speculation's saving on a hand-made step table.

SLO: TPOT p99 ≤ 50 ms. Goodput tokens/s (per replica) and TPOT p99 per step, 50 requests each
unless marked, log standard error 0.05 everywhere:

    base  c=1: 100 tok/s, 20 ms   c=2: 180, 30 ms   c=4: 300, 80 ms (misses the SLO)
    spec  c=1: 250, 10 ms         c=2: 400, 20 ms   c=4: 420, 40 ms   c=8: 900, 45 ms (5 requests)

So the baseline's cheapest operating point is c=2 and speculation's c=4 (c=8 has too few
requests). At 2.50/h (base) and 2.75/h (spec): base 2.5e6 / (180·3600) = 3.858 per 1M tokens,
spec 2.75e6 / (420·3600) = 1.819; saving 1 − (2.75·180)/(2.5·420) = 1 − 495/1050 = 52.86 %.
For 1000 output tokens/s: ceil(1000/180) = 6 base replicas (15.00/h), ceil(1000/420) = 3 spec
(8.25/h).
"""

import argparse
import math

import pandas as pd
import pytest
from report_synthetic import write_sweep  # tests/report is on sys.path (pytest prepend)

from spectest.report import cost
from spectest.report import evidence as ev
from spectest.report.cli import add_report_arguments, report_main
from spectest.report.cost_section import cost_lines
from spectest.report.table import SLO

SLO_50 = SLO(tpot_p99_ms=50)
STEPS = {"base": [(1, 100, 20, 50), (2, 180, 30, 50), (4, 300, 80, 50)],
         "spec": [(1, 250, 10, 50), (2, 400, 20, 50), (4, 420, 40, 50), (8, 900, 45, 5)]}
PRICED = cost.CostInputs(price_per_hour=2.5, spec_price_per_hour=2.75, target_output_tps=1000)


def table() -> pd.DataFrame:
    rows = []
    for arm, steps in STEPS.items():
        for c, g, p99, n in steps:
            rows.append({"workload": "chat", "arm": arm, "concurrency": c, "requests": n,
                         "failures": 0, "error_rate": 0.0, "tpot_p99_ms": p99,
                         "goodput_tokens_per_s": g, "goodput_tokens_per_s_log_se": 0.05,
                         "goodput_rps": g / 100, "duration_s": 60.0})
    return pd.DataFrame(rows)


def test_cost_per_million_tokens_cheapest_point_replicas_and_saving():
    (wc,) = cost.analyse(table(), SLO_50, PRICED, ["chat"])
    base, spec = wc.plans["base"], wc.plans["spec"]
    assert base.cheapest.concurrency == 2 and spec.cheapest.concurrency == 4
    assert base.cheapest.cost == pytest.approx(2.5e6 / (180 * 3600))
    assert spec.cheapest.cost == pytest.approx(2.75e6 / (420 * 3600))
    assert (base.replicas, spec.replicas) == (6, 3)
    assert (base.fleet_per_hour, spec.fleet_per_hour) == pytest.approx((15.0, 8.25))
    # the goodput interval 180·e^(±1.96·0.05) = 163.2–198.5 tok/s allows 6 or 7 replicas
    assert base.replicas_range == (6, 7) and spec.replicas_range == (3, 3)
    sv = wc.saving
    assert sv.saving == pytest.approx(1 - 495 / 1050)
    half = ev.Z * math.hypot(0.05, 0.05)
    r = 1050 / 495
    assert sv.interval == pytest.approx((1 - 1 / (r * math.exp(-half)),
                                         1 - 1 / (r * math.exp(half))))
    assert (sv.ratio.n_spec, sv.ratio.n_base) == (50, 50) and sv.ratio.judgement == ev.AHEAD
    assert sv.fleet_saving_per_hour == pytest.approx(6.75) and sv.replicas == (3, 6)
    # every step is listed, with why it is not an operating point
    why = {(p.arm, p.concurrency): p.why_not() for p in base.points + spec.points}
    assert why[("base", 4)] == "misses tpot p99" and why[("spec", 8)] == "too few requests (n = 5)"
    lines = cost_lines([wc], PRICED)
    assert "speculation saves 53% per output token (n = 50 spec at c=4 / 50 base at c=2" in \
        lines[0]
    assert "for the target load 3 replicas vs 6, 6.75 per hour less with speculation" in lines[0]


def test_without_a_price_costs_are_replica_hours_and_the_ratio_still_stands():
    inputs = cost.CostInputs(target_rps=10)
    (wc,) = cost.analyse(table(), SLO_50, inputs, ["chat"])
    base, spec = wc.plans["base"], wc.plans["spec"]
    assert base.cheapest.cost == pytest.approx(1e6 / (180 * 3600))  # replica-hours per 1M
    assert wc.saving.saving == pytest.approx(1 - 180 / 420)
    assert (base.replicas, spec.replicas) == (math.ceil(10 / 1.8), math.ceil(10 / 4.2))
    assert base.fleet_per_hour is None
    text = " ".join(cost.assumptions(inputs, SLO_50, 20))
    assert "no price given" in text and "--price-per-hour" in text
    assert "one replica = the measured server" in text and "linear scale-out assumed" in text
    assert "fewer than 20 successful requests are excluded" in text


def test_a_price_per_arm_moves_the_saving():
    same = cost.CostInputs(price_per_hour=2.5)
    (wc,) = cost.analyse(table(), SLO_50, same, ["chat"])
    assert wc.saving.saving == pytest.approx(1 - 180 / 420)  # equal prices: goodput ratio
    dear = cost.CostInputs(price_per_hour=2.5, spec_price_per_hour=2.5 * 420 / 180)
    (wc,) = cost.analyse(table(), SLO_50, dear, ["chat"])
    assert wc.saving.saving == pytest.approx(0.0, abs=1e-12)
    assert wc.saving.ratio.judgement == ev.UNRESOLVED  # ±14 % interval around 1.0×


def test_no_operating_point_when_every_step_misses_the_slo():
    (wc,) = cost.analyse(table(), SLO(tpot_p99_ms=5), PRICED, ["chat"])
    assert wc.plans["base"].cheapest is None and wc.saving is None
    assert wc.plans["base"].reason == "no operating point meets the SLOs"
    assert wc.plans["spec"].reason == ("no operating point meets the SLOs (steps with too few "
                                       "requests excluded)")
    assert "no saving stated — speculation on: no operating point" in cost_lines([wc], PRICED)[0]
    (wc,) = cost.analyse(table(), SLO_50, PRICED, ["chat"], min_requests=100)
    assert wc.plans["base"].reason == "not enough data: every step has too few requests"


def test_an_old_table_estimates_goodput_tokens_and_has_no_interval():
    t = table().drop(columns=["goodput_tokens_per_s", "goodput_tokens_per_s_log_se"])
    t["output_tokens_per_s"] = [200, 360, 600, 250, 400, 420, 900]
    t["slo_attainment"] = [0.5, 0.5, 0.5, 1.0, 1.0, 1.0, 1.0]  # → the same goodput as above
    (wc,) = cost.analyse(t, SLO_50, PRICED, ["chat"])
    assert wc.plans["base"].cheapest.goodput_tps == pytest.approx(180)
    assert wc.plans["base"].cheapest.estimated and wc.saving.interval is None
    assert wc.saving.saving == pytest.approx(1 - 495 / 1050)


def parse(argv):
    p = argparse.ArgumentParser()
    add_report_arguments(p)
    return p.parse_args(argv)


def test_report_prints_and_writes_the_cost_section(tmp_path, capsys):
    folder = write_sweep(tmp_path / "sweep", {"chat": 0.7})
    argv = [str(folder), "--price-per-hour", "2.5", "--spec-price-per-hour", "2.75",
            "--target-output-tps", "5000"]
    assert report_main(parse(argv)) == 0
    printed = capsys.readouterr().out
    assert "cost (per 1M output tokens): spec " in printed
    md = (folder / "report.md").read_text()
    assert "## Cost and capacity" in md and "price 2.5 per replica-hour (baseline), 2.75" in md
    assert "(plots/cost.png)" in md and (folder / "plots" / "cost.png").stat().st_size > 0
    frame = pd.read_csv(folder / "cost.csv")
    cheapest = frame[frame.cheapest]
    assert set(cheapest.arm) == {"spec", "base"} and cheapest.replicas.notna().all()
    assert frame.cost_per_1m_tokens.notna().any()


@pytest.mark.parametrize("argv,message", [
    (["--spec-price-per-hour", "3"], "--spec-price-per-hour needs --price-per-hour"),
    (["--target-rps", "1", "--target-output-tps", "5"], "not both"),
    (["--price-per-hour", "0"], "--price-per-hour must be positive"),
    (["--min-requests-per-step", "0"], "--min-requests-per-step must be at least 1")])
def test_bad_cost_flags_give_one_line_and_exit_2(tmp_path, capsys, argv, message):
    folder = write_sweep(tmp_path / "sweep", {"chat": 0.7})
    assert report_main(parse([str(folder), *argv])) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err
