"""Fixtures for disaggregated drafting: the model pair loaded once (one torch thread, like the
draft server), and one ``spectest serve-draft`` process per test module."""

from __future__ import annotations

import pytest
import torch
from draft_servers import MODELS, draft_server

from spectest.engine.loader import load_checkpoint


@pytest.fixture(scope="session")
def pair():
    if not (MODELS / "target" / "config.json").is_file():
        pytest.skip(f"no model pair in {MODELS}")
    before = torch.get_num_threads()
    torch.set_num_threads(1)  # the draft server runs one thread too: same kernels, same drafts
    yield load_checkpoint(MODELS / "target"), load_checkpoint(MODELS / "draft")
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def draft_url(tmp_path_factory):
    with draft_server(tmp_path_factory.mktemp("draft") / "draft-server.log") as url:
        yield url
