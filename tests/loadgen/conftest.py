"""Fixtures for the load-generator tests: a stub server in its own process."""

import os
import sys
from pathlib import Path

# Importing locust monkey-patches the whole process with gevent. These tests only need
# gevent-native sockets (geventhttpclient), so keep the pytest process unpatched; Locust
# subprocesses are started without this variable (spectest.loadgen.runner removes it).
os.environ.setdefault("LOCUST_SKIP_MONKEY_PATCH", "1")

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # until the package is installed / pytest pythonpath is set
    sys.path.insert(0, str(ROOT))

from spectest.loadgen.runner import StubProcess  # noqa: E402


@pytest.fixture
def stub():
    """``stub("--ttft-ms", "5")`` starts a stub and returns its URL; all are stopped after."""
    started = []

    def start(*args: str) -> str:
        proc = StubProcess(*args)
        started.append(proc)
        return proc.__enter__()

    yield start
    for proc in started:
        proc.__exit__(None, None, None)
