"""Admission, cancellation and refusal: capacity comes back and the engine keeps serving."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from spectest.engine.policies import FixedK
from spectest.engine.requests import CapacityError, GenerationRequest, QueueFullError
from spectest.engine.sampling import SamplingParams
from spectest.engine.scheduler import Scheduler, SchedulerConfig

from pairs import load_embedded, make_engine, tiny_model, tiny_tokenizer

V = 16


@pytest.fixture(scope="module")
def models():
    torch.set_num_threads(1)
    return tiny_model(V, seed=0), tiny_model(V, seed=1), tiny_tokenizer(V)


def _engine(models, **kw):
    target, draft, tok = models
    return make_engine(target, tok, "draft-model", draft, FixedK(3), **kw)


def _req(rid, n_prompt=4, max_tokens=50):
    return GenerationRequest(rid, tuple(range(1, n_prompt + 1)),
                             SamplingParams(max_tokens=max_tokens, ignore_eos=True))


def test_cancel_mid_generation_frees_the_slot(models):
    engine = _engine(models, max_num_seqs=2)
    outs = {}
    for rid in ("a", "b", "c"):
        engine.submit(_req(rid), lambda o: outs.setdefault(o.request_id, []).append(o))
    for _ in range(3):
        engine.step()
    assert engine.scheduler.counts() == (2, 1)  # c waits for a slot
    engine.cancel("a")
    engine.step()  # cancellation applies at the next round boundary; c is admitted
    assert outs["a"][-1].finished and outs["a"][-1].finish_reason == "abort"
    assert "c" in outs and engine.scheduler.counts()[1] == 0
    engine.run_until_idle()
    assert outs["b"][-1].finish_reason == "length" and outs["c"][-1].finish_reason == "length"
    assert sum(len(o.token_ids) for o in outs["c"]) == 50
    assert engine.scheduler.counts() == (0, 0) and engine.cache.used_positions() == 0
    assert engine.drafter.cache.used_positions() == 0


def test_cancel_waiting_request(models):
    engine = _engine(models, max_num_seqs=1)
    outs = {}
    for rid in ("a", "b"):
        engine.submit(_req(rid), lambda o: outs.setdefault(o.request_id, []).append(o))
    engine.step()
    engine.cancel("b")
    engine.run_until_idle()
    assert outs["b"][-1].finish_reason == "abort" and not any(o.token_ids for o in outs["b"])


def test_over_long_prompt_is_refused_and_engine_keeps_serving(models):
    engine = _engine(models, max_model_len=64)
    with pytest.raises(CapacityError, match="KV positions"):
        engine.submit(_req("long", n_prompt=60, max_tokens=10), lambda o: None)
    with pytest.raises(CapacityError):
        engine.submit(_req("empty", n_prompt=0), lambda o: None)
    outs = []
    engine.submit(_req("ok", max_tokens=20), outs.append)
    engine.run_until_idle()
    assert outs[-1].finish_reason == "length"


def test_queue_bound(models):
    """Up to max_num_seqs + max_waiting requests are accepted (free slots do not count as
    waiting); beyond that, QueueFullError until a slot frees."""
    engine = _engine(models, max_num_seqs=1, max_waiting=2)
    for rid in ("a", "b", "c"):
        engine.submit(_req(rid, max_tokens=3), lambda o: None)
    with pytest.raises(QueueFullError):
        engine.submit(_req("d"), lambda o: None)
    engine.step()  # a admitted
    with pytest.raises(QueueFullError):
        engine.submit(_req("d"), lambda o: None)
    engine.run_until_idle()
    engine.submit(_req("d"), lambda o: None)


def test_bad_request_fails_alone(models):
    """A token id outside the vocabulary fails that request, not the engine."""
    engine = _engine(models)
    outs = {}
    engine.submit(GenerationRequest("bad", (1, 2, V + 5), SamplingParams(max_tokens=5)),
                  lambda o: outs.setdefault(o.request_id, []).append(o))
    engine.submit(_req("good", max_tokens=8), lambda o: outs.setdefault(o.request_id, []).append(o))
    engine.run_until_idle()
    assert outs["bad"][-1].finish_reason == "error" and outs["bad"][-1].error
    assert outs["good"][-1].finish_reason == "length"


def test_background_thread_serves_and_stops(models):
    import threading
    engine = _engine(models)
    done = threading.Event()
    engine.start()
    try:
        engine.submit(_req("t", max_tokens=10), lambda o: o.finished and done.set())
        assert done.wait(30)
    finally:
        engine.stop()


def test_the_scheduler_packs_slots_low():
    """The lowest free slot goes first, so a batch's slots stay consecutive (test_kv_cache:
    consecutive slots attend over a view of the cache)."""
    sched = Scheduler(SchedulerConfig(max_num_seqs=4, max_model_len=128, spec_slots=2))
    seqs = [sched.submit(GenerationRequest(str(i), (1, 2)), lambda out: None) for i in range(4)]
    sched.schedule()
    assert [s.slot for s in seqs] == [0, 1, 2, 3]
    sched.finish(seqs[2])
    sched.finish(seqs[0])
    late = sched.submit(GenerationRequest("late", (1, 2)), lambda out: None)
    sched.schedule()
    assert late.slot == 0


def test_a_kv_budget_preempts_the_newest_and_recomputes_it_exactly():
    """Four long greedy requests in a budget that holds about two of them: the newest go back
    to the queue (counted), are recomputed from their tokens when room comes back, and every
    output equals the one an unbudgeted engine gives."""
    torch.set_num_threads(1)
    target, draft = load_embedded()
    tok = target.tokenizer
    prompts = [f"def function_{i}(x):\n    return x" for i in range(4)]

    def run(budget):
        engine = make_engine(target.model, tok, "draft-model", draft.model, FixedK(4))
        if budget:
            engine.scheduler.config = replace(engine.scheduler.config, kv_budget_tokens=budget)
        out, stats = {}, {}
        for i, p in enumerate(prompts):
            engine.submit(GenerationRequest(f"r{i}", tuple(tok.encode(p)),
                                            SamplingParams(max_tokens=90, ignore_eos=True)),
                          lambda o: (out.setdefault(o.request_id, []).extend(o.token_ids),
                                     o.finished and stats.setdefault(o.request_id, o.stats)))
        engine.run_until_idle()
        return [out[f"r{i}"] for i in range(4)], [stats[f"r{i}"] for i in range(4)]

    plain, plain_stats = run(None)
    budgeted, stats = run(250)
    assert budgeted == plain
    assert sum(s.preemptions for s in stats) >= 1
    assert all(s.preemptions == 0 for s in plain_stats)
    assert all(len(o) == 90 for o in budgeted)
