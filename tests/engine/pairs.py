"""Model pairs for the engine tests: the embedded pair, and tiny random pairs on a tiny vocab.

The embedded pair is what users run (trained by ``spectest train-demo-models`` and committed);
the tiny pairs give distributions spread over few tokens, so statistical tests over the whole
engine path need only thousands of requests.
"""

from __future__ import annotations

import os
from collections import Counter, defaultdict
from pathlib import Path

import torch
from scipy import stats
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import models, pre_tokenizers

from spectest.engine.api import MODELS_DIR
from spectest.engine.drafters import (DraftModelDrafter, HybridDrafter, NGramDrafter,
                                      NoDrafter)
from spectest.engine.engine import EngineConfig, SpecEngine
from spectest.engine.loader import load_checkpoint
from spectest.engine.model import ModelConfig, Transformer
from spectest.engine.policies import FixedK
from spectest.engine.scheduler import SchedulerConfig
from spectest.engine.tokenizer import Tokenizer


def embedded_dir() -> Path:
    return Path(os.environ.get("SPECTEST_TEST_MODELS", MODELS_DIR))


def load_embedded():
    root = embedded_dir()
    return load_checkpoint(root / "target"), load_checkpoint(root / "draft")


def tiny_tokenizer(vocab: int) -> Tokenizer:
    """Word-level tokens t0 … t{V-1}; the last one is EOS."""
    words = {f"t{i}": i for i in range(vocab)}
    backend = HFTokenizer(models.WordLevel(words, unk_token="t0"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    return Tokenizer(backend, eos_token_ids=(vocab - 1,))


def tiny_model(vocab: int, seed: int, layers: int = 1, dim: int = 32, scale: float = 0.5):
    torch.manual_seed(seed)
    cfg = ModelConfig(vocab_size=vocab, hidden_size=dim, intermediate_size=2 * dim,
                      num_hidden_layers=layers, num_attention_heads=2, num_key_value_heads=1,
                      head_dim=dim // 2, max_position_embeddings=512)
    model = Transformer(cfg)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() >= 2:
                p.normal_(0, scale)
    return model.eval()


def random_eagle(target, seed: int = 0, scale: float = 0.05, head_ids=None, int8=False,
                 n_slots: int = 8, max_len: int = 512):
    """An untrained EAGLE head for ``target`` (random weights) in a drafter."""
    from spectest.engine.eagle import EagleDrafter
    from spectest.training.eagle import init_head
    head = init_head(target.config, seed)
    with torch.no_grad():
        for p in head.parameters():
            if p.dim() >= 2:
                p.add_(torch.randn_like(p) * scale)
    ids = tuple(range(target.config.vocab_size)) if head_ids is None else head_ids
    return EagleDrafter(head.eval(), target, ids, n_slots, max_len, int8=int8)


def make_engine(target, tokenizer, drafter="draft-model", draft=None, policy=None,
                max_num_seqs=8, max_model_len=512, faults=frozenset(), max_waiting=10_000,
                prefix_cache_tokens=0, fault_after=1500):
    config = EngineConfig(SchedulerConfig(max_num_seqs=max_num_seqs, max_model_len=max_model_len,
                                          max_waiting=max_waiting, spec_slots=9),
                          faults=frozenset(faults), prefix_cache_tokens=prefix_cache_tokens,
                          fault_after=fault_after)
    if not isinstance(drafter, str):  # a drafter built by the caller
        d = drafter
    elif drafter == "draft-model":
        d = DraftModelDrafter(draft, max_num_seqs, max_model_len)
    elif drafter == "ngram":
        d = NGramDrafter(4, 1)
    elif drafter == "ngram+draft-model":  # one-token matches: both halves draft often
        d = HybridDrafter(NGramDrafter(4, 1), DraftModelDrafter(draft, max_num_seqs,
                                                                max_model_len), model_k=3)
    else:
        d = NoDrafter()
    return SpecEngine(target, tokenizer, d, policy or FixedK(4), config)


def pooled_pvalue(dist_of, sequences, position: int, vocab: int) -> float:
    """G-test of the token at ``position`` given the tokens before it, pooled over prefixes
    (sum of per-prefix G statistics, χ² with the summed degrees of freedom). ``dist_of(prefix)``
    is the exact distribution [V] (float64) the token should follow after ``prefix``."""
    groups: dict[tuple, Counter] = defaultdict(Counter)
    for seq in sequences:
        groups[tuple(seq[:position])][seq[position]] += 1
    g_total, df_total = 0.0, 0
    for prefix, counts in groups.items():
        n = sum(counts.values())
        if n < 20:
            continue
        probs = dist_of(prefix)
        observed = torch.tensor([counts[t] for t in range(vocab)], dtype=torch.float64)
        if bool(((probs == 0) & (observed > 0)).any()):
            return 0.0  # a token the target can never emit here
        keep = probs * n >= 5
        obs = torch.cat([observed[keep], observed[~keep].sum(0, keepdim=True)])
        exp = torch.cat([probs[keep] * n, (probs[~keep] * n).sum(0, keepdim=True)])
        if exp[-1] == 0:
            obs, exp = obs[:-1], exp[:-1]
        if len(exp) < 2:
            continue
        exp = exp * obs.sum() / exp.sum()
        g, _ = stats.power_divergence(obs.numpy(), exp.numpy(), lambda_="log-likelihood")
        g_total += float(g)
        df_total += len(exp) - 1
    return float(stats.chi2.sf(g_total, df_total))
