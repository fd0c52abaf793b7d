"""Runtime speculation control: the kill switch, K and the K policy, changed while serving.

Owns: :class:`SpeculationSettings` (frozen: ``enabled``, ``k``, ``k_policy``),
:class:`SpeculationChange` (one applied change: old → new, when it was asked for, the round
boundary it took effect at) and :class:`SpeculationControl`, a thread-safe holder. Any thread
*requests* a change (validated at once: K within the KV reservation, a known policy that can
be built); the engine thread *applies* the pending change at its next round boundary
(:meth:`SpeculationControl.apply`), so a round never sees half a change, and in-flight
requests carry on under the new settings. While speculation is off every row decodes
target-only (K = 0, the same path as a request's ``speculative: false``); turned back on, the
drafter catches up on the tokens it did not see.

Does not know: HTTP, Prometheus or who asks. Listeners (the server's metrics) are called on the
engine thread with each applied change; requesters poll :meth:`SpeculationControl.change` to
learn when their change took effect.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable

from spectest.engine.policies import POLICIES, DisableAbove, KPolicy, make_policy

PolicyFactory = Callable[[str, int], KPolicy]  # (policy name, K) -> a fresh policy


class SettingError(ValueError):
    """A requested setting this engine cannot take; ``field`` names it."""

    def __init__(self, field: str, message: str):
        super().__init__(message)
        self.field = field


@dataclass(frozen=True)
class SpeculationSettings:
    """What the engine speculates with. ``k`` is the draft length of ``fixed``, the starting
    K of ``adaptive`` and the most K of ``confidence`` and ``goodput``."""

    enabled: bool = True
    k: int = 4
    k_policy: str = "fixed"

    def describe(self) -> str:
        return f"enabled={str(self.enabled).lower()} k={self.k} k_policy={self.k_policy}"


@dataclass(frozen=True)
class SpeculationChange:
    version: int
    old: SpeculationSettings
    new: SpeculationSettings
    requested_at: float  # time.time() of the request
    applied_at: float | None = None  # time.time() of the round boundary; None while pending
    round: int | None = None  # the engine round that first ran with ``new``
    policy: KPolicy | None = field(default=None, compare=False, repr=False)

    @property
    def changed(self) -> bool:
        return self.old != self.new

    @property
    def effective_after_s(self) -> float | None:
        return None if self.applied_at is None else max(0.0, self.applied_at - self.requested_at)


@dataclass(frozen=True)
class PolicyOptions:
    """What a runtime policy keeps from the start-up flags (``spectest serve --k-min`` …)."""

    k_min: int = 1
    k_max: int = 8  # adaptive's ceiling; at most the KV reservation
    threshold: float = 0.5
    profile: Path | None = None
    disable_above: int | None = None

    def build(self, name: str, k: int) -> KPolicy:
        if name == "adaptive":
            return make_policy(name, k=k, k_min=min(self.k_min, k), k_max=max(k, self.k_max),
                               disable_above=self.disable_above)
        return make_policy(name, k=k, k_max=k, threshold=self.threshold, profile=self.profile,
                           disable_above=self.disable_above)


def settings_of(policy: KPolicy, enabled: bool = True) -> SpeculationSettings:
    """The settings a start-up policy stands for (its K: fixed K, adaptive's current K, the
    most K of the others)."""
    inner = policy.inner if isinstance(policy, DisableAbove) else policy
    return SpeculationSettings(enabled, int(getattr(inner, "k", inner.k_max)), inner.name)


class SpeculationControl:
    """``control.request(enabled=False)`` from any thread; the engine calls ``apply``."""

    def __init__(self, settings: SpeculationSettings, make: PolicyFactory, k_limit: int,
                 can_draft: bool = True):
        if not can_draft and settings.enabled:
            settings = replace(settings, enabled=False)
        self.make, self.k_limit, self.can_draft = make, k_limit, can_draft
        self.listeners: list[Callable[[SpeculationChange], None]] = []
        self._lock = threading.Lock()
        self._settings = settings
        self._pending: SpeculationChange | None = None
        self._last: SpeculationChange | None = None
        self._version = 0
        self.switches = 0

    # --- any thread ---------------------------------------------------------------------------
    def settings(self) -> SpeculationSettings:
        """The settings rounds run with now (a pending change is not in them yet)."""
        with self._lock:
            return self._settings

    def pending(self) -> SpeculationChange | None:
        with self._lock:
            return self._pending

    def last(self) -> SpeculationChange | None:
        """The latest applied change (None before the first)."""
        with self._lock:
            return self._last

    def request(self, enabled: bool | None = None, k: int | None = None,
                k_policy: str | None = None) -> SpeculationChange:
        """Ask for new settings (fields left None keep the latest requested value); raises
        :class:`SettingError` for a K outside 1..k_limit, an unknown policy, one that cannot be
        built, or speculation switched on without a drafter. Returns the pending change, or an
        applied no-op when nothing would change."""
        if k is not None and not 1 <= k <= self.k_limit:
            raise SettingError("k", f"k must be between 1 and {self.k_limit} (the draft "
                               f"positions this server reserves per sequence); got {k}")
        if k_policy is not None and k_policy not in POLICIES:
            raise SettingError("k_policy", f"unknown K policy {k_policy!r} (known: "
                               f"{', '.join(POLICIES)})")
        if enabled and not self.can_draft:
            raise SettingError("enabled", "this server has no drafter (--drafter none): "
                               "speculation cannot be switched on")
        now = time.time()
        with self._lock:
            base = self._pending.new if self._pending else self._settings
            new = SpeculationSettings(base.enabled if enabled is None else enabled,
                                      base.k if k is None else k,
                                      base.k_policy if k_policy is None else k_policy)
            if new == self._settings and self._pending is None:
                return SpeculationChange(self._version, new, new, now, now)
            policy = None
            if (new.k, new.k_policy) != (self._settings.k, self._settings.k_policy):
                try:
                    policy = self.make(new.k_policy, new.k)
                except ValueError as exc:  # goodput without a profile
                    raise SettingError("k_policy", str(exc)) from None
            self._version += 1
            self._pending = SpeculationChange(self._version, self._settings, new, now,
                                              policy=policy)
            return self._pending

    def change(self, version: int) -> SpeculationChange | None:
        """The applied change that covers request ``version`` (a later one may have
        superseded it before the round boundary); None while it is pending."""
        with self._lock:
            if self._last is not None and self._last.version >= version:
                return self._last
            return None

    # --- the engine thread --------------------------------------------------------------------
    def apply(self, round_index: int) -> SpeculationChange | None:
        """At a round boundary: make the pending change current; None if there is none."""
        with self._lock:
            pending, self._pending = self._pending, None
            if pending is None:
                return None
            change = replace(pending, old=self._settings, applied_at=time.time(),
                             round=round_index)
            self._settings, self._last = change.new, change
            if change.changed:
                self.switches += 1
        for listener in self.listeners:
            listener(change)
        return change


def control_for(policy: KPolicy, k_limit: int, can_draft: bool = True,
                options: PolicyOptions | None = None) -> SpeculationControl:
    """A control starting from ``policy``'s settings; runtime policies are built with
    ``options`` (default: the start-up policy's bounds)."""
    settings = settings_of(policy)
    options = options or PolicyOptions(k_max=min(k_limit, max(policy.k_max, 1)),
                                       disable_above=getattr(policy, "max_batch", None))
    return SpeculationControl(settings, options.build, k_limit, can_draft)
