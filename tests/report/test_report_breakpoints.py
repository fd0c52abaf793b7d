"""Break-point detection on synthetic step tables whose answers are known by construction.

Each case builds a sweep table by hand (concurrency 1, 2, 4, 8 …), so the expected crossover,
SLO break, knee and max goodput follow from the numbers written here — including the
"not reached", "below the lowest step" and noisy cases.
"""

import math

import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spectest.report import breakpoints as bp
from spectest.report.table import SLO

CS = [1, 2, 4, 8]


def table(workload="chat", **arms) -> pd.DataFrame:
    """arms: name → {column: [values per concurrency]} (missing columns: NaN)."""
    rows = []
    for arm, cols in arms.items():
        cs = cols.pop("concurrency", CS)
        for i, c in enumerate(cs):
            row = {"workload": workload, "arm": arm, "concurrency": c, "error_rate": 0.0}
            row.update({k: v[i] for k, v in cols.items()})
            rows.append(row)
    return pd.DataFrame(rows)


def log_interp(c0, c1, y0, y1, target):
    f = (target - y0) / (y1 - y0)
    return 2 ** (math.log2(c0) + f * (math.log2(c1) - math.log2(c0)))


# --- crossover ------------------------------------------------------------------------------
def test_tpot_crossover_interpolated_between_the_bracketing_steps():
    t = table(spec={"tpot_p50_ms": [10, 14, 22, 40]}, base={"tpot_p50_ms": [15, 17, 20, 25]})
    got = bp.crossover(t, "chat", "tpot")
    # advantage base/spec − 1: +50 %, +21.4 %, −9.1 %, −37.5 % → zero between c=2 and c=4
    want = log_interp(2, 4, 17 / 14 - 1, 20 / 22 - 1, 0.0)
    assert got.status == bp.FOUND and (got.lower, got.upper) == (2, 4)
    assert got.concurrency == pytest.approx(want) and want == pytest.approx(3.254, abs=1e-3)
    assert "c=2" in got.evidence and "c=4" in got.evidence and not got.notes


def test_throughput_crossover_uses_higher_is_better():
    t = table(spec={"output_tokens_per_s": [200, 300, 380, 400]},
              base={"output_tokens_per_s": [100, 190, 360, 600]})
    got = bp.crossover(t, "chat", "throughput")
    want = log_interp(4, 8, 380 / 360 - 1, 400 / 600 - 1, 0.0)
    assert got.status == bp.FOUND and (got.lower, got.upper) == (4, 8)
    assert got.concurrency == pytest.approx(want)


def test_crossover_not_reached_when_speculation_wins_everywhere():
    t = table(spec={"tpot_p50_ms": [10, 11, 12, 13]}, base={"tpot_p50_ms": [20, 21, 22, 23]})
    got = bp.crossover(t, "chat", "tpot")
    assert got.status == bp.NOT_REACHED and got.concurrency is None and got.upper == 8
    assert got.headline() == "not reached (up to 8)"


def test_crossover_below_range_when_speculation_never_helps():
    t = table(spec={"tpot_p50_ms": [21, 25, 30, 40]}, base={"tpot_p50_ms": [20, 21, 22, 23]})
    got = bp.crossover(t, "chat", "tpot")
    assert got.status == bp.BELOW and got.concurrency == 1 and "≤ 1" in got.headline()


def test_a_dip_that_recovers_is_a_note_not_the_crossover():
    # advantages +30 %, −1 %, +20 %, −20 %: the dip at c=2 is followed by a clear win at c=4
    base = [13, 10, 12, 10]
    spec = [10, 10 / 0.99, 10, 12.5]
    t = table(spec={"tpot_p50_ms": spec}, base={"tpot_p50_ms": base})
    got = bp.crossover(t, "chat", "tpot")
    assert got.status == bp.FOUND and (got.lower, got.upper) == (4, 8)
    assert got.concurrency == pytest.approx(log_interp(4, 8, 0.2, -0.2, 0.0))
    assert len(got.notes) == 1 and "c=2" in got.notes[0]


def test_measured_noise_widens_the_band_a_late_win_must_clear():
    # +30 %, +20 %, −20 %, +8 %: with 3 % noise +8 % is a clear win (the −20 % is a dip, no
    # stable crossover); with 5 % relative error per arm the band is 2·√2·5 % ≈ 14 %, so +8 %
    # is noise and speculation stops paying between c=2 (+20 %) and c=4 (−20 %).
    spec = [10, 10, 10, 10]
    base = [13, 12, 8, 10.8]
    quiet = table(spec={"tpot_p50_ms": spec}, base={"tpot_p50_ms": base})
    assert bp.crossover(quiet, "chat", "tpot").status == bp.NOT_REACHED
    noisy = table(spec={"tpot_p50_ms": spec, "tpot_p50_rse": [0.05] * 4},
                  base={"tpot_p50_ms": base, "tpot_p50_rse": [0.05] * 4})
    got = bp.crossover(noisy, "chat", "tpot")
    assert got.status == bp.FOUND and (got.lower, got.upper) == (2, 4)


def test_a_step_inside_a_wide_noise_band_is_not_enough_for_a_crossover():
    # +30 %, +10 %, −2 %, +8 % with a ±14 % band: c=2 (+10 %) and c=4 (−2 %) are both inside
    # it, and a band that wide cannot say "even" (±10 %): no crossover may rest on them.
    spec = [10, 10, 10, 10]
    base = [13, 11, 9.8, 10.8]
    noisy = table(spec={"tpot_p50_ms": spec, "tpot_p50_rse": [0.05] * 4},
                  base={"tpot_p50_ms": base, "tpot_p50_rse": [0.05] * 4})
    got = bp.crossover(noisy, "chat", "tpot")
    assert got.status == bp.NOT_ENOUGH and "cannot tell" in got.evidence
    assert "sub-window noise ±14%" in got.basis and got.headline().startswith("not enough data")


def test_crossover_only_compares_steps_both_arms_measured():
    t = table(spec={"concurrency": [1, 2], "tpot_p50_ms": [10, 30]},
              base={"tpot_p50_ms": [20, 25, 30, 35]})
    got = bp.crossover(t, "chat", "tpot")
    assert got.status == bp.FOUND and got.upper == 2
    assert bp.crossover(table(base={"tpot_p50_ms": [1, 2, 3, 4]}), "chat").status == bp.NO_DATA


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(-0.5, 0.5), min_size=2, max_size=7))
def test_a_found_crossover_is_bracketed_by_a_win_and_a_loss(advantages):
    cs = [2 ** i for i in range(len(advantages))]
    t = table(spec={"concurrency": cs, "tpot_p50_ms": [10.0] * len(cs)},
              base={"concurrency": cs, "tpot_p50_ms": [10.0 * (1 + a) for a in advantages]})
    got = bp.crossover(t, "chat", "tpot")
    a = dict(zip(cs, bp.advantage(t, "chat", "tpot").a))  # (10·(1+x))/10 − 1, rounding kept
    if got.status == bp.FOUND:
        assert a[got.lower] > 0 and a[got.upper] <= 0
        assert got.lower <= got.concurrency <= got.upper
        assert all(a[c] <= bp.MIN_TOL for c in cs if c > got.upper)
    elif got.status == bp.BELOW:
        assert a[1] <= 0 and all(a[c] <= bp.MIN_TOL for c in cs)
    else:  # every loss is followed by a clear win, and the last step is a win
        assert got.status == bp.NOT_REACHED and a[cs[-1]] > 0
        assert all(any(a[d] > bp.MIN_TOL for d in cs if d > c) for c in cs if a[c] <= 0)


# --- SLO break point ------------------------------------------------------------------------
SLO_TPOT = SLO(tpot_p99_ms=50)


def test_slo_break_interpolates_where_the_metric_crosses_its_threshold():
    t = table(spec={"tpot_p99_ms": [20, 30, 45, 80]})
    got = bp.slo_break(t, "chat", "spec", SLO_TPOT)
    assert got.status == bp.FOUND and (got.lower, got.upper) == (4, 8)
    assert got.concurrency == pytest.approx(log_interp(4, 8, 45, 80, 50))
    assert "tpot p99 80 ms > 50 ms" in got.evidence


def test_slo_break_takes_the_earliest_crossing_of_several_misses():
    t = table(spec={"tpot_p99_ms": [20, 30, 45, 80], "ttft_p99_ms": [100, 150, 190, 1000]})
    got = bp.slo_break(t, "chat", "spec", SLO(ttft_p99_ms=200, tpot_p99_ms=50))
    ttft_cross = log_interp(4, 8, 190, 1000, 200)
    assert ttft_cross < log_interp(4, 8, 45, 80, 50)
    assert got.concurrency == pytest.approx(ttft_cross)


def test_slo_not_reached_below_range_and_unset():
    met = table(spec={"tpot_p99_ms": [20, 21, 22, 23]})
    assert bp.slo_break(met, "chat", "spec", SLO_TPOT).status == bp.NOT_REACHED
    broken = table(spec={"tpot_p99_ms": [60, 70, 80, 90]})
    got = bp.slo_break(broken, "chat", "spec", SLO_TPOT)
    assert got.status == bp.BELOW and got.concurrency == 1
    assert bp.slo_break(met, "chat", "spec", SLO()).status == bp.NO_SLO


def test_failures_break_the_slo_and_a_later_pass_is_noted():
    t = table(spec={"tpot_p99_ms": [20, 20, 20, 20], "error_rate": [0, 0.2, 0, 0]})
    got = bp.slo_break(t, "chat", "spec", SLO_TPOT)
    assert got.status == bp.FOUND and (got.lower, got.upper) == (1, 2)
    assert "error rate 20.0%" in got.evidence and "met again at c=4, 8" in got.notes[0]
    # a step where nothing succeeded has no percentile: it misses the SLO
    t = table(spec={"tpot_p99_ms": [20, float("nan"), 20, 20]})
    assert bp.slo_break(t, "chat", "spec", SLO_TPOT).upper == 2


# --- knee -----------------------------------------------------------------------------------
def test_knee_where_throughput_reaches_its_plateau_and_latency_rises():
    t = table(spec={"concurrency": [1, 2, 4, 8, 16],
                    "output_tokens_per_s": [100, 180, 280, 300, 302],
                    "e2el_p50_ms": [1000, 1100, 1400, 2600, 5200]})
    got = bp.knee(t, "chat", "spec")
    assert got.status == bp.FOUND and (got.lower, got.upper) == (2, 4)
    assert got.concurrency == pytest.approx(log_interp(2, 4, 180, 280, 302 / 1.1))
    assert got.metric == 302


def test_knee_not_reached_while_throughput_grows():
    t = table(spec={"output_tokens_per_s": [100, 190, 350, 600],
                    "e2el_p50_ms": [1000, 1050, 1100, 1200]})
    got = bp.knee(t, "chat", "spec")
    assert got.status == bp.NOT_REACHED and "+71%" in got.evidence


def test_flat_throughput_without_rising_latency_is_not_a_knee():
    t = table(spec={"output_tokens_per_s": [100, 190, 200, 201],
                    "e2el_p50_ms": [1000, 1000, 1000, 1000]})
    got = bp.knee(t, "chat", "spec")
    assert got.status == bp.NOT_REACHED and "client-bound" in " ".join(got.notes)


def test_knee_below_range_and_noisy_plateau():
    flat = table(spec={"output_tokens_per_s": [300, 310, 305, 299],
                       "e2el_p50_ms": [100, 200, 400, 800]})
    assert bp.knee(flat, "chat", "spec").status == bp.BELOW
    # a +8 % wobble inside the plateau (under FLAT_TOL) does not move the knee
    wobbly = table(spec={"concurrency": [1, 2, 4, 8, 16],
                         "output_tokens_per_s": [100, 200, 300, 324, 310],
                         "e2el_p50_ms": [100, 100, 130, 250, 500]})
    got = bp.knee(wobbly, "chat", "spec")
    assert (got.lower, got.upper) == (2, 4)


def test_past_saturation_waits_for_patience_steps_beyond_the_knee():
    cols = {"concurrency": [1, 2, 4, 8, 16], "output_tokens_per_s": [100, 180, 280, 300, 302],
            "e2el_p50_ms": [1000, 1100, 1400, 2600, 5200]}
    full = table(spec=dict(cols))
    assert "past saturation" in bp.past_saturation(full, patience=2)
    assert bp.past_saturation(full.iloc[:4], patience=2) is None  # one step beyond: not yet
    # one step beyond with patience 1, but latency 1400 → 2600 ms has not doubled
    assert bp.past_saturation(full.iloc[:4], patience=1) is None
    # a knee at the lowest step still needs patience + 2 points before anything stops
    flat = table(spec={"output_tokens_per_s": [300, 310, 305, 299],
                       "e2el_p50_ms": [100, 200, 400, 800]})
    assert bp.past_saturation(flat.iloc[:3], patience=2) is None
    assert bp.past_saturation(flat, patience=2) is not None
    # latency that has not doubled since the knee is not "clearly" past it
    mild = table(spec={"output_tokens_per_s": [300, 310, 305, 299],
                       "e2el_p50_ms": [100, 120, 150, 190]})
    assert bp.knee(mild, "chat", "spec").status == bp.BELOW
    assert bp.past_saturation(mild, patience=2) is None


# --- goodput, speedup, everything -----------------------------------------------------------
def test_max_goodput_and_still_rising_note():
    t = table(spec={"goodput_rps": [1.0, 1.8, 2.5, 2.2]}, base={"goodput_rps": [1, 2, 3, 4]})
    got = bp.max_goodput(t, "chat", "spec")
    assert (got.status, got.concurrency, got.metric) == (bp.FOUND, 4, 2.5) and not got.notes
    assert "still rising" in bp.max_goodput(t, "chat", "base").notes[0]


def test_speedup_at_concurrency_one_and_fallback_to_lowest_common_step():
    t = table(spec={"tpot_p50_ms": [10, 20, 30, 40], "output_tokens_per_s": [150, 1, 1, 1],
                    "e2el_p50_ms": [500, 1, 1, 1], "acceptance_rate": [0.6] * 4,
                    "mean_accepted_length": [2.5] * 4},
              base={"tpot_p50_ms": [20, 20, 20, 20], "output_tokens_per_s": [100, 1, 1, 1],
                    "e2el_p50_ms": [1000, 1, 1, 1]})
    s = bp.speedup_at(t, "chat")
    assert (s.concurrency, s.tpot, s.throughput, s.e2el) == (1, 2.0, 1.5, 2.0)
    assert s.acceptance_rate == 0.6
    later = t[t.concurrency > 1]
    assert bp.speedup_at(later, "chat").concurrency == 2


def test_find_all_covers_every_workload_and_arm():
    t = pd.concat([table("chat", spec={"tpot_p50_ms": [1, 2, 3, 4]},
                         base={"tpot_p50_ms": [2, 2, 2, 2]}),
                   table("code", spec={"tpot_p50_ms": [1, 1, 1, 1]},
                         base={"tpot_p50_ms": [2, 2, 2, 2]})])
    for col in ("output_tokens_per_s", "e2el_p50_ms", "goodput_rps", "tpot_p99_ms"):
        t[col] = 1.0
    found = bp.find_all(t, SLO_TPOT)
    kinds = {(b.workload, b.kind, b.arm) for b in found}
    assert ("chat", "crossover_tpot", None) in kinds and ("code", "knee", "base") in kinds
    assert len(found) == 2 * (2 + 2 * 3)
    assert "doubling" in bp.resolution(t)
