"""Installed, it works: the wheel carries what users run.

Builds the wheel from a copy of the package sources (``pip wheel --no-deps``), installs it in a
fresh venv outside the repository (pinning ``torch==2.13.0``, the CPU wheel pip finds locally: a
bare ``torch`` could pull CUDA; the rest from pip's configured indexes), then runs what a user
runs, from an empty folder with no ``PYTHONPATH`` and only the venv's ``bin`` added to ``PATH``:

* ``spectest serve`` (the embedded models) on a free loopback port, until ``/health`` answers;
* ``locust -f "$(spectest locustfile chat)" --headless`` against it: 1 user, 5 s, 8 tokens per
  request — it must write its results files;
* ``locust -f <that locustfile> --help`` lists spectest's flags (the ``.pth`` start-up hook);
* ``spectest audit`` on embedded servers, with a handful of prompts and tokens;
* ``spectest dashboards`` / ``spectest alerts --out-dir`` (then ``--check``, and promtool's unit
  tests on the exported rules when promtool is installed).

About 2.5 minutes on 2 busy cores, half of it the install (``--no-compile``: a module is compiled
when first imported instead). Everything runs on loopback.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

import pytest

from spectest import procs

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
SOURCES = ("pyproject.toml", "setup.py", "README.md", "spectest", "dashboards", "alerts",
           "workloads")
TORCH = "torch==2.13.0"


@dataclass(frozen=True)
class Installed:
    wheel: Path
    venv: Path
    env: dict[str, str]
    cwd: Path  # an empty folder outside the repository

    @property
    def site_packages(self) -> Path:
        return next((self.venv / "lib").glob("python3*/site-packages"))

    def run(self, *argv: str | Path, timeout: float = 120) -> subprocess.CompletedProcess:
        result = subprocess.run([str(a) for a in argv], cwd=self.cwd, env=self.env, text=True,
                                capture_output=True, timeout=timeout)
        assert result.returncode == 0, (f"{' '.join(map(str, argv))} exited with "
                                        f"{result.returncode}:\n{result.stdout[-3000:]}\n"
                                        f"{result.stderr[-3000:]}")
        return result


def _pip(python: Path | str, *args: str, timeout: float) -> None:
    result = subprocess.run([str(python), "-m", "pip", *args], capture_output=True, text=True,
                            timeout=timeout)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]


def _isolation() -> list[str]:
    """This interpreter's setuptools when it builds wheels itself (>= 70.1: faster, offline),
    else pip's isolated build environment."""
    try:
        from setuptools.command import bdist_wheel  # noqa: F401
    except ImportError:
        return []
    return ["--no-build-isolation"]


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Installed:
    base = tmp_path_factory.mktemp("wheel")
    src = base / "spectest-source"  # a copy: the build writes build/ and *.egg-info into it
    src.mkdir()
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info", "build", "*.tmp")
    for name in SOURCES:
        path = ROOT / name
        if path.is_dir():
            shutil.copytree(path, src / name, ignore=ignore)
        else:
            shutil.copy2(path, src / name)
    _pip(sys.executable, "wheel", "--no-deps", *_isolation(), "-q", "-w", str(base / "dist"),
         str(src), timeout=300)
    wheel = next((base / "dist").glob("spectest-*.whl"))
    venv = base / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    _pip(venv / "bin" / "python", "install", "-q", "--no-compile", TORCH, str(wheel),
         timeout=900)
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PYTHON", "SPECTEST_", "LOCUST_", "VIRTUAL_ENV"))}
    env.update(PATH=f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}", PYTHONUNBUFFERED="1",
               VIRTUAL_ENV=str(venv))
    cwd = base / "empty"
    cwd.mkdir()
    return Installed(wheel, venv, env, cwd)  # the 1.5 GB venv goes with pytest's old basetemps


def test_the_wheel_carries_workloads_dashboards_and_alerts(installed):
    names = set(zipfile.ZipFile(installed.wheel).namelist())
    expected = {"spectest-locust-help.pth", "dashboards/build.py", "alerts/build.py",
                "alerts/catalogue.py", "workloads/build_data.py"}
    expected |= {f"workloads/{p.relative_to(ROOT / 'workloads')}" for p in
                 (ROOT / "workloads").glob("*.py")}
    for pattern in ("workloads/data/*.jsonl", "workloads/data/LICENSES/*", "dashboards/*.json",
                    "alerts/*.rules.yml", "alerts/tests/*.test.yml"):
        found = {p.relative_to(ROOT).as_posix() for p in ROOT.glob(pattern)}
        assert found, pattern
        expected |= found
    assert expected <= names, sorted(expected - names)
    assert not [n for n in names if n.startswith(("tests/", "benchmarks/", "scripts/"))]


def test_locustfile_and_its_help_from_the_install(installed):
    path = Path(installed.run("spectest", "locustfile", "chat").stdout.strip())
    assert path == installed.site_packages / "workloads" / "chat.py"
    shown = installed.run("locust", "-f", path, "--help").stdout
    for flag in ("--steps", "--request-rates", "--spectest-model", "--results-dir"):
        assert flag in shown


def test_serve_then_a_bounded_locust_run(installed, tmp_path):
    port = procs.free_port()
    url = f"http://127.0.0.1:{port}"
    server = procs.Child(["spectest", "serve", "--host", "127.0.0.1", "--port", str(port)],
                         name="spectest serve", log_path=tmp_path / "serve.log",
                         env=installed.env, url=url, health_path="/health",
                         start_timeout_s=240, cwd=installed.cwd)
    server.start()
    try:  # the locustfile's path is asked for while the server loads
        chat = installed.run("spectest", "locustfile", "chat").stdout.strip()
        server.wait_ready()
        results = tmp_path / "results"
        installed.run("locust", "-f", chat, "--headless", "--host", url, "--users", "1",
                      "--spawn-rate", "1", "--run-time", "5s", "--max-tokens", "8",
                      "--stop-timeout", "10", "--only-summary", "--results-dir", results,
                      timeout=240)
    finally:
        server.stop()
    assert server.proc.returncode is not None
    rows = [json.loads(line) for line in (results / "requests.jsonl").read_text().splitlines()]
    assert rows and all(r["ok"] and r["output_tokens"] <= 8 for r in rows)
    assert (results / "steps.csv").stat().st_size > 0
    assert json.loads((results / "run.json").read_text())["status"] == "finished"


def test_audit_on_embedded_servers(installed, tmp_path):
    out = tmp_path / "audit"
    installed.run("spectest", "audit", "--candidate", "embedded", "--baseline", "embedded",
                  "--num-prompts", "2", "--greedy-tokens", "8", "--samples-per-prompt", "2",
                  "--sample-tokens", "8", "--no-progress", "--out", out, timeout=300)
    for name in ("report.json", "junit.xml", "summary.md"):
        assert (out / name).stat().st_size > 0, name


def test_dashboards_and_alerts_export(installed, tmp_path):
    dash, rules = tmp_path / "dashboards", tmp_path / "alerts"
    installed.run("spectest", "dashboards", "--out-dir", dash)
    installed.run("spectest", "alerts", "--out-dir", rules)
    assert len(list(dash.glob("*.json"))) == 6
    assert len(list(rules.glob("*.rules.yml"))) == 3
    assert list((rules / "tests").glob("*.test.yml"))
    python = installed.venv / "bin" / "python"  # the installed builders' checks, no torch
    installed.run(python, "-m", "dashboards.build", "--check", "--out-dir", dash)
    installed.run(python, "-m", "alerts.build", "--check", "--with-tests", "--out-dir", rules)
    if shutil.which("promtool"):
        installed.run("promtool", "test", "rules",
                      *sorted((rules / "tests").glob("*.test.yml")))
