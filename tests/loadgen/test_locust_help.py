"""``locust -f <spectest locustfile> --help`` lists spectest's flags (spectest.loadgen.locust_help).

Locust prints --help before it imports the locustfile, so the flags come from the start-up hook
an installed wheel runs (``spectest-locust-help.pth``; tests/packaging/test_wheel.py runs the real
one). Here: who it fires for, and the whole chain in a subprocess that runs the hook's line the
way Python's ``site`` does, then Locust's ``main``.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from spectest.loadgen import locust_help

ROOT = Path(__file__).resolve().parents[2]
CHAT = str(ROOT / "workloads" / "chat.py")


@pytest.mark.parametrize("argv, orig, expected", [
    (["/venv/bin/locust", "-f", "x.py", "--help"], ["/venv/bin/python", "/venv/bin/locust"], True),
    (["-m", "-f", "x.py", "-h"], ["python", "-m", "locust", "-f", "x.py", "-h"], True),
    (["-m", "--help"], ["python", "-m", "json.tool", "--help"], False),
    (["/venv/bin/pip", "--help"], ["python", "/venv/bin/pip", "--help"], False),
    (["-c", "--help"], ["python", "-c", "pass", "--help"], False),
])
def test_fires_only_for_locust(argv, orig, expected):
    assert locust_help.is_locust(argv, orig) is expected


@pytest.mark.parametrize("argv, env, expected", [
    (["locust", "-f", "a.py", "--help"], {}, ["a.py"]),
    (["locust", "--locustfile=a.py,b.py", "-h"], {}, ["a.py", "b.py"]),
    (["locust", "-fa.py"], {}, ["a.py"]),
    (["locust", "--help"], {"LOCUST_LOCUSTFILE": "c.py"}, ["c.py"]),
    (["locust", "--help"], {}, ["locustfile.py"]),
    (["locust", "-f", "a.py", "-f", "d.py"], {}, ["d.py"]),
])
def test_finds_the_locustfiles(argv, env, expected):
    assert locust_help.locustfiles(argv, env) == expected


def test_only_locustfiles_that_install_the_plugin(tmp_path):
    plain = tmp_path / "plain.py"
    plain.write_text("from locust import HttpUser\n")
    assert locust_help.uses_spectest(CHAT)
    assert not locust_help.uses_spectest(str(plain))
    assert not locust_help.uses_spectest(str(tmp_path / "missing.py"))


def _help(locustfile: str) -> subprocess.CompletedProcess:
    code = ("import sys; sys.argv = ['locust', '-f', sys.argv[1], '--help']; "
            f"exec({locust_help.PTH_LINE!r}); "
            "from locust.main import main; main()")
    env = {k: v for k, v in os.environ.items() if k != "LOCUST_SKIP_MONKEY_PATCH"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    return subprocess.run([sys.executable, "-c", code, locustfile], capture_output=True,
                          text=True, timeout=120, env=env, cwd=ROOT)


def test_help_of_a_spectest_locustfile_lists_spectest_flags(tmp_path):
    result = _help(CHAT)
    assert result.returncode == 0, result.stderr
    for flag in ("--steps", "--request-rates", "--spectest-model", "--results-dir",
                 "--speculative"):
        assert flag in result.stdout
    plain = tmp_path / "plain.py"
    plain.write_text("from locust import HttpUser\n")
    other = _help(str(plain))
    assert other.returncode == 0, other.stderr
    assert "--host" in other.stdout and "--steps" not in other.stdout


def test_a_failing_hook_never_breaks_start_up(monkeypatch):
    monkeypatch.setattr(sys, "argv", ["locust", "-f", CHAT, "--help"])
    monkeypatch.setattr(locust_help, "register", lambda: 1 / 0)
    locust_help.maybe_register()  # swallowed: at worst --help stays as Locust prints it
