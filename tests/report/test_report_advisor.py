"""The K advisor on sweeps built from a known acceptance α and known per-load costs.

With geometric acceptance p_i = α^{i+1} the advisor's prediction must equal the seeds' formula
(1 − α^{K+1}) / ((1 − α)(1 + cK)), its best K must be the brute-force argmax of that formula,
and the Profile it writes must make the engine's goodput policy pick the same K.
"""

import json

import pandas as pd
import pytest

from spectest.report import advisor

ALPHA, K_RUN = 0.7, 4
T0 = {1: 10.0, 2: 11.0, 4: 13.0, 8: 20.0}  # ms per plain target round
C_EFF = {1: 0.05, 2: 0.15, 4: 0.45, 8: 1.2}  # overhead per draft token, grows with load


def sweep_table(alpha=ALPHA, engine_timings=True) -> pd.DataFrame:
    rows = []
    p = [alpha ** (i + 1) for i in range(K_RUN)]
    e = 1 + sum(p)
    for c in T0:
        round_ms = T0[c] * (1 + C_EFF[c] * K_RUN)
        draft = round_ms * 0.3
        spec = {"workload": "chat", "arm": "spec", "concurrency": c, "k": K_RUN,
                "drafts": 1000 * c, "mean_accepted_length": e, "tpot_p50_ms": round_ms / e}
        spec.update({f"acceptance_pos_{i}": (p[i] if i < K_RUN else 0.0) for i in range(8)})
        base = {"workload": "chat", "arm": "base", "concurrency": c, "k": None, "drafts": 0,
                "tpot_p50_ms": T0[c]}
        if engine_timings:
            spec.update(draft_ms_per_round=draft, verify_ms_per_round=round_ms - draft)
            base.update(draft_ms_per_round=None, verify_ms_per_round=T0[c])
        rows += [spec, base]
    return pd.DataFrame(rows)


def test_geometric_acceptance_reduces_to_the_seeds_formula():
    p = advisor.extend(tuple(ALPHA ** (i + 1) for i in range(8)), 8)
    for k in range(9):
        for c in (0.0, 0.02, 0.3):
            assert advisor.predict(p, c, k) == pytest.approx(advisor.seeds_speedup(ALPHA, c, k))
    # the seeds' worked example: α = 0.7, γ = 5, c = 0.02 → 2.7×
    assert advisor.seeds_speedup(0.7, 0.02, 5) == pytest.approx(2.7, abs=0.05)


def test_acceptance_past_the_run_k_continues_geometrically():
    p = advisor.extend((0.8, 0.6, 0.45), 6)
    assert p[:3] == (0.8, 0.6, 0.45)
    assert p[3] == pytest.approx(0.45 * 0.75) and p[5] == pytest.approx(0.45 * 0.75 ** 3)
    assert advisor.extend((), 3) == (0.0, 0.0, 0.0)


@pytest.mark.parametrize("engine_timings", [True, False])
def test_best_k_per_concurrency_is_the_formula_argmax(engine_timings):
    t = sweep_table(engine_timings=engine_timings)
    assert advisor.k_run(t, "chat") == K_RUN
    assert advisor.position_acceptance(t, "chat") == pytest.approx(
        [ALPHA ** (i + 1) for i in range(K_RUN)])
    advice = {a.concurrency: a for a in advisor.advise(t, "chat")}
    assert sorted(advice) == [1, 2, 4, 8]
    for c, a in advice.items():
        curve = [advisor.seeds_speedup(ALPHA, C_EFF[c], k) for k in range(9)]
        assert a.c_eff == pytest.approx(C_EFF[c])
        assert a.best_k == max(range(9), key=curve.__getitem__)
        assert a.predicted_best == pytest.approx(max(curve))
        assert a.measured_at_run == pytest.approx(curve[K_RUN])  # consistent table
        assert a.source == ("engine rounds" if engine_timings else "client TPOT")
    assert advice[1].best_k >= 4 and advice[8].best_k == 0  # speculation off at high load
    assert advice[8].predicted_best == 1.0


def test_validation_arm_is_reported_beside_the_prediction():
    t = sweep_table()
    extra = t[(t.arm == "spec") & (t.concurrency == 2)].assign(arm="spec-advised", k=5,
                                                               tpot_p50_ms=7.0)
    advice = {a.concurrency: a for a in advisor.advise(pd.concat([t, extra]), "chat")}
    assert advice[2].validated == pytest.approx(11.0 / 7.0) and advice[2].validated_k == 5
    assert advice[1].validated is None
    frame = advisor.advice_frame(list(advice.values()))
    assert list(frame.concurrency) == [1, 2, 4, 8] and frame.best_k.iloc[-1] == 0


def test_profile_drives_the_engine_goodput_policy_to_the_same_k(tmp_path):
    policies = pytest.importorskip("spectest.engine.policies")
    t = sweep_table()
    prof = advisor.profile_json(t)
    path = tmp_path / "k_profile.json"
    path.write_text(advisor.profile_text(prof))
    loaded = policies.Profile.load(path)
    advice = {a.concurrency: a for a in advisor.advise(t, "chat")}
    for c, a in advice.items():
        k, _ = loaded.best_k(int(c), 8)
        assert k == a.best_k
    assert json.loads(path.read_text())["meta"]["k_run"] == K_RUN


def test_no_advice_without_acceptance_or_k():
    t = sweep_table().drop(columns=[f"acceptance_pos_{i}" for i in range(8)])
    assert advisor.advise(t, "chat") == [] and advisor.profile_json(t) is None


def test_k_comes_from_draft_tokens_per_draft_without_a_k_gauge():
    t = sweep_table().assign(k=None)  # a vLLM server: no spectest:spec_decode_k
    t.loc[t.arm == "spec", "draft_tokens"] = t.loc[t.arm == "spec", "drafts"] * K_RUN
    assert advisor.k_run(t, "chat") == K_RUN
    assert len(advisor.advise(t, "chat")) == 4


def test_implausible_costs_are_flagged_and_left_out_of_the_profile():
    t = sweep_table()
    noisy = (t.arm == "base") & (t.concurrency == 8)
    t.loc[noisy, "verify_ms_per_round"] = 500.0  # a plain round "slower" than a spec round
    advice = {a.concurrency: a for a in advisor.advise(t, "chat")}
    assert not advice[8].plausible and all(advice[c].plausible for c in (1, 2, 4))
    assert set(advisor.profile_json(t)["step_seconds"]) == {"1", "2", "4"}


def test_drafts_longer_than_the_advisors_range_still_get_advice():
    """llama.cpp's n-gram drafts run 10–30 tokens per draft (no K gauge): the curve reaches K."""
    t = sweep_table().assign(k=None)
    t.loc[t.arm == "spec", "draft_tokens"] = t.loc[t.arm == "spec", "drafts"] * 24
    assert advisor.k_run(t, "chat") == 24 > advisor.K_MAX
    advice = advisor.advise(t, "chat")
    assert len(advice) == 4 and all(len(a.curve) == 25 for a in advice)


def disaggregated_table(net_ms: dict[int, float]) -> pd.DataFrame:
    """The same sweep, but every speculative round also paid ``net_ms[c]`` of network time
    (a draft server reached over HTTP): inside draft_ms_per_round and in the client's TPOT."""
    t = sweep_table()
    spec = t.arm == "spec"
    for c, net in net_ms.items():
        row = spec & (t.concurrency == c)
        e = float(t.loc[row, "mean_accepted_length"].iloc[0])
        t.loc[row, "draft_ms_per_round"] += net
        t.loc[row, "tpot_p50_ms"] += net / e
        t.loc[row, "network_ms_per_round"] = net
    return t


def network_curve(c: int, net: float) -> list[float]:
    """The formula with a per-round network term ν = net / T0 (none at K = 0)."""
    nu = net / T0[c]
    return [1.0] + [advisor.seeds_speedup(ALPHA, 0, k) / (1 + C_EFF[c] * k + nu)
                    for k in range(1, 9)]


def test_a_measured_network_term_is_paid_once_per_round_not_per_draft_token():
    net = {1: 4.0, 2: 4.0, 4: 4.0, 8: 4.0}
    advice = {a.concurrency: a for a in advisor.advise(disaggregated_table(net), "chat")}
    for c, a in advice.items():
        curve = network_curve(c, net[c])
        assert a.network_ms == pytest.approx(net[c]) and a.network_source == "measured"
        assert a.c_eff == pytest.approx(C_EFF[c])  # the network time is not charged per token
        assert a.curve == pytest.approx(curve)
        assert a.best_k == max(range(9), key=curve.__getitem__)
        assert a.measured_at_run == pytest.approx(curve[K_RUN])  # consistent with the table
    # the advice changes: at c=1 a 4 ms round trip (0.4 target steps) makes K = 1 a loss and
    # favours longer drafts; at c=4 speculation goes from worth it to off
    colocated = {a.concurrency: a for a in advisor.advise(sweep_table(), "chat")}
    assert advice[1].best_k >= colocated[1].best_k
    assert colocated[4].best_k > 0 and advice[4].best_k == 0
    assert advice[1].curve[1] < colocated[1].curve[1] - 0.2


def test_a_what_if_network_term_replaces_the_measured_one():
    measured = disaggregated_table({c: 4.0 for c in T0})
    planned = {a.concurrency: a for a in advisor.advise(measured, "chat", network_ms=0.0)}
    colocated = {a.concurrency: a for a in advisor.advise(sweep_table(), "chat")}
    for c in T0:  # "what if the network were free": the co-located advice again
        assert planned[c].network_source == "assumed"
        assert planned[c].curve == pytest.approx(colocated[c].curve)
    slow = {a.concurrency: a for a in advisor.advise(sweep_table(), "chat", network_ms=10.0)}
    assert slow[1].curve == pytest.approx(network_curve(1, 10.0))
    frame = advisor.advice_frame(list(slow.values()))
    assert set(frame.network_source) == {"assumed"} and set(frame.network_ms_per_round) == {10.0}


def test_the_profile_carries_the_network_term():
    t = disaggregated_table({c: 4.0 for c in T0})
    steps = advisor.profile_json(t)["step_seconds"]["1"]
    assert steps["0"] == pytest.approx(T0[1] / 1e3)
    assert steps["2"] == pytest.approx(T0[1] / 1e3 * (1 + C_EFF[1] * 2) + 4.0 / 1e3)
