"""Where the engine's tensors live (``engine.device``), and that a round waits for the device
once (``engine.syncs``).

On a CPU-only machine "the device" is the CPU, so two checks stand in for a GPU:

* torch's default device is set to ``meta`` while a CPU engine serves: a tensor made without
  an explicit device (the way the per-request generator used to be made on the CPU while the
  model sat on a GPU) lands on ``meta`` and the round fails, so every tensor is shown to be
  placed explicitly;
* ``HostSyncCounter`` counts every read of a tensor into Python and every operator whose output
  size depends on the data: where a GPU would make the host wait.
"""

from __future__ import annotations

import subprocess
import sys
import uuid

import numpy as np
import pytest
import torch

from spectest.engine.api import build_engine
from spectest.engine.device import (Placement, fetch, resolve_device, to_device,
                                    weight_dtype)
from spectest.engine.drafters import HybridDrafter, NGramDrafter
from spectest.engine.int8 import should_quantize
from spectest.engine.policies import ConfidenceK, FixedK
from spectest.engine.requests import GenerationRequest
from spectest.engine.sampling import SamplingParams
from spectest.engine.syncs import HostSyncCounter

from pairs import make_engine, random_eagle, tiny_model, tiny_tokenizer

pytestmark = pytest.mark.usefixtures("single_thread")
CUDA = torch.cuda.is_available()
DEVICES = ["cpu"] + (["cuda"] if CUDA else [])
PROMPT = "def binary_search(items, target):\n    lo, hi = 0, len(items)\n"


@pytest.fixture(scope="module")
def engines():
    """The embedded pair as ``build_engine`` makes it (prepared models), per drafter."""
    torch.set_num_threads(1)
    return {d: build_engine("embedded", drafter=d, policy=FixedK(4), max_num_seqs=4,
                            max_model_len=512, device="cpu")
            for d in ("none", "draft-model", "ngram", "ngram+draft-model")}


def _request(engine, temperature=0.0, seed=None, max_tokens=24, logprobs=None, **params):
    ids = tuple(engine.tokenizer.encode(PROMPT))
    return GenerationRequest(uuid.uuid4().hex, ids, SamplingParams(
        max_tokens=max_tokens, ignore_eos=True, temperature=temperature, seed=seed, **params),
        logprobs=logprobs)


def _generate(engine, requests) -> dict[str, list[int]]:
    out = {r.request_id: [] for r in requests}
    for r in requests:
        engine.submit(r, lambda o: out[o.request_id].extend(o.token_ids))
    engine.run_until_idle()
    return out


# --- device and dtype choices -----------------------------------------------------------------
def test_auto_is_the_cpu_without_a_gpu_and_cuda_without_one_is_a_clear_error():
    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_device("auto") == torch.device("cuda" if CUDA else "cpu")
    if not CUDA:
        with pytest.raises(ValueError, match="--device cuda: .*use --device cpu or auto"):
            resolve_device("cuda")
    with pytest.raises(ValueError, match="unknown --device"):
        resolve_device("tpu:0:x")


def test_weights_stay_fp32_on_the_cpu_and_int8_stays_there():
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert weight_dtype(cpu) == torch.float32
    assert weight_dtype(cuda, "auto", n_params=7_000_000) == torch.float32  # launch-bound
    assert weight_dtype(cuda, "float16") == torch.float16
    with pytest.raises(ValueError, match="--dtype bfloat16 on the CPU"):
        weight_dtype(cpu, "bfloat16")
    model = tiny_model(16, seed=0)
    with pytest.raises(ValueError, match="int8 runs on the CPU only"):
        should_quantize("int8", model, device=cuda)
    assert not should_quantize("auto", model, target_params=10**9, device=cuda)
    assert should_quantize("auto", model, target_params=10**9, device=cpu)


def test_cli_refuses_a_missing_gpu_in_one_line():
    if CUDA:
        pytest.skip("a GPU is present")
    run = subprocess.run([sys.executable, "-m", "spectest", "generate", "--device", "cuda",
                          "--max-tokens", "2"], capture_output=True, text=True, timeout=120)
    assert run.returncode == 2
    assert run.stderr.strip().count("\n") == 0 and "--device cuda" in run.stderr


def test_host_data_crosses_once_and_comes_back_in_one_fetch():
    tensors = (torch.tensor([3, 1]), torch.tensor([[0.5, -1.25]]), torch.zeros(2, 0))
    with HostSyncCounter() as syncs:
        back = fetch(*tensors)
    assert syncs.count == 1
    assert back[0].dtype == np.int64 and back[0].tolist() == [3, 1]
    assert back[1].tolist() == [[0.5, -1.25]] and back[2].shape == (2, 0)
    moved = to_device([[1, 2]], torch.device("cpu"))
    assert moved.dtype == torch.int64 and moved.device.type == "cpu"


# --- placement ---------------------------------------------------------------------------------
@pytest.mark.parametrize("device", DEVICES)
def test_every_tensor_of_a_built_engine_is_on_its_device(device):
    engine = build_engine("embedded", drafter="draft-model", max_num_seqs=2,
                          max_model_len=256, device=device)
    want = torch.device(device).type
    draft = engine.drafter.model
    tensors = [*engine.target.parameters(), *engine.target.buffers(), *draft.parameters(),
               engine.cache.k, engine.cache.v, engine.drafter.cache.k]
    assert {t.device.type for t in tensors if t is not None} == {want}
    assert engine.place.device.type == want
    out = _generate(engine, [_request(engine, 0.8, seed=1), _request(engine)])
    assert all(len(tokens) == 24 for tokens in out.values())


def test_no_round_relies_on_torchs_default_device(engines):
    """With the default device ``meta``, any tensor the engine makes without naming its device
    is a meta tensor and the round fails: greedy, sampled, logprobs, penalties, every drafter."""
    reqs = lambda e: [_request(e, 0.8, seed=3), _request(e, logprobs=2),  # noqa: E731
                      _request(e, 0.7, seed=4, presence_penalty=0.5,
                               logit_bias=((5, 2.0),))]
    expected = {d: list(_generate(e, reqs(e)).values()) for d, e in engines.items()}
    torch.set_default_device("meta")
    try:
        got = {d: list(_generate(e, reqs(e)).values()) for d, e in engines.items()}
    finally:
        torch.set_default_device(None)
    assert got == expected


@pytest.mark.parametrize("device", DEVICES)
def test_sampling_generators_live_on_the_engines_device_and_reproduce(device, engines):
    engine = engines["draft-model"] if device == "cpu" else build_engine(
        "embedded", max_num_seqs=2, max_model_len=256, device=device)
    seen = []
    original = engine.scheduler.submit

    def spy(request, on_output, generator=None, decoder=None):
        seen.append(generator)
        return original(request, on_output, generator, decoder)

    engine.scheduler.submit = spy
    try:
        first = _generate(engine, [_request(engine, 0.9, seed=7)])
        again = _generate(engine, [_request(engine, 0.9, seed=7)])
    finally:
        del engine.scheduler.submit
    assert [g.device.type for g in seen] == [torch.device(device).type] * 2
    assert list(first.values()) == list(again.values())
    gen = Placement(torch.device(device)).generator(5)
    assert torch.rand(3, generator=gen, device=device).device.type == torch.device(device).type


# --- host syncs --------------------------------------------------------------------------------
def test_the_counter_counts_reads_and_data_dependent_operators():
    x = torch.arange(6.0)
    with HostSyncCounter() as syncs:
        int(x[0]), x.tolist(), bool((x > 2).any()), x[x > 2], (x > 1).nonzero(), x.numpy()
        y = x * 2 + 1  # device work, no read
        np.asarray([1, 2]).sum()  # host work, no tensor
    assert syncs.count == 6, syncs.describe()
    assert y.shape == (6,)


def _steady_rounds(engine, requests, rounds=3) -> list[HostSyncCounter]:
    for r in requests:
        engine.submit(r, lambda o: None)
    engine.step()  # admissions (a prefill waits once per request for its first token)
    counted = []
    for _ in range(rounds):
        with HostSyncCounter() as syncs:
            engine.step()
        counted.append(syncs)
    engine.run_until_idle()
    return counted


@pytest.mark.parametrize("drafter", ["none", "draft-model", "ngram", "ngram+draft-model"])
def test_a_round_waits_for_the_device_once(engines, drafter):
    """Greedy, sampled, logprobs and penalties in one batch: one wait per round, the fetch of
    the accept decision."""
    engine = engines[drafter]
    reqs = [_request(engine), _request(engine, 0.8, seed=1, logprobs=3),
            _request(engine, 0.6, seed=2, frequency_penalty=0.3, repetition_penalty=1.2)]
    for syncs in _steady_rounds(engine, reqs):
        assert syncs.count == 1, syncs.describe()
        assert "device.py" in syncs.events[0].where


def test_a_prefill_waits_once_per_request(engines):
    engine = engines["draft-model"]
    for r in [_request(engine), _request(engine, 0.8, seed=1, logprobs=2)]:
        engine.submit(r, lambda o: None)
    with HostSyncCounter() as syncs:
        engine.step()  # two prefills and the first round
    engine.run_until_idle()
    assert syncs.count == 3, syncs.describe()


def test_an_eagle_round_waits_once():
    tok = tiny_tokenizer(12)
    target = tiny_model(12, seed=1, layers=2)
    eagle = random_eagle(target, n_slots=4, max_len=128)
    engine = make_engine(target, tok, drafter=HybridDrafter(NGramDrafter(4, 3), eagle),
                         max_num_seqs=4, max_model_len=128)
    reqs = [GenerationRequest(uuid.uuid4().hex, (1, 2, 3, 4), SamplingParams(
        max_tokens=30, ignore_eos=True, temperature=t, seed=i)) for i, t in enumerate((0, 1))]
    for syncs in _steady_rounds(engine, reqs):
        assert syncs.count == 1, syncs.describe()


def test_a_confidence_stop_reads_the_draft_each_step(engines):
    """The confidence policy decides on the draft's probability: a wait per draft step, the
    price the policy's doc states; the fixed policies do not pay it."""
    engine = engines["draft-model"]
    engine.policy = ConfidenceK(k_max=4, threshold=0.0)
    try:
        counted = _steady_rounds(engine, [_request(engine)])
    finally:
        engine.policy = FixedK(4)
    assert all(1 < s.count <= 1 + 4 for s in counted), [s.describe() for s in counted]


@pytest.mark.parametrize("drafter", ["none", "draft-model", "ngram"])
def test_attention_takes_the_kernels_output_in_any_layout(engines, drafter, monkeypatch):
    """A GPU attention kernel may return [B, H, T, hd] laid out as [B, T, H, hd] (CUDA's
    memory-efficient kernel does). The CPU's is contiguous, so here the kernel is wrapped to
    return that layout: the same values, and so the same tokens, with no ``view`` that fails."""
    engine = engines[drafter]
    reqs = lambda: [_request(engine), _request(engine, 0.8, seed=1),  # noqa: E731
                    _request(engine, max_tokens=12)]
    expected = list(_generate(engine, reqs()).values())
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def gpu_layout(*args, **kwargs):
        out = sdpa(*args, **kwargs)  # [..., H, T, hd]
        return out.transpose(-3, -2).contiguous().transpose(-3, -2)
    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", gpu_layout)
    assert list(_generate(engine, reqs()).values()) == expected
