"""The rollback drill: its analysis on synthetic request rows with known answers, and the real
drill (bundled server, Locust, the admin switch flipped off and on under load)."""

from __future__ import annotations

import pytest

from spectest.sweep.drill import Flip, FlipRecord, analyse, run_drill, timeline

T0 = 1_000_000.0


def stream(start_s: float, n_chunks: int, gap_ms: float, tokens_per_chunk: float,
           drafted: bool = True) -> dict:
    """A request row as Locust's results write it: started at T0 + start_s, 50 ms TTFT."""
    return {"started_at": T0 + start_s, "ok": True, "ttft_ms": 50.0,
            "itl_ms": [gap_ms] * n_chunks, "tokens_per_chunk": tokens_per_chunk,
            "e2el_ms": 50.0 + gap_ms * n_chunks,
            "spec": {"draft_tokens": 40 if drafted else 0}}


def flip(at_s: float, enabled: bool) -> FlipRecord:
    return FlipRecord(enabled, T0 + at_s, 0.01, 10, float(enabled), 1.0)


def test_timeline_is_gaps_over_tokens_per_bin():
    rows = [stream(0.0, 10, 40.0, 2.0)]  # chunks at 0.09 … 0.45 s: one bin, 20 ms per token
    (t, tpot), = timeline(rows, T0, bin_s=0.5)
    assert t == 0.0 and tpot == pytest.approx(20.0)


def test_levels_and_time_to_change_have_known_answers():
    # speculation on: 30 ms per 3-token chunk (10 ms/token); off from 10 s: 15 ms per token
    rows = [stream(s, 30, 30.0, 3.0) for s in range(0, 10)]
    rows += [stream(s + 0.05, 20, 15.0, 1.0, drafted=False) for s in range(10, 20)]
    out = analyse(rows, [flip(10.0, False)], T0, bin_s=0.5)
    (effect,) = out["effects"]
    assert effect["tpot_before_ms"] == pytest.approx(10.0)
    assert effect["tpot_after_ms"] == pytest.approx(15.0)
    assert effect["changed_after_s"] == pytest.approx(0.5)  # the first bin after the flip
    assert effect["requests_after"] == 10 and effect["drafted_after"] == 0
    assert effect["requests_before"] == 10
    assert out["failures"] == 0 and out["requests"] == 20


def test_a_flip_that_changes_nothing_reports_no_change_time():
    rows = [stream(s, 30, 30.0, 3.0) for s in range(0, 20)]
    (effect,) = analyse(rows, [flip(10.0, False)], T0)["effects"]
    assert effect["tpot_before_ms"] == effect["tpot_after_ms"]
    assert effect["changed_after_s"] is None


def test_drill_flips_speculation_under_load_without_losing_a_request(tmp_path):
    result = run_drill(tmp_path, ["--max-model-len", "2048", "--threads", "1"], "chat",
                       users=2, run_time_s=16, flips=(Flip(4, False), Flip(10, True)),
                       max_tokens=32)
    assert result["locust_returncode"] == 0
    assert result["requests"] >= 10 and result["failures"] == 0
    off, on = result["flips"]
    assert (off["gauge_enabled"], on["gauge_enabled"]) == (0.0, 1.0)
    assert on["switches_total"] == off["switches_total"] + 1 == 2
    assert 0 <= off["effective_after_s"] < 2 and 0 <= on["effective_after_s"] < 2
    off_effect, on_effect = result["effects"]
    assert off_effect["requests_after"] >= 1 and off_effect["drafted_after"] == 0
    assert on_effect["requests_after"] >= 1
    assert on_effect["drafted_after"] == on_effect["requests_after"]
    assert (tmp_path / "drill.json").exists()
