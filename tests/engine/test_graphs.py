"""The fixed-shape forwards a GPU captures as CUDA graphs (``engine.graphs``), replayed eagerly
on the CPU — padding rows in the cache's scratch slot, batch and key-span buckets, explicit
masks — give the engine's answers; and the CPU's own GEMM kernels (``engine.cpu_linear``)
compute what ``nn.Linear`` does. (The capture itself needs a GPU: benchmarks/gpu_check.sh.)
"""

from __future__ import annotations

import copy
import uuid

import pytest
import torch

from spectest.engine.cpu_linear import CpuLinear
from spectest.engine.drafters import DraftModelDrafter
from spectest.engine.graphs import CapturedForwards, bucket, span_bucket
from spectest.engine.inference import prepare_for_inference
from spectest.engine.policies import FixedK
from spectest.engine.profiling import PHASES, measure
from spectest.engine.requests import GenerationRequest
from spectest.engine.sampling import SamplingParams

from pairs import load_embedded, make_engine

pytestmark = pytest.mark.usefixtures("single_thread")
PROMPTS = ["def binary_search(items, target):\n", "import os\nimport sys\n\n\ndef main(argv):\n",
           "The :mod:`json` module can be used to", "class Stack:\n    def __init__(self):\n"]


@pytest.fixture(scope="module")
def pair():
    target, draft = load_embedded()
    return target, draft


def _engine(pair, static: bool, drafter: str = "draft-model"):
    target, draft = (prepare_for_inference(copy.deepcopy(m.model)) for m in pair)
    if static:
        target.graphs, draft.graphs = CapturedForwards(capture=False), \
            CapturedForwards(capture=False)
    d = DraftModelDrafter(draft, 4, 512) if drafter == "draft-model" else drafter
    return make_engine(target, pair[0].tokenizer, drafter=d, max_num_seqs=4,
                       policy=FixedK(3)), target


def _run(engine, tokenizer, speculative=True, temperature=0.0):
    reqs = [GenerationRequest(uuid.uuid4().hex, tuple(tokenizer.encode(p)), SamplingParams(
        max_tokens=20 + 6 * i, ignore_eos=True, temperature=temperature, seed=i),
        speculative=speculative) for i, p in enumerate(PROMPTS)]
    out = {r.request_id: [] for r in reqs}
    for i, r in enumerate(reqs):  # they join two rounds apart and leave at different lengths
        engine.submit(r, lambda o: out[o.request_id].extend(o.token_ids))
        engine.step()
        engine.step()
    engine.run_until_idle()
    return [out[r.request_id] for r in reqs]


def test_buckets():
    assert [bucket(n) for n in (1, 2, 3, 5, 9, 64)] == [1, 2, 4, 8, 16, 64]
    assert bucket(65) is None
    assert span_bucket(10, 4096) == 256 and span_bucket(300, 4096) == 512
    assert span_bucket(3000, 2048) == 2048


def test_fixed_shape_replays_give_the_eager_engines_tokens(pair):
    """Greedy speculation through the replayed forwards equals target-only decoding through
    them, and the eager engine's output, in a batch that grows to 3 rows (a bucket of 4: one
    padding row writing into the scratch slot) and shrinks again."""
    tok = pair[0].tokenizer
    eager, _ = _engine(pair, static=False)
    static, target = _engine(pair, static=True)
    expected = _run(eager, tok, speculative=False)
    assert _run(static, tok) == expected
    assert _run(static, tok, speculative=False) == expected
    stats = target.graphs.stats()
    assert stats["replayed"] > 50 and stats["captured"] == 0  # nothing captured on a CPU
    keys = {key[1:3] for key in target.graphs.entries}  # (batch bucket, tokens a row)
    assert (4, 4) in keys and (1, 1) in keys  # 3 rows padded to 4; K + 1 = 4 tokens a row
    assert static.cache.k.shape[1] == 4 + 1  # the scratch slot
    sampled = _run(static, tok, temperature=0.8)
    assert sampled == _run(static, tok, temperature=0.8)  # seeded: reproducible
    assert all(len(s) == 20 + 6 * i for i, s in enumerate(sampled))


@pytest.mark.parametrize("rows", [1, 2, 5, 300])
@pytest.mark.parametrize("bias", [False, True])
def test_cpu_linear_computes_what_linear_computes(rows, bias):
    torch.manual_seed(rows)
    linear = torch.nn.Linear(256, 1536, bias=bias)
    fast = CpuLinear(linear)
    x = torch.randn(1, rows, 256)
    with torch.no_grad():
        torch.testing.assert_close(fast(x), linear(x), rtol=1e-5, atol=1e-5)
        twin = copy.deepcopy(fast)
        torch.testing.assert_close(twin(x), fast(x), rtol=0, atol=0)
    assert torch.equal(fast.weight, linear.weight)


def test_profile_splits_a_round_into_its_phases(pair):
    engine, _ = _engine(pair, static=False)
    seconds, records, phases = measure(engine, 2, 2, rounds=4)
    assert list(phases) == list(PHASES)
    assert all(v >= 0 for v in phases.values())
    assert phases["model compute"] > 0 and phases["drafting"] > 0
    assert sum(phases.values()) <= 3 * seconds
    assert any(r.round_seconds > 0 and r.target_seconds > 0 for r in records)
