"""SPECTEST_SMOKE shrinks the long commands it touches, and nothing without it."""

from __future__ import annotations

import argparse

from spectest import smoke
from spectest.loadgen.options import SpecOptions
from spectest.sweep import config as sweep_config


def _sweep_args(*argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    sweep_config.add_arguments(p)
    return p.parse_args(list(argv))


def test_off_by_default(monkeypatch):
    monkeypatch.delenv(smoke.ENV, raising=False)
    args = _sweep_args("--steps", "1,2,4", "--step-time", "30")
    smoke.sweep_args(args)
    assert (args.steps, args.step_time, args.verify_advice) == ("1,2,4", 30.0, "auto")
    assert args.max_step_time is None
    assert smoke.audit_overrides() == {} and smoke.locust_step_time(30.0) == 30.0
    monkeypatch.setenv(smoke.ENV, "0")
    assert not smoke.active()


def test_sweep_keeps_its_flags_at_token_sizes(monkeypatch, capsys):
    monkeypatch.setenv(smoke.ENV, "1")
    args = _sweep_args("--steps", "2,4,8", "--step-time", "30", "--warmup", "6")
    smoke.sweep_args(args)
    cfg = sweep_config.SweepConfig.from_args(args, "now")
    assert cfg.steps == (2,) and cfg.step_time_s == smoke.STEP_S and cfg.warmup_s == 0
    assert cfg.max_step_time_s == cfg.step_time_s  # one look per step
    assert cfg.requests_per_step == smoke.SWEEP_REQUESTS and not cfg.verify_advice
    assert cfg.max_tokens == smoke.SWEEP_TOKENS and cfg.workloads == ("rag",)
    assert "SPECTEST_SMOKE is set" in capsys.readouterr().err
    args = _sweep_args("--max-concurrency", "16")
    smoke.sweep_args(args)
    assert sweep_config.SweepConfig.from_args(args, "now").steps == (1,)


def test_audit_locust_and_profile(monkeypatch):
    monkeypatch.setenv(smoke.ENV, "1")
    assert smoke.audit_overrides()["num_prompts"] == 2
    ns = argparse.Namespace(steps="1,2,4", step_time=30.0)
    assert SpecOptions.from_parsed(ns).step_time == smoke.STEP_S
    profile = argparse.Namespace(batch_sizes="1,2,4,8,16", k_max=8, rounds=12)
    smoke.profile_args(profile)
    assert (profile.batch_sizes, profile.k_max, profile.rounds) == ("1,2", 2, 2)
    assert smoke.generate_tokens(64) == smoke.GENERATE_TOKENS
