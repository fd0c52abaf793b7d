"""``spectest train-eagle``: an EAGLE head for SmolLM2-135M-Instruct, trained on its features.

Owns: the recipe (:class:`EagleRecipe`); :func:`chain_forward`, the head unrolled ``depth``
drafting steps over whole sequences at once — step j at base position i reads the head's own
guess from step j−1 (not the target's feature), attending to the target's pairs up to i and
to its own earlier steps at i, exactly the cache a j-th draft sees in the engine ("training-
time test", as EAGLE-3 / HASS train); the loss (smooth-L1 to the target's next feature plus
cross-entropy to the target's next-token distribution, both through the target's LM head cut
to SmolLM2's most frequent answer tokens); held-out figures (teacher-forced first-draft
agreement, per-step acceptance and mean accepted length of K-token greedy chains); and
writing the head (``engine.eagle`` layout) with a model card.

Does not know: serving. SmolLM2's sequences come from ``training.teacher`` (the cache
``spectest train-draft`` writes), its features from ``training.eagle_data``.
Deterministic for a seed and thread count.
"""

from __future__ import annotations

import json
import random
import shutil
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import save_file

from spectest.engine.eagle import EAGLE_KEY, EagleHead, eagle_config, eagle_state
from spectest.engine.model import ModelConfig, rotate_half
from spectest.training import distill
from spectest.training.card import cpu_name
from spectest.training.eagle_data import FeatureData, target_features


@dataclass(frozen=True)
class EagleRecipe:
    seed: int = 0
    depth: int = 3  # drafting steps unrolled in training
    epochs: int = 4
    batch_tokens: int = 4096  # padded tokens per step
    lr: float = 2e-3
    feature_weight: float = 1.0  # smooth-L1 to the next feature
    token_weight: float = 0.5  # cross-entropy to the target's next-token distribution
    noise: float = 0.1  # uniform noise on the target's features (EAGLE's augmentation)
    eval_k: int = 4
    # SmolLM2's answers to learn from: train-draft's prompts by default (its cached answers
    # are reused). More data did not help: 5,155 sequences (qa 1500, passages 450, open 1200,
    # code 750, corpus 600; 1.26M positions, 552k answer tokens, 2 epochs, 1.15x the steps)
    # gave held-out first-draft agreement chat / code / RAG 0.32 / 0.52 / 0.35 against this
    # recipe's 0.33 / 0.54 / 0.39 (benchmarks/models.py --pair smollm2, same session): the
    # one-layer head, not the data, is what limits it.
    corpus_prompts: int = 300
    qa_prompts: int = 500
    passage_prompts: int = 150
    open_prompts: int = 400
    code_prompts: int = 250
    quick_data: bool = False  # train-draft's quick prompt set (tests)

    @classmethod
    def quick(cls, seed: int = 0) -> "EagleRecipe":
        return cls(seed=seed, depth=2, epochs=1, batch_tokens=256, eval_k=2, quick_data=True)

    def teacher_recipe(self) -> distill.DraftRecipe:
        """The prompts SmolLM2 answers for this head (and the held-out set it is judged on)."""
        if self.quick_data:
            return distill.DraftRecipe.quick(self.seed)
        return replace(distill.DraftRecipe(seed=self.seed), corpus_prompts=self.corpus_prompts,
                       qa_prompts=self.qa_prompts, passage_prompts=self.passage_prompts,
                       open_prompts=self.open_prompts, code_prompts=self.code_prompts)


def init_head(cfg: ModelConfig, seed: int) -> EagleHead:
    torch.manual_seed(seed)
    head = EagleHead(eagle_config(cfg))
    with torch.no_grad():
        for name, param in head.named_parameters():
            if param.dim() == 2:
                torch.nn.init.normal_(param, std=0.02)
            elif name.endswith("bias"):
                param.zero_()
        head.fc.weight[:, :cfg.hidden_size] += torch.eye(cfg.hidden_size)  # starts as f_i
    return head


def chain_forward(head: EagleHead, features: torch.Tensor, embeds: torch.Tensor,
                  depth: int) -> list[torch.Tensor]:
    """The head's guesses for ``depth`` drafting steps from every base position.

    features [B, L, D]: the target's features f_0..f_{L-1}; embeds [B, L, D]: embeddings of
    x_0..x_{L-1}. Returns ``depth`` tensors [B, L, D]: step j's guess at base i is of
    f_{i+j+1}, made from the pair (step j−1's guess of f_{i+j} — the target's f_i for j = 0 —,
    x_{i+j+1}) at position i + j. Positions past a sequence's end compute garbage the caller
    masks. Right padding is safe: no real query attends to a later key.
    """
    B, L, D = features.shape
    layer = head.layers[0]
    attn = layer.self_attn
    H, H_kv, hd = attn.n_heads, attn.n_kv, attn.head_dim
    causal = torch.ones(L, L, dtype=torch.bool).tril()  # [L, L] step 0: the target's pairs
    eye = torch.eye(L, dtype=torch.bool)  # later steps: its own guesses at the same base
    keys, values, guesses = [], [], []
    current = features
    for j in range(depth):
        nxt = torch.cat([embeds[:, j + 1:], embeds.new_zeros(B, j + 1, D)], dim=1)  # x_{i+j+1}
        x = head.fc(torch.cat([current, nxt], dim=-1))  # [B, L, D]
        h = layer.input_layernorm(x)
        q = attn.q_proj(h).unflatten(-1, (H, hd))  # [B, L, H, hd]
        k = attn.k_proj(h).unflatten(-1, (H_kv, hd))
        v = attn.v_proj(h).unflatten(-1, (H_kv, hd))
        cos, sin = head.rotary((torch.arange(L) + j).expand(B, L), tables=False)
        cos, sin = cos.unsqueeze(2).to(q.dtype), sin.unsqueeze(2).to(q.dtype)  # [B, L, 1, hd]
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        keys.append(k.transpose(1, 2))
        values.append(v.transpose(1, 2))  # [B, H_kv, L, hd]
        mask = torch.cat([causal] + [eye] * j, dim=1)  # [L, (j+1)·L]
        out = F.scaled_dot_product_attention(
            q.transpose(1, 2), torch.cat(keys, dim=2), torch.cat(values, dim=2),
            attn_mask=mask, enable_gqa=H != H_kv)  # [B, H, L, hd]
        x = x + attn.o_proj(out.transpose(1, 2).reshape(B, L, H * hd))
        x = x + layer.mlp(layer.post_attention_layernorm(x))
        guesses.append(x)
        current = x
    return guesses


def chain_loss(head: EagleHead, lm_weight: torch.Tensor, features, embeds, valid,
               r: EagleRecipe, generator: torch.Generator) -> tuple[torch.Tensor, float]:
    """features/embeds [B, L, D]; valid [B, L] (real positions); lm_weight [N, D] the cut
    head. Returns the loss and step 0's top-1 agreement with the target on this batch."""
    noisy = features + (torch.rand(features.shape, generator=generator) - 0.5) * 2 * r.noise
    guesses = chain_forward(head, noisy, embeds, r.depth)
    total, agree = 0.0, 0.0
    for j, guess in enumerate(guesses):
        shift = j + 1
        target = features[:, shift:]  # [B, L-shift, D] f_{i+j+1}
        mask = valid[:, shift:]  # [B, L-shift]
        g = guess[:, :-shift][mask]  # [n, D]
        t = target[mask]
        with torch.no_grad():
            target_logp = (t @ lm_weight.T).float().log_softmax(-1)  # [n, N]
        logp = (g @ lm_weight.T).float().log_softmax(-1)
        token = -(target_logp.exp() * logp).sum(-1).mean()
        feature = F.smooth_l1_loss(g.float(), t.float())
        total = total + (r.feature_weight * feature + r.token_weight * token) / r.depth
        if j == 0:
            agree = float((logp.argmax(-1) == target_logp.argmax(-1)).float().mean())
    return total, agree


def _batches(data: FeatureData, batch_tokens: int, rng: random.Random) -> list[list[int]]:
    order = sorted(range(len(data.tokens)), key=lambda i: len(data.tokens[i]))
    batches, current = [], []
    for i in order:
        width = len(data.tokens[i])  # sorted: the newest is the widest
        if current and width * (len(current) + 1) > batch_tokens:
            batches.append(current)
            current = []
        current.append(i)
    if current:
        batches.append(current)
    rng.shuffle(batches)
    return batches


def _collate(data: FeatureData, idx: list[int], embed: torch.nn.Embedding):
    L = max(len(data.tokens[i]) for i in idx)
    D = data.features[idx[0]].shape[-1]
    features = torch.zeros(len(idx), L, D)
    tokens = torch.zeros(len(idx), L, dtype=torch.long)
    valid = torch.zeros(len(idx), L, dtype=torch.bool)
    for b, i in enumerate(idx):
        n = len(data.tokens[i])
        features[b, :n], tokens[b, :n], valid[b, :n] = data.features[i].float(), \
            data.tokens[i], True
    with torch.no_grad():
        embeds = embed(tokens)
    return features, embeds, valid


def train(head: EagleHead, data: FeatureData, embed: torch.nn.Embedding,
          lm_weight: torch.Tensor, r: EagleRecipe, progress=print) -> tuple[EagleHead, float]:
    rng = random.Random(f"spectest-eagle:batches:{r.seed}")
    generator = torch.Generator().manual_seed(r.seed)
    epochs = [_batches(data, r.batch_tokens, rng) for _ in range(r.epochs)]
    steps = sum(len(e) for e in epochs)
    opt = torch.optim.AdamW(head.parameters(), lr=r.lr, betas=(0.9, 0.95), weight_decay=0.0)
    sched = distill.warmup_cosine(opt, steps, warmup=max(1, steps // 30), floor=0.05)
    head.train()
    started, losses, agrees, step = time.perf_counter(), [], [], 0
    for epoch, batches in enumerate(epochs):
        for idx in batches:
            features, embeds, valid = _collate(data, idx, embed)
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss, agree = chain_loss(head, lm_weight, features, embeds, valid, r, generator)
            distill.update(head, opt, sched, loss)
            losses.append(loss.item())
            agrees.append(agree)
            step += 1
            if step % 20 == 0 or step == steps:
                elapsed = time.perf_counter() - started
                progress(f"train-eagle: epoch {epoch + 1}/{r.epochs} step {step}/{steps} loss "
                         f"{sum(losses[-20:]) / len(losses[-20:]):.3f} first-draft agreement "
                         f"{sum(agrees[-20:]) / len(agrees[-20:]):.3f}, {elapsed:.0f} s, "
                         f"~{elapsed / step * (steps - step):.0f} s left")
    return head.eval().requires_grad_(False), time.perf_counter() - started


@torch.inference_mode()
def heldout_figures(head: EagleHead, data: FeatureData, embed: torch.nn.Embedding,
                    lm_weight: torch.Tensor, head_ids: torch.Tensor, k: int) -> dict[str, dict]:
    """Per source, over SmolLM2's answer tokens: the first draft's agreement with SmolLM2's
    greedy token (teacher-forced), and for greedy K-token chains drafted from every answer
    position, the mean number accepted and the per-token acceptance (accepted / proposed)."""
    out: dict[str, list[float]] = {}
    for source, tokens, n_answer, feats in zip(data.sources, data.tokens, data.answer_lens,
                                               data.features):
        L = len(tokens)
        if n_answer < 2:
            continue
        guesses = chain_forward(head, feats.float()[None], embed(tokens[None]), k)
        picks = torch.stack([head_ids[(g[0] @ lm_weight.T).argmax(-1)] for g in guesses])  # [k, L]
        # a chain from base i drafts x_{i+2}…: it drafts answer tokens when i + 2 ≥ prompt end
        first_base = L - n_answer - 1
        bases = torch.arange(max(0, first_base), L - 2)
        hits = torch.zeros(len(bases), k, dtype=torch.bool)
        for j in range(k):
            where = bases + j + 2
            ok = where < L
            hits[ok, j] = picks[j, bases[ok]] == tokens[where[ok]]
        accepted = hits.long().cumprod(dim=1).sum(dim=1).float()  # [n] leading hits
        s = out.setdefault(source, [0.0, 0.0, 0.0])
        s[0] += float(hits[:, 0].sum())
        s[1] += float(accepted.sum())
        s[2] += len(bases)
    return {source: {"first_draft_agreement": round(a / max(n, 1), 4),
                     f"mean_accepted_k{k}": round(m / max(n, 1), 3),
                     "per_token_acceptance": round(m / max(n, 1) / k, 4), "positions": int(n)}
            for source, (a, m, n) in sorted(out.items())}


def save_head(out: Path, head: EagleHead, head_ids: list[int], figures: dict,
              target_name: str) -> None:
    """config.json + model.safetensors + head_tokens.json + card, moved into place at once."""
    from spectest.training.card import write_eagle_card
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    hf = head.config.to_hf("LlamaForCausalLM")
    hf.update({EAGLE_KEY: {"feature": "final-norm", "target": target_name,
                           "lm_head": "the target's, cut to head_tokens.json"},
               "torch_dtype": "float16"})
    (tmp / "config.json").write_text(json.dumps(hf, indent=2))
    save_file(eagle_state(head), str(tmp / "model.safetensors"), metadata={"format": "pt"})
    distill.finish_folder(tmp, out, head_ids, figures, write_eagle_card)


def _features(model, data, cache: Path | None, what: str, progress
              ) -> tuple[FeatureData, bool]:
    """SmolLM2's features over ``data`` and whether they came from ``cache`` (used when it
    holds exactly these sequences; computed and written there otherwise)."""
    if cache is not None and cache.is_file():
        cached = FeatureData.load(cache)
        if len(cached.tokens) == len(data.tokens) and all(
                torch.equal(have, want.long()[-len(have):])
                for have, want in zip(cached.tokens, data.tokens)):
            progress(f"train-eagle: SmolLM2's features of the {what} from {cache}")
            return cached, True
        progress(f"train-eagle: {cache} holds other sequences; computing the features again")
    features = target_features(model, data, progress=progress)
    if cache is not None:
        features.save(cache)
    return features, False


def train_smollm2_eagle(out: Path, r: EagleRecipe, teacher_cache: Path | None = None,
                        feature_cache: Path | None = None, progress=print) -> dict:
    """SmolLM2's answers (``train-draft``'s prompts and cache), its features, the head trained
    on them, held-out figures, and the head written to ``out``."""
    t0 = time.perf_counter()
    target = distill.load_teacher()
    tok = target.tokenizer
    draft_recipe = r.teacher_recipe()
    data, gen_s = distill.teacher_answers(target, draft_recipe, teacher_cache, progress)
    f0 = time.perf_counter()
    features, reused = _features(target.model, data, feature_cache, "training sequences",
                                 progress)
    held = distill.heldout_data(target, draft_recipe, progress)
    held_features = target_features(target.model, held, progress=lambda _: None)
    feature_s = time.perf_counter() - f0
    head_ids = distill.head_token_ids(data, draft_recipe.head_tokens, tuple(tok.eos_token_ids))
    ids = torch.tensor(head_ids)
    embed = target.model.embed_tokens  # int8 keeps it in float; SmolLM2's head is tied to it
    lm_weight = embed.weight[ids].detach()  # [N, D]
    head = init_head(target.model.config, r.seed)
    before = heldout_figures(head.eval(), held_features, embed, lm_weight, ids, r.eval_k)
    head, train_s = train(head, features, embed, lm_weight, r, progress)
    after = heldout_figures(head, held_features, embed, lm_weight, ids, r.eval_k)
    figures = {
        "recipe": asdict(r), "threads": torch.get_num_threads(), "cpu": cpu_name(),
        "params": sum(p.numel() for p in head.parameters()),
        "train_sequences": len(features.tokens), "train_positions": features.positions,
        "answer_tokens": data.answer_tokens, "head_tokens": len(head_ids),
        "heldout": after, "heldout_before_training": before,
        "heldout_prompts_per_workload": draft_recipe.heldout_prompts,
        "heldout_tokens": draft_recipe.heldout_tokens,
        "teacher_seconds": round(gen_s, 1), "feature_seconds": round(feature_s, 1),
        "features_reused": reused,
        "train_seconds": round(train_s, 1), "total_seconds": round(time.perf_counter() - t0, 1),
    }
    save_head(out, head, head_ids, figures, "SmolLM2-135M-Instruct")
    progress("train-eagle: wrote " + str(out) + " — held-out first-draft agreement "
             + ", ".join(f"{s} {v['first_draft_agreement']}" for s, v in after.items()))
    return figures
