"""Bundled files from a checkout (spectest.files) and the commands that hand them out:
``spectest locustfile``, ``spectest dashboards``, ``spectest alerts``. The same commands from an
installed wheel: tests/packaging/test_wheel.py."""

import shutil
import subprocess
from pathlib import Path

import pytest

from spectest import cli, files
from spectest.loadgen.datasets import data_dir

ROOT = Path(__file__).resolve().parents[2]


def test_a_checkout_finds_its_own_folders():
    assert files.checkout_root() == ROOT
    assert files.workloads_dir() == ROOT / "workloads"
    assert files.dashboards_dir() == ROOT / "dashboards"
    assert files.alerts_dir() == ROOT / "alerts"
    assert data_dir() == ROOT / "workloads" / "data"
    for name in files.WORKLOADS:
        assert files.locustfile(name) == ROOT / "workloads" / f"{name}.py"


def test_locustfile_command_prints_the_path(capsys):
    assert cli.main(["locustfile", "rag"]) == 0
    assert capsys.readouterr().out == f"{ROOT / 'workloads' / 'rag.py'}\n"


def test_unknown_workload_is_one_readable_line(capsys):
    assert cli.main(["locustfile", "nope"]) == 2
    err = capsys.readouterr().err
    assert err == ("spectest locustfile: unknown workload 'nope': the bundled ones are "
                   "chat, code, rag, mixed\n")


def test_alerts_command_writes_rules_and_promtool_tests(tmp_path, capsys):
    out = tmp_path / "new" / "alerts"  # created
    assert cli.main(["alerts", "--out-dir", str(out)]) == 0
    assert sorted(p.name for p in out.glob("*.rules.yml")) == [
        "llamacpp.rules.yml", "spectest.rules.yml", "vllm.rules.yml"]
    assert sorted(p.name for p in (out / "tests").iterdir()) == sorted(
        p.name for p in (ROOT / "alerts" / "tests").glob("*.test.yml"))
    assert cli.main(["alerts", "--check", "--out-dir", str(out)]) == 0
    (out / "vllm.rules.yml").unlink()
    capsys.readouterr()
    assert cli.main(["alerts", "--check", "--out-dir", str(out)]) == 1
    assert "vllm.rules.yml is missing" in capsys.readouterr().err
    if shutil.which("promtool"):  # the copied unit tests run against the copied rules
        tests = sorted(str(p) for p in (out / "tests").glob("*.test.yml"))
        assert cli.main(["alerts", "--out-dir", str(out)]) == 0
        result = subprocess.run(["promtool", "test", "rules", *tests], capture_output=True,
                                text=True, timeout=120)
        assert result.returncode == 0, result.stdout + result.stderr


def test_dashboards_command_creates_its_out_dir(tmp_path, capsys):
    out = tmp_path / "a" / "b"
    assert cli.main(["dashboards", "--out-dir", str(out)]) == 0
    assert len(list(out.glob("*.json"))) == 6
    assert cli.main(["dashboards", "--check", "--out-dir", str(out)]) == 0


def test_an_installed_copy_is_not_written_without_out_dir(monkeypatch, capsys):
    monkeypatch.setattr(files, "checkout_root", lambda: None)
    assert cli.main(["alerts"]) == 2
    assert "pass --out-dir DIR" in capsys.readouterr().err


@pytest.mark.parametrize("name", ["dashboards", "alerts"])
def test_check_of_a_file_as_out_dir_is_one_line(tmp_path, capsys, name):
    f = tmp_path / "file"
    f.write_text("")
    assert cli.main([name, "--check", "--out-dir", str(f)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "not a directory" in err
