"""Draft-length (K) policies: how many tokens to draft this round.

Owns: the :class:`KPolicy` interface and five policies — fixed K; acceptance-window adaptive K;
confidence early exit; goodput-optimal K per batch size from a measured :class:`Profile`; and
"no speculation above batch size N" (a wrapper around any of them).

Does not know: models or requests. A policy sees the batch size before a round, may stop the
draft loop early from the draft's confidence, and observes each finished round's acceptance.
"""

from __future__ import annotations

import json
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

import torch

POLICIES = ("fixed", "adaptive", "confidence", "goodput")  # the names make_policy builds


@dataclass(frozen=True)
class ConfidenceStop:
    """Stop drafting when the batch-mean of the draft's max probability falls below a bar."""

    threshold: float

    def __call__(self, max_probs: torch.Tensor) -> bool:  # max_probs [B]
        return float(max_probs.mean()) < self.threshold


@dataclass(frozen=True)
class Decision:
    k: int
    reason: str


class KPolicy:
    name = "base"
    k_max = 0

    def choose(self, batch_size: int) -> Decision:
        raise NotImplementedError

    def stop_rule(self) -> ConfidenceStop | None:
        """The drafter's early exit for this policy (None: draft all K). Data, not a closure,
        so a drafter in another process can apply it too."""
        return None

    def observe(self, proposed: int, accepted: int) -> None:
        """Draft tokens proposed and accepted in the round just verified (all rows)."""


class FixedK(KPolicy):
    name = "fixed"

    def __init__(self, k: int):
        if k < 0:
            raise ValueError("k must be >= 0")
        self.k = self.k_max = k

    def choose(self, batch_size):
        return Decision(self.k, f"fixed k={self.k}")


class AdaptiveK(KPolicy):
    """Raise K when the rolling acceptance rate is high, lower it when low, within bounds."""

    name = "adaptive"

    def __init__(self, k_init: int = 4, k_min: int = 1, k_max: int = 8, window: int = 32,
                 raise_above: float = 0.75, lower_below: float = 0.45):
        if not 0 <= k_min <= k_init <= k_max:
            raise ValueError("need 0 <= k_min <= k_init <= k_max")
        self.k, self.k_min, self.k_max = k_init, k_min, k_max
        self.raise_above, self.lower_below = raise_above, lower_below
        self.history: deque[tuple[int, int]] = deque(maxlen=window)

    def rate(self) -> float | None:
        proposed = sum(p for p, _ in self.history)
        return sum(a for _, a in self.history) / proposed if proposed else None

    def choose(self, batch_size):
        return Decision(self.k, f"adaptive k={self.k} rate={self.rate()}")

    def observe(self, proposed, accepted):
        if proposed == 0:
            return
        self.history.append((proposed, accepted))
        if len(self.history) < self.history.maxlen // 4:
            return
        rate = self.rate()
        if rate >= self.raise_above and self.k < self.k_max:
            self.k += 1
            self.history.clear()
        elif rate <= self.lower_below and self.k > self.k_min:
            self.k -= 1
            self.history.clear()


class ConfidenceK(KPolicy):
    """Draft up to k_max, stop when the draft's batch-mean max probability drops below a bar."""

    name = "confidence"

    def __init__(self, k_max: int = 8, threshold: float = 0.5):
        self.k_max, self.threshold = k_max, threshold

    def choose(self, batch_size):
        return Decision(self.k_max, f"confidence k<={self.k_max} thr={self.threshold}")

    def stop_rule(self):
        return ConfidenceStop(self.threshold)


@dataclass(frozen=True)
class Profile:
    """Measured by ``spectest profile``: round latency by (batch size, K) and acceptance.

    ``step_seconds[b][k]``: mean wall time of one round at batch size b with K = k (K = 0 is
    the target-only step). ``accept_at_least[i]``: P(at least i+1 drafts accepted), i.e.
    vLLM's per-position acceptance Δaccepted_per_pos[i] / Δdrafts.
    """

    step_seconds: dict[int, dict[int, float]]
    accept_at_least: tuple[float, ...]
    meta: dict = field(default_factory=dict, hash=False)

    def expected_tokens(self, k: int) -> float:
        """E[tokens per round] = 1 + Σ_{i<k} P(at least i+1 accepted)."""
        return 1.0 + sum(self.accept_at_least[:k])

    def latency(self, batch: int, k: int) -> float:
        sizes = sorted(self.step_seconds)
        nearest = min(sizes, key=lambda b: (abs(b - batch), -b))
        row = self.step_seconds[nearest]
        lat = row.get(k, row[max(row)])
        return lat * (batch / nearest if batch > nearest and nearest == sizes[-1] else 1.0)

    def best_k(self, batch: int, k_max: int) -> tuple[int, float]:
        ks = [k for k in range(0, min(k_max, len(self.accept_at_least)) + 1)
              if k in self.step_seconds[min(self.step_seconds, key=lambda b: abs(b - batch))]]
        goodput = {k: batch * self.expected_tokens(k) / self.latency(batch, k) for k in ks}
        k = max(goodput, key=goodput.get)
        return k, goodput[k]

    def save(self, path: Path) -> None:
        data = {"step_seconds": {str(b): {str(k): v for k, v in row.items()}
                                 for b, row in self.step_seconds.items()},
                "accept_at_least": list(self.accept_at_least), "meta": self.meta}
        tmp = Path(str(path) + ".tmp")
        tmp.write_text(json.dumps(data, indent=2) + "\n")
        tmp.replace(path)

    @classmethod
    def load(cls, path: Path) -> "Profile":
        data = json.loads(Path(path).read_text())
        return cls({int(b): {int(k): float(v) for k, v in row.items()}
                    for b, row in data["step_seconds"].items()},
                   tuple(data["accept_at_least"]), data.get("meta", {}))


class GoodputK(KPolicy):
    """Pick the K that maximises expected tokens/s for the current batch size."""

    name = "goodput"

    def __init__(self, profile: Profile, k_max: int = 8):
        self.profile, self.k_max = profile, k_max

    def choose(self, batch_size):
        k, goodput = self.profile.best_k(batch_size, self.k_max)
        return Decision(k, f"goodput k={k} predicted {goodput:.1f} tok/s at batch {batch_size}")


class DisableAbove(KPolicy):
    """Wrap a policy: no speculation when the batch is larger than ``max_batch``."""

    def __init__(self, inner: KPolicy, max_batch: int):
        self.inner, self.max_batch = inner, max_batch
        self.name = f"{inner.name}+disable>{max_batch}"
        self.k_max = inner.k_max

    def choose(self, batch_size):
        if batch_size > self.max_batch:
            return Decision(0, f"disabled: batch {batch_size} > {self.max_batch}")
        return self.inner.choose(batch_size)

    def stop_rule(self):
        return self.inner.stop_rule()

    def observe(self, proposed, accepted):
        self.inner.observe(proposed, accepted)


def make_policy(name: str, k: int = 4, k_min: int = 1, k_max: int = 8,
                threshold: float = 0.5, profile: Path | None = None,
                disable_above: int | None = None) -> KPolicy:
    """Build a policy from CLI-style settings."""
    if name == "fixed":
        policy: KPolicy = FixedK(k)
    elif name == "adaptive":
        policy = AdaptiveK(k_init=min(max(k, k_min), k_max), k_min=k_min, k_max=k_max)
    elif name == "confidence":
        policy = ConfidenceK(k_max=k_max, threshold=threshold)
    elif name == "goodput":
        if profile is None:
            raise ValueError("the goodput policy needs a profile (run `spectest profile`)")
        policy = GoodputK(Profile.load(profile), k_max=k_max)
    else:
        raise ValueError(f"unknown K policy {name!r} (fixed, adaptive, confidence, goodput)")
    return DisableAbove(policy, disable_above) if disable_above is not None else policy
