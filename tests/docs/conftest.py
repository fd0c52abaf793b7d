"""The documentation's test harness for the session: one :class:`~tests.docs.harness.Session`
(scratch folder, ledger, commands already run), and its ledger printed at the end of the run —
every block and command it ran, skipped (with the reason) or failed — and written to
``ledger.txt`` in its folder.

Outside CI a third-party server that is not installed (vLLM, llama-server) skips the blocks that
need it, naming the install script; in CI (``$CI`` set) it is missing only when broken, so those
blocks run and fail.
"""

from __future__ import annotations

import os

import pytest

from tests.docs.harness import Session, ledger

_SESSIONS: list[Session] = []


@pytest.fixture(scope="session")
def docs(tmp_path_factory) -> Session:
    session = Session(tmp_path_factory.mktemp("docs"), in_ci=bool(os.environ.get("CI")))
    _SESSIONS.append(session)
    yield session
    (session.work / "ledger.txt").write_text(ledger(session.records) + "\n", encoding="utf-8")


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    for session in _SESSIONS:
        if session.records:
            terminalreporter.section("the documentation's commands (tests/docs)")
            terminalreporter.write_line(ledger(session.records))
            terminalreporter.write_line(f"logs: {session.logs}")
