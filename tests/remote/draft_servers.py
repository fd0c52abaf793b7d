"""Helpers for the disaggregated-drafting tests: real ``spectest serve-draft`` processes on
loopback, and engines whose drafter is in-process, remote or absent (fixtures: conftest.py).

The draft server runs as the user runs it (``python -m spectest serve-draft``, started and
stopped by the sweep's own ``EmbeddedServer``); engines run on the test's thread
(``Engine.generate_many``), so a test compares outputs token for token without HTTP in between.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from spectest.engine.api import MODELS_DIR, Engine, make_drafter
from spectest.engine.engine import EngineConfig, SpecEngine
from spectest.engine.policies import make_policy
from spectest.engine.scheduler import SchedulerConfig
from spectest.procs import free_port  # noqa: F401 (the tests' import)
from spectest.remote.drafter import RemoteDrafter
from spectest.sweep.embedded import EmbeddedServer

MODELS = Path(os.environ.get("SPECTEST_TEST_MODELS", MODELS_DIR))
SLOTS, MAX_LEN, K = 4, 256, 4


def draft_server(log: Path, draft: Path | None = None, port: int = 0) -> EmbeddedServer:
    server = EmbeddedServer(["--draft", str(draft or MODELS / "draft"), "--threads", "1"],
                            log, start_timeout_s=120, subcommand="serve-draft")
    if port:  # a fixed port, so a restarted draft server is found at the same URL
        server.serve_args += ["--port", str(port)]
    return server


def engine(pair, kind: str, url: str = "", observers=(), **remote_kw) -> Engine:
    """kind: "remote" (drafts from ``url``), "local" (the same draft in-process), "none"."""
    target, draft = pair
    if kind == "remote":
        drafter = RemoteDrafter(url, SLOTS, MAX_LEN, **remote_kw)
        drafter.connect(target.tokenizer.fingerprint)
    else:
        drafter = make_drafter("draft-model" if kind == "local" else "none", draft, SLOTS,
                               MAX_LEN)
    cfg = EngineConfig(SchedulerConfig(max_num_seqs=SLOTS, max_model_len=MAX_LEN,
                                       spec_slots=K + 1))
    return Engine(SpecEngine(target.model, target.tokenizer, drafter, make_policy("fixed", k=K),
                             cfg, observers=tuple(observers)))


def other_tokenizer_draft(root: Path) -> Path:
    """A copy of the draft whose tokenizer gives two ordinary tokens each other's ids."""
    other = root / "other-draft"
    shutil.copytree(MODELS / "draft", other)
    tok = json.loads((other / "tokenizer.json").read_text())
    vocab = tok["model"]["vocab"]
    a, b = sorted(vocab, key=vocab.get)[300:302]
    vocab[a], vocab[b] = vocab[b], vocab[a]
    (other / "tokenizer.json").write_text(json.dumps(tok))
    return other
