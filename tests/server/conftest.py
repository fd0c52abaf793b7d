"""Server-test fixtures: one torch thread for the whole folder, and the model pair loaded once."""

from __future__ import annotations

import pytest
import torch

from live_server import ModelPair, load_pair


@pytest.fixture(scope="session")
def pair() -> ModelPair:
    """The test model pair (``$SPECTEST_TEST_MODELS`` or the embedded one), loaded once.

    Torch runs on one thread meanwhile: on a machine whose cores are busy, two OpenMP threads
    spin-wait for each other and small forwards run many times slower.
    """
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield load_pair()
    torch.set_num_threads(before)
