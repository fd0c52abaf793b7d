"""Engine-test fixtures: one torch thread, and tiny random HF checkpoints (see
checkpoint_factory.py) written once per session."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from checkpoint_factory import CONFIGS, save_random_hf


@pytest.fixture
def single_thread():
    """One torch thread: on a machine whose cores are busy, two OpenMP threads spin-wait for
    each other and small forwards run ~15× slower."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def hf_checkpoints(tmp_path_factory) -> dict[str, tuple[Path, object]]:
    """Every CONFIGS entry saved once per session: name → (directory, transformers model)."""
    pytest.importorskip("transformers")
    root = tmp_path_factory.mktemp("hf")
    return {name: (root / name, save_random_hf(root / name, name, seed=i))
            for i, name in enumerate(CONFIGS)}
