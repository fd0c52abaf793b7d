"""The audit's settings: defaults, an optional config file, and command-line overrides.

Owns: :class:`AuditSettings` (every knob and threshold, with its default), reading a config file
(TOML or JSON, keys spelled like the long flags, dashes or underscores, unknown keys refused)
and the precedence rule: command line > config file > defaults.

Does not know: HTTP, statistics or argparse (``cli`` turns flags into a dict of overrides).
"""

from __future__ import annotations

import json
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path

from pydantic import ConfigDict, TypeAdapter, ValidationError

from spectest import flavours
from spectest.audit.distribution import SamplingSpec
from spectest.audit.logprobs import Thresholds
from spectest.audit.samples import AuditError

CHECKS = ("greedy", "logprobs", "distribution")
EMBEDDED = "embedded"
# the conditions an audit's checks run under (``spectest.audit.conditions``), and the profiles
CONDITIONS = ("base", "load", "prefix-reuse", "long", "params", "preemption")
PROFILES = {"default": ("base",), "full": CONDITIONS}


@dataclass(frozen=True)
class AuditSettings:
    __pydantic_config__ = ConfigDict(extra="forbid")

    candidate: str = EMBEDDED
    baseline: str = EMBEDDED
    candidate_model: str | None = None
    baseline_model: str | None = None
    candidate_extra: dict = field(default_factory=dict)
    baseline_extra: dict = field(default_factory=dict)
    candidate_flavour: str | None = None  # None: detected (spectest.flavours)
    baseline_flavour: str | None = None
    scoring: str = "auto"  # auto | echo | generation (spectest.audit.scoring)
    prompt_format: str = "auto"  # auto | token-ids | text
    api_key: str | None = None
    # prompts
    prompts: str = "mixed"
    num_prompts: int = 32
    max_prompt_tokens: int = 192
    # sizes
    greedy_tokens: int = 48
    samples_per_prompt: int = 8
    sample_tokens: int = 32
    logprobs: int = 20
    ignore_eos: bool = True
    # sampling for the distribution test
    temperature: float = 0.5
    top_p: float = 0.95
    top_k: int = 20
    # thresholds
    alpha: float = 0.01
    tie_tolerance: float = 0.01
    support_tolerance: float = 1e-4
    max_greedy_divergences: int = 0
    max_kl: float = 0.01
    mean_kl: float = 0.001
    max_abs_logprob: float = 0.1
    max_top1_disagreement: float = 0.01
    mismatch_tolerance: float = 0.2
    noise_floor: bool = True  # widen tolerances to the baseline's own disagreement (noise.py)
    # judge sampled tokens against the baseline's own samples (two_sample.py): auto = where the
    # noise floor widened the tolerances or was not measured; on; off (against the scoring)
    sampled_control: str = "auto"
    checks: tuple[str, ...] = CHECKS
    # conditions (spectest.audit.conditions): the profile's, or these named ones
    profile: str = "default"
    conditions: tuple[str, ...] = ()
    load_concurrency: int = 8  # background requests in flight under the load condition
    load_prompts: int = 8  # audited prompts under load (greedy + sampled)
    load_workload: str = "mixed"  # the background traffic's records: a dataset, as ``prompts``
    prefix_prompts: int = 6  # prompts sharing one long prefix (prefix-reuse)
    prefix_tokens: int = 384  # the shared prefix's length
    long_tokens: int = 512  # greedy continuation length (long)
    long_prompts: int = 3  # prompts continued for long_tokens
    long_prompt_tokens: int = 2048  # long prompts (RAG passages), context permitting
    turns: int = 4  # user turns of the multi-turn history (long)
    params_prompts: int = 6  # prompts a rung of the sampling-parameter ladder uses
    params_samples: int = 4  # sampled continuations per prompt and side on a rung
    params_tokens: int = 24  # tokens per rung continuation
    preemption_requests: int = 12  # long requests sent at once to overflow the KV cache
    preemption_tokens: int = 320
    # the candidate: a command that restarts it when it dies (run in a shell), and how long to
    # wait for it to answer again before the rest of the audit is "not run"
    candidate_restart: str | None = None
    revive_timeout: float = 240.0
    # running
    seed: int = 0
    concurrency: int = 8
    timeout: float = 120.0
    out: str = "audit-report"
    progress: bool = True
    # the bundled server, when --candidate/--baseline is "embedded"
    embedded_model: str = "embedded"
    embedded_draft: str = "auto"
    embedded_drafter: str = "draft-model"
    embedded_k: int | None = None  # None: the model's measured default (engine.api.default_k)
    embedded_threads: int | None = 1
    # KV positions an embedded server's running requests may hold together (spectest serve
    # --kv-budget-tokens): small enough that the preemption condition makes it preempt
    embedded_kv_budget: int | None = 4096
    embedded_device: str = "auto"  # spectest serve --device: auto, cpu or cuda

    def __post_init__(self):
        problems = []
        for name in ("num_prompts", "greedy_tokens", "samples_per_prompt", "sample_tokens",
                     "concurrency", "max_prompt_tokens", "embedded_k", "load_concurrency",
                     "load_prompts", "prefix_prompts", "prefix_tokens", "long_tokens",
                     "long_prompts", "long_prompt_tokens", "turns", "params_prompts",
                     "params_samples", "params_tokens", "preemption_requests",
                     "preemption_tokens", "embedded_kv_budget"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                problems.append(f"{name.replace('_', '-')} must be >= 1")
        if not 1 <= self.logprobs <= 20:
            problems.append("logprobs must be in 1..20 (the OpenAI limit)")
        if not 0 < self.alpha < 1:
            problems.append("alpha must be in (0, 1)")
        for name in ("tie_tolerance", "support_tolerance", "max_kl", "mean_kl",
                     "max_abs_logprob", "max_top1_disagreement", "mismatch_tolerance",
                     "max_greedy_divergences"):
            if getattr(self, name) < 0:
                problems.append(f"{name.replace('_', '-')} must be >= 0")
        if self.timeout <= 0:
            problems.append("timeout must be > 0")
        for name, value in (("candidate_flavour", self.candidate_flavour),
                            ("baseline_flavour", self.baseline_flavour)):
            if value is not None and value not in flavours.BY_KEY:
                problems.append(f"{name.replace('_', '-')} must be one of "
                                f"{', '.join(flavours.BY_KEY)}")
        if self.scoring not in ("auto", "echo", "generation"):
            problems.append("scoring must be auto, echo or generation")
        if self.sampled_control not in ("auto", "on", "off"):
            problems.append("sampled-control must be auto, on or off")
        if self.prompt_format not in ("auto", "token-ids", "text"):
            problems.append("prompt-format must be auto, token-ids or text")
        unknown = set(self.checks) - set(CHECKS)
        if unknown or not self.checks:
            problems.append(f"checks must be a non-empty subset of {', '.join(CHECKS)}")
        if self.profile not in PROFILES:
            problems.append(f"profile must be one of {', '.join(PROFILES)}")
        if set(self.conditions) - set(CONDITIONS):
            problems.append(f"conditions must be a subset of {', '.join(CONDITIONS)}")
        if self.revive_timeout < 0:
            problems.append("revive-timeout must be >= 0")
        if problems:
            raise AuditError("bad settings: " + "; ".join(problems))
        if "distribution" in self.checks:
            self.sampling.check(self.logprobs)

    @property
    def sampling(self) -> SamplingSpec:
        return SamplingSpec(self.temperature, self.top_p, self.top_k)

    @property
    def logprob_thresholds(self) -> Thresholds:
        return Thresholds(self.max_kl, self.mean_kl, self.max_abs_logprob,
                          self.max_top1_disagreement)

    @property
    def planned(self) -> tuple[str, ...]:
        """The conditions this audit runs, in order: the named ones, else its profile's."""
        named = set(self.conditions) or set(PROFILES[self.profile])
        return tuple(c for c in CONDITIONS if c in named)

    @property
    def same_server(self) -> bool:
        return self.candidate.rstrip("/") == self.baseline.rstrip("/")

    def public(self) -> dict:
        """The settings as they go into the report (no API key)."""
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["api_key"] = "***" if self.api_key else None
        out["checks"] = list(self.checks)
        out["conditions"] = list(self.planned)
        return out


_ADAPTER = TypeAdapter(AuditSettings)
NAMES = tuple(f.name for f in fields(AuditSettings))


def read_config(path: str | Path) -> dict:
    """A TOML (``.toml``) or JSON file → a dict of settings with underscore keys."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise AuditError(f"config file {path}: {exc.strerror or exc}") from None
    try:
        data = json.loads(text) if path.suffix == ".json" else tomllib.loads(text)
    except (json.JSONDecodeError, tomllib.TOMLDecodeError) as exc:
        raise AuditError(f"config file {path}: not valid "
                         f"{'JSON' if path.suffix == '.json' else 'TOML'} ({exc})") from None
    if not isinstance(data, dict):
        raise AuditError(f"config file {path}: expected a table of settings")
    if isinstance(data.get("audit"), dict) and len(data) == 1:
        data = data["audit"]  # a [audit] table is accepted too
    return {str(k).replace("-", "_"): v for k, v in data.items()}


def resolve(config: Mapping | None, overrides: Mapping) -> AuditSettings:
    """Defaults ← config file ← command line; one readable AuditError on a bad value."""
    merged = dict(config or {})
    merged.update({k: v for k, v in overrides.items() if v is not None})
    try:
        settings = _ADAPTER.validate_python(merged)
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(x) for x in err["loc"]) or "settings"
        if err["type"] == "unexpected_keyword_argument" or err["type"] == "extra_forbidden":
            known = ", ".join(n.replace("_", "-") for n in NAMES)
            raise AuditError(f"unknown setting {where.replace('_', '-')!r} (known: {known})") \
                from None
        raise AuditError(f"setting {where.replace('_', '-')}: {err['msg']}") from None
    return settings
