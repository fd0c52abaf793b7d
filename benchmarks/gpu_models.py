"""Benchmark: a decode step and a verify of K+1 tokens at realistic sizes, engine vs transformers.

What the speedup formula needs on a device — the target's step time, the verify(K+1) / step
ratio and the draft's step cost c = T_draft / T_target — for models of real architectures
built with random weights on the device (a step's time does not depend on the weights'
values, and no checkpoint has to travel): SmolLM2-135M's shape with the shape of its in-repo
draft (``spectest/models/smollm2-draft``), and Llama-3.2-1B's shape with a one-layer model of
the same shape as its draft (an EAGLE-sized head with the whole LM head), beside the embedded
pair's own checkpoints. Each is timed at batch 1 (and the step at batch 8) after a context of
``--context`` tokens, on the bundled engine as ``spectest serve`` runs it (prepared: fused
projections, plain-call layers; on a GPU bf16 for ≥ 50M parameters and decode / verify replayed
from CUDA graphs, beside the same forwards run eagerly) and on ``transformers`` (eager, SDPA, its
dynamic cache, same dtype and device). Medians of ``--reps`` timed calls after warm-up (the
captures); the device is synchronised around every call.

Prints one table (and ``--json``): per model and implementation, step ms at batch 1 and 8,
verify(K+1) ms, verify / step, and c for the drafts.

    python benchmarks/gpu_models.py [--device cuda|cpu|auto] [--models smollm2,llama-1b,embedded]
                                    [--context 512] [--k 4] [--reps 30] [--quick] [--json F]
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

from spectest.engine.api import MODELS_DIR
from spectest.engine.device import Placement
from spectest.engine.graphs import CapturedForwards
from spectest.engine.inference import prepare_for_inference
from spectest.engine.loader import load_checkpoint
from spectest.engine.model import ModelConfig, Transformer

SMOLLM2 = ModelConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536,
                      num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3,
                      head_dim=64, max_position_embeddings=8192, rope_theta=100000.0,
                      tie_word_embeddings=True)
LLAMA_1B = ModelConfig(vocab_size=128256, hidden_size=2048, intermediate_size=8192,
                       num_hidden_layers=16, num_attention_heads=32, num_key_value_heads=8,
                       head_dim=64, max_position_embeddings=131072, rope_theta=500000.0,
                       rope_scaling={"rope_type": "llama3", "factor": 32.0,
                                     "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                     "original_max_position_embeddings": 8192},
                       tie_word_embeddings=True)


def smollm2_draft_config() -> ModelConfig:
    cfg = json.loads((MODELS_DIR / "smollm2-draft" / "config.json").read_text()) \
        if (MODELS_DIR / "smollm2-draft" / "config.json").is_file() else None
    if cfg is None:  # its shape, if the checkpoint is not in this copy of the tree
        return replace(SMOLLM2, hidden_size=192, intermediate_size=768, num_hidden_layers=4,
                       num_attention_heads=3, num_key_value_heads=1)
    return ModelConfig.from_hf(cfg)


def pairs(quick: bool) -> dict[str, tuple[ModelConfig | str, ModelConfig | str]]:
    """name → (target, draft): a config (random weights) or an embedded checkpoint name."""
    if quick:  # the same architectures, shrunk: for checking this script on a CPU
        small = replace(SMOLLM2, num_hidden_layers=4, vocab_size=8192)
        return {"embedded": ("target", "draft"),
                "smollm2-shape (4 layers, 8k vocab)": (small, replace(small,
                                                                      num_hidden_layers=1))}
    return {"embedded": ("target", "draft"),
            "smollm2-135m": (SMOLLM2, smollm2_draft_config()),
            "llama-1b": (LLAMA_1B, replace(LLAMA_1B, num_hidden_layers=1))}


def build(spec, place: Placement, seed: int) -> Transformer:
    if isinstance(spec, str):
        model = load_checkpoint(MODELS_DIR / spec).model
    else:
        torch.manual_seed(seed)
        with torch.device(place.device):  # initialised where it runs: no host copy of 1B
            model = Transformer(spec)
        model.eval().requires_grad_(False)
        with torch.no_grad():
            for p in model.parameters():  # small weights: bf16 activations stay finite
                p.mul_(0.02 if p.dim() >= 2 else 1.0)
    n = model.config.parameter_count
    place = Placement(place.device, Placement.choose(str(place.device), "auto", n).dtype)
    return prepare_for_inference(model, place=place)


def timed(fn, place: Placement, reps: int, warmup: int = 3) -> float:
    """Median milliseconds of ``fn()``, the device synchronised around each call."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        place.synchronize()
        t0 = time.perf_counter()
        fn()
        place.synchronize()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


@torch.inference_mode()
def engine_ms(model: Transformer, place: Placement, batch: int, tokens: int, context: int,
              reps: int) -> float:
    cache = model.new_cache(batch, context + tokens + 8)
    ids = place.tokens(np.ones((batch, tokens), dtype=np.int64))
    slots = np.arange(batch)

    def step():
        cache.lengths[:batch] = context
        model(ids, cache, slots)

    return timed(step, place, reps)


@torch.inference_mode()
def hf_ms(hf, place: Placement, batch: int, tokens: int, context: int, reps: int) -> float:
    ids = torch.ones(batch, context, dtype=torch.long, device=place.device)
    cache = hf(ids, use_cache=True).past_key_values
    x = torch.ones(batch, tokens, dtype=torch.long, device=place.device)

    def step():
        extra = cache.get_seq_length() - context
        if extra > 0:
            cache.crop(-extra)  # drop the tokens the last call added (negative: a count)
        hf(x, past_key_values=cache, use_cache=True)

    return timed(step, place, reps)


def hf_twin(model: Transformer, spec):
    """A transformers LlamaForCausalLM of the same shape (eager modules, SDPA) in the same dtype:
    the checkpoint itself for an embedded model, random weights for a shape."""
    from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM
    dtype = model.embed_tokens.weight.dtype
    if isinstance(spec, str):
        return AutoModelForCausalLM.from_pretrained(MODELS_DIR / spec, dtype=dtype,
                                                    attn_implementation="sdpa").to(
            model.device).eval()
    cfg = model.config.to_hf()
    cfg.pop("architectures")
    with torch.device(model.device):
        hf = LlamaForCausalLM(LlamaConfig(**cfg, attn_implementation="sdpa"))
    return hf.to(dtype).eval()


def measure(name: str, spec, place: Placement, args, graphs: bool, seed: int) -> dict:
    model = build(spec, place, seed)
    weights = model.embed_tokens.weight
    row = {"model": name, "params_m": round(model.config.parameter_count / 1e6, 1),
           "dtype": str(weights.dtype).removeprefix("torch."), "device": place.describe()}
    runs = [("engine eager", None)]
    if graphs:
        runs.append(("engine graphs", CapturedForwards()))
    out = []
    for impl, captured in runs:
        model.graphs = captured
        r = dict(row, impl=impl)
        r["step_b1_ms"] = engine_ms(model, place, 1, 1, args.context, args.reps)
        r["verify_ms"] = engine_ms(model, place, 1, args.k + 1, args.context, args.reps)
        r["step_b8_ms"] = engine_ms(model, place, 8, 1, args.context, args.reps)
        if captured is not None:
            r["graphs"] = captured.stats()
        out.append(r)
    model.graphs = None
    if not args.skip_hf:
        try:
            hf = hf_twin(model, spec)
        except Exception as exc:  # noqa: BLE001 — reported, not fatal
            print(f"gpu_models: transformers twin of {name} failed: {exc}", file=sys.stderr)
            hf = None
        if hf is not None:
            r = dict(row, impl="transformers")
            r["step_b1_ms"] = hf_ms(hf, place, 1, 1, args.context, args.reps)
            r["verify_ms"] = hf_ms(hf, place, 1, args.k + 1, args.context, args.reps)
            r["step_b8_ms"] = hf_ms(hf, place, 8, 1, args.context, args.reps)
            out.append(r)
            del hf
    for r in out:
        r["verify_over_step"] = round(r["verify_ms"] / r["step_b1_ms"], 3)
        for key in ("step_b1_ms", "verify_ms", "step_b8_ms"):
            r[key] = round(r[key], 3)
    del model
    gc.collect()
    if place.cuda:
        torch.cuda.empty_cache()
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    ap.add_argument("--models", default=None,
                    help="comma-separated subset of the pairs (default all)")
    ap.add_argument("--context", type=int, default=512)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads (CPU runs)")
    ap.add_argument("--quick", action="store_true",
                    help="shrunk shapes, few repetitions: checks the script on a CPU")
    ap.add_argument("--skip-hf", action="store_true")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.quick:
        args.reps, args.context = min(args.reps, 5), min(args.context, 128)
    place = Placement.choose(args.device)
    table = pairs(args.quick)
    if args.models:
        table = {k: v for k, v in table.items() if k in args.models.split(",")}
    rows = []
    for i, (name, (target, draft)) in enumerate(table.items()):
        t_rows = measure(name, target, place, args, place.cuda, 2 * i)
        d_rows = measure(f"{name} draft", draft, place, args, place.cuda, 2 * i + 1)
        for t in t_rows:  # c = T_draft / T_target, implementation by implementation
            d = next((d for d in d_rows if d["impl"] == t["impl"]), None)
            if d is not None:
                d["c"] = round(d["step_b1_ms"] / t["step_b1_ms"], 3)
        rows += t_rows + d_rows
        print(f"gpu_models: {name} measured", file=sys.stderr, flush=True)
    import pandas as pd
    cols = ["model", "impl", "dtype", "params_m", "step_b1_ms", "verify_ms", "verify_over_step",
            "step_b8_ms", "c"]
    frame = pd.DataFrame(rows).reindex(columns=cols)
    print(f"== step and verify(K+1 = {args.k + 1}) at a {args.context}-token context, "
          f"{place.describe()}, medians of {args.reps} ==")
    print(frame.to_string(index=False, na_rep=""))
    if args.json:
        tmp = args.json.with_suffix(".tmp")
        tmp.write_text(json.dumps({"context": args.context, "k": args.k, "rows": rows},
                                  indent=1, default=str))
        tmp.replace(args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
