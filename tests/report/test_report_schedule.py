"""The speculation schedule from a sweep of known crossovers, in every server's words.

The synthetic sweep (``report_synthetic``) has its TPOT crossovers at c ≈ 11.3 (chat, α 0.7)
and ≈ 5.8 (code, α 0.5); here the server's running-requests gauge reads 0.9 × c, so the
schedule must switch at the crossover's *batch*, not its concurrency, and say so.
"""

import json

import numpy as np
import pandas as pd
import pytest

from report_synthetic import rows
from spectest import flavours
from spectest.report import breakpoints as bpm
from spectest.report import schedule as sch
from spectest.report.advice_section import boundary_note


def table(alpha=None, gauge: float | None = 0.9, **kw) -> pd.DataFrame:
    t = pd.DataFrame(rows(alpha or {"chat": 0.7, "code": 0.5}, **kw))
    if gauge is not None:
        t["running_mean"] = gauge * t.concurrency
        t["running_min"] = np.floor(0.7 * t.concurrency)
        t["running_max"] = t.concurrency
    return t


def test_the_crossover_becomes_batch_ranges_through_the_gauge():
    t = table()
    s = sch.build(t, "code")
    cross = bpm.crossover(t, "code", "tpot")
    assert s.status == sch.ON and s.k == 4 and cross.status == bpm.FOUND
    # c* ≈ 5.8 between 4 and 8: batch 0.9·c at both ends, interpolated in log2 → 0.9·c*
    assert s.cutoff_batch == pytest.approx(0.9 * cross.concurrency, rel=1e-6)
    last = int(np.floor(s.cutoff_batch))
    assert s.ranges == ((1, last, 4), (last + 1, 16, 0)) and s.last_on == last
    assert "batch sizes from the server's running-requests gauge" in s.mapping
    assert [st.k for st in s.steps] == [4, 4, 4, 0, 0]
    assert s.k_at(last) == 4 and s.k_at(last + 1) == 0 and s.k_at(100) == 0  # carried on
    # without a gauge the concurrency is taken as the batch, and the schedule says so
    bare = sch.build(table(gauge=None), "code")
    assert bare.cutoff_batch == pytest.approx(cross.concurrency) and "taken as" in bare.mapping


def test_every_flavour_words_it_in_its_own_flags():
    s = sch.build(table(), "code")
    last = s.last_on
    vllm = sch.render(s, flavours.VLLM, '{"method": "ngram", "num_speculative_tokens": 4, '
                                        '"prompt_lookup_max": 4}')
    config = json.loads(vllm.split("'")[1])  # the whole --speculative-config value
    assert config == {"method": "ngram", "prompt_lookup_max": 4, "num_speculative_tokens": 4,
                      "num_speculative_tokens_per_batch_size": [[1, last, 4], [last + 1, 16, 0]]}
    assert '"method": "…"' in sch.render(s, flavours.VLLM)  # the user's method unknown
    assert sch.render(s, flavours.SPECTEST) == f"spectest serve … --k 4 --disable-above {last}"
    assert sch.spectest_serve_args(s) == ["--k", "4", "--disable-above", str(last)]
    ladder = json.loads(sch.render(s, flavours.SGLANG).split("ladder.json = ", 1)[1])
    assert ladder == {"1": {"candidate_steps": [4]}, str(last + 1): {"candidate_steps": [0]}}
    assert f"-np {last} --spec-draft-n-max 4" in sch.render(s, flavours.LLAMACPP)


def test_not_reached_is_always_on_below_range_is_off_and_unplaced_is_no_schedule():
    always = sch.build(table(steps=(1, 2, 4)), "chat")  # chat crosses at ≈ 11: not reached
    assert always.status == sch.ALWAYS and always.ranges == ((1, 4, 4),)
    assert "beyond c=4 it was not measured" in always.why
    assert sch.render(always, flavours.VLLM).endswith('"num_speculative_tokens": 4}\'')
    off = sch.build(table(steps=(8, 16)), "code")  # already behind at the lowest step
    assert off.status == sch.OFF and off.ranges == ((1, 16, 0),)
    assert sch.render(off, flavours.VLLM) == "start it without --speculative-config"
    thin = table()
    thin["requests"] = 5  # under the 20 a verdict needs, in every step
    none = sch.build(thin, "code")
    assert none.status == sch.NONE and none.ranges == () and "not enough data" in none.why
    assert sch.render(none, flavours.VLLM).startswith("no change")
    assert sch.spectest_serve_args(none) is None and sch.vllm_schedule(none) is None


def test_one_unplaced_crossover_leaves_a_provisional_schedule_on_the_other():
    t = table()
    t.loc[t.arm == "spec", "output_tokens_per_s_log_se"] = 2.0  # throughput: no verdict
    s = sch.build(t, "code")
    assert s.status == sch.ON and "provisional, the throughput crossover is unplaced" in s.why
    assert sch.build(t, "code", objective="tpot").why.count("provisional") == 0


def test_the_mix_weights_the_workloads_ratios():
    t = table()
    weights = sch.parse_mix("chat=3,code=1", ["chat", "code"])
    assert weights == {"chat": 0.75, "code": 0.25}
    mixed = sch.mix_table(t, weights)
    chat, code, mix = (bpm.ratios(pd.concat([t, mixed]), w, "tpot") for w in
                       ("chat", "code", "mix"))
    for a, b, m in zip(chat, code, mix):  # the geometric mean of the ratios, weighted
        assert m.value == pytest.approx(a.value ** 0.75 * b.value ** 0.25, rel=1e-9)
    schedules = sch.build_all(t, ["chat", "code"], mix=weights)
    assert [s.name for s in schedules] == ["chat", "code", "mix"]
    assert schedules[1].cutoff_batch < schedules[2].cutoff_batch < schedules[0].cutoff_batch
    with pytest.raises(sch.MixError, match="did not measure"):
        sch.parse_mix("chat=1,math=1", ["chat", "code"])
    with pytest.raises(sch.MixError, match="workload=weight"):
        sch.parse_mix("chat", ["chat"])


def test_a_step_whose_batch_crossed_a_boundary_is_named():
    s = sch.build(table(), "code")
    last = s.last_on
    note = boundary_note(s, last - 1, last + 2)
    assert f"crossed the schedule's boundary at {last}|{last + 1} (K 4 → off)" in note
    assert boundary_note(s, 1, last) == "" and boundary_note(s, None, 3) == ""
