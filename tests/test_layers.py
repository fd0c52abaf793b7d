"""The package's dependencies point one way: no import circle between spectest's modules
(imports inside functions included: a lazy import hides a circle, it does not remove it), the
engine knows nothing of HTTP or of the tools built on it, and the load generator (which Locust
loads in every worker) pulls in no torch."""

from __future__ import annotations

import ast
from pathlib import Path

import networkx as nx
import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "spectest"
HTTP = ("aiohttp", "fastapi", "starlette", "uvicorn", "requests", "httpx", "openai")
ABOVE_ENGINE = ("spectest.server", "spectest.sweep", "spectest.audit", "spectest.report",
                "spectest.loadgen", "spectest.cli")


def _modules() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = path
    return out


def _imports(path: Path, modules: dict[str, Path], top_level_only: bool) -> set[str]:
    """Modules ``path`` imports: spectest's by module name, others by top-level package."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    nodes = tree.body if top_level_only else ast.walk(tree)
    found = set()
    for node in nodes:
        if isinstance(node, ast.If) and top_level_only:  # TYPE_CHECKING blocks are not run
            continue
        if isinstance(node, ast.Import):
            found |= {a.name if a.name in modules else a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for alias in node.names:
                full = f"{node.module}.{alias.name}"
                found.add(full if full in modules else
                          node.module if node.module.startswith("spectest") else
                          node.module.split(".")[0])
    return found


@pytest.fixture(scope="module")
def graph() -> nx.DiGraph:
    modules = _modules()
    g = nx.DiGraph()
    for name, path in modules.items():
        g.add_node(name)
        for target in _imports(path, modules, top_level_only=False):
            # a package's __init__ re-exporting its modules is not a circle
            if target in modules and not name.startswith(target + ".") and target != name:
                g.add_edge(name, target)
    return g


def test_no_import_circle(graph):
    circles = [sorted(c) for c in nx.strongly_connected_components(graph) if len(c) > 1]
    assert not circles, f"import circles: {circles}"


def test_the_engine_knows_nothing_of_http_or_of_what_is_built_on_it():
    modules = _modules()
    bad = []
    for name, path in modules.items():
        if not name.startswith("spectest.engine"):
            continue
        for target in _imports(path, modules, top_level_only=False):
            if target in HTTP or target.startswith(ABOVE_ENGINE):
                bad.append(f"{name} imports {target}")
    assert not bad, bad


def test_the_load_generator_pulls_in_no_torch():
    modules = _modules()
    top = {name: _imports(path, modules, top_level_only=True) for name, path in modules.items()}
    for start in (n for n in modules if n.startswith("spectest.loadgen")):
        seen, todo = set(), [start]
        while todo:
            name = todo.pop()
            if name in seen:
                continue
            seen.add(name)
            assert "torch" not in top.get(name, ()), (
                f"{start} imports torch at load time through {name}")
            todo += [t for t in top.get(name, ()) if t in modules]
