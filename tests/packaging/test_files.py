"""spectest.files: the atomic write every writer shares, and the generators' write-or-check."""

import os
import stat

import pytest

from spectest import files


def test_write_atomic_text_and_bytes_readable_by_others(tmp_path):
    target = tmp_path / "a.json"
    files.write_atomic(target, "héllo\n")
    assert target.read_text(encoding="utf-8") == "héllo\n"
    assert stat.S_IMODE(target.stat().st_mode) == 0o644
    files.write_atomic(str(target), b"\x00\x01")
    assert target.read_bytes() == b"\x00\x01"
    assert [p.name for p in tmp_path.iterdir()] == ["a.json"]


def test_failed_write_keeps_the_old_file_and_no_temp_file(tmp_path, monkeypatch):
    target = tmp_path / "steps.csv"
    files.write_atomic(target, "old")

    def boom(*a, **k):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(OSError, match="disk full"):
        files.write_atomic(target, "new")
    assert target.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["steps.csv"]


def test_missing_folder_is_an_error(tmp_path):
    with pytest.raises(FileNotFoundError):
        files.write_atomic(tmp_path / "nope" / "a.txt", "x")


FILES = {"a.rules.yml": "a\n", "tests/a.test.yml": "t\n"}


def test_write_then_check(tmp_path, capsys):
    assert files.write_or_check(tmp_path, FILES, False, label="rule files") == 0
    assert "wrote 2 rule files to" in capsys.readouterr().out
    assert (tmp_path / "tests" / "a.test.yml").read_text() == "t\n"
    assert files.write_or_check(tmp_path, FILES, True, label="rule files") == 0
    assert "2 rule files up to date in" in capsys.readouterr().out


def test_rewriting_equal_files_leaves_them_alone(tmp_path):
    files.write_or_check(tmp_path, FILES, False)
    path = tmp_path / "a.rules.yml"
    os.utime(path, (1_000_000, 1_000_000))
    files.write_or_check(tmp_path, FILES, False)
    assert path.stat().st_mtime == 1_000_000
    files.write_or_check(tmp_path, {**FILES, "a.rules.yml": "b\n"}, False)
    assert path.read_text() == "b\n"


def test_check_reports_missing_different_and_stale(tmp_path, capsys):
    files.write_or_check(tmp_path, FILES, False)
    (tmp_path / "a.rules.yml").write_text("edited\n")
    (tmp_path / "tests" / "a.test.yml").unlink()
    (tmp_path / "old.rules.yml").write_text("x\n")
    capsys.readouterr()
    code = files.write_or_check(tmp_path, FILES, True, label="rule files",
                                stale_glob="*.rules.yml", regenerate="python -m alerts.build")
    err = capsys.readouterr().err
    assert code == 1
    assert "rule files out of date: a.rules.yml differs from what the generator produces" in err
    assert "tests/a.test.yml is missing" in err
    assert "old.rules.yml is not produced by the generator (stale?)" in err
    assert err.rstrip().endswith("run: python -m alerts.build")
    assert (tmp_path / "a.rules.yml").read_text() == "edited\n"  # a check writes nothing


def test_out_dir_must_exist(tmp_path, capsys):
    assert files.write_or_check(tmp_path / "nope", FILES, False) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "is not a directory" in err
