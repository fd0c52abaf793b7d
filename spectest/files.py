"""The files spectest ships beside its code, and how it writes files: atomically, or checked.

Where the bundled files are: the Locust workloads (locustfiles and their datasets), the Grafana
dashboards and the Prometheus alert rules. In a source checkout they are the top-level folders
``workloads/``, ``dashboards/`` and ``alerts/``; a wheel carries the same three as top-level
packages installed next to ``spectest`` (``pyproject.toml``: ``packages.find`` and
``package-data``). Either way they sit beside the ``spectest`` package, so one rule finds them in
both: the folder that holds ``spectest/`` (``ROOT``). ``checkout_root()`` tells a checkout (it
has ``pyproject.toml``) from an installed copy, whose files are not meant to be written to.

``write_atomic(path, data)`` writes text (UTF-8) or bytes to a temporary file in the same folder
and renames it over ``path`` (``os.replace``): a reader sees the old file or the new one, never a
mix, and when writing fails the old file is kept and the temporary one removed. The result is
``0o644`` (``mkstemp`` makes ``0o600``), since these files are meant to be read by others.

``write_or_check(out_dir, files, check)`` is the shared body of the generators' command lines
(``python -m dashboards.build``, ``python -m alerts.build``, ``spectest dashboards`` /
``spectest alerts``): write every ``{relative name: text}`` (skipping files already equal), or,
with ``check``, write nothing and report what is missing, different or stale, with the exit
codes 0 (fresh / written), 1 (stale) and 2 (bad ``out_dir``).

Standard library only: Locust processes (gevent) and the engine both import it. It knows nothing
about what the files contain or how they are run.
"""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path

MODE = 0o644
ROOT = Path(__file__).resolve().parents[1]  # the checkout, or site-packages when installed
WORKLOADS = ("chat", "code", "rag", "mixed")  # the bundled locustfiles: workloads/<name>.py


# --- where the bundled files are ------------------------------------------------------------
def checkout_root() -> Path | None:
    """The source checkout spectest runs from; None for an installed copy."""
    return ROOT if (ROOT / "pyproject.toml").is_file() else None


def _folder(name: str) -> Path:
    path = ROOT / name
    if not path.is_dir():
        raise FileNotFoundError(f"spectest's {name}/ folder is not at {path}: reinstall "
                                f"spectest, or run it from its source checkout")
    return path


def workloads_dir() -> Path:
    """The folder of the bundled locustfiles (``chat.py`` …) and of ``data/``."""
    return _folder("workloads")


def dashboards_dir() -> Path:
    return _folder("dashboards")


def alerts_dir() -> Path:
    return _folder("alerts")


def locustfile(name: str) -> Path:
    """The path of a bundled workload's locustfile; ValueError names the bundled ones."""
    if name not in WORKLOADS:
        raise ValueError(f"unknown workload {name!r}: the bundled ones are "
                         f"{', '.join(WORKLOADS)}")
    path = workloads_dir() / f"{name}.py"
    if not path.is_file():
        raise FileNotFoundError(f"the {name} workload is missing from {path.parent}: "
                                f"reinstall spectest")
    return path


# --- writing ----------------------------------------------------------------------------------


def write_atomic(path: str | os.PathLike, data: str | bytes, mode: int = MODE) -> None:
    """Replace ``path`` with ``data`` (str: UTF-8) in one rename; the folder must exist."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data.encode("utf-8") if isinstance(data, str) else data)
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def drift(out_dir: Path, files: Mapping[str, str], stale_glob: str | None = None,
          producer: str = "the generator") -> list[str]:
    """Human-readable differences between ``out_dir`` and ``files``; [] when there are none.

    ``stale_glob`` (e.g. ``"*.json"``): files in ``out_dir`` that match it but are not in
    ``files`` are reported as stale.
    """
    problems = []
    for name, text in sorted(files.items()):
        path = out_dir / name
        if not path.is_file():
            problems.append(f"{name} is missing")
        elif path.read_text(encoding="utf-8") != text:
            problems.append(f"{name} differs from what {producer} produces")
    if stale_glob:
        for path in sorted(out_dir.glob(stale_glob)):
            if path.relative_to(out_dir).as_posix() not in files:
                problems.append(f"{path.name} is not produced by {producer} (stale?)")
    return problems


def write_or_check(out_dir: str | os.PathLike, files: Mapping[str, str], check: bool, *,
                   label: str = "files", stale_glob: str | None = None,
                   producer: str = "the generator", regenerate: str = "") -> int:
    """Write ``files`` under ``out_dir`` (or ``check`` them) and say so; returns an exit code.

    ``label`` names the files in messages ("6 dashboards up to date in DIR"); ``regenerate``
    is the command a stale check tells the reader to run. Sub-folders of a name are created
    when writing; ``out_dir`` itself must exist (exit 2, one line on stderr, otherwise).
    """
    out_dir = Path(out_dir)
    if not out_dir.is_dir():
        print(f"error: --out-dir {out_dir} is not a directory", file=sys.stderr)
        return 2
    if check:
        problems = drift(out_dir, files, stale_glob, producer)
        for line in problems:
            print(f"{label} out of date: {line}", file=sys.stderr)
        if problems:
            if regenerate:
                print(f"run: {regenerate}", file=sys.stderr)
            return 1
        print(f"{len(files)} {label} up to date in {out_dir}")
        return 0
    for name, text in sorted(files.items()):
        path = out_dir / name
        if path.is_file() and path.read_text(encoding="utf-8") == text:
            continue  # already fresh: keep its modification time
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, text)
    print(f"wrote {len(files)} {label} to {out_dir}")
    return 0
