"""The layers of ARCHITECTURE.md, read from the source: imports point down only
(hotplate -> watcher -> pipeline -> cachestore) and no two modules import each other,
directly or round a loop, at module level or inside functions."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LAYERS = ["cachestore", "pipeline", "watcher", "hotplate"]  # bottom first


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def project_modules() -> dict[str, Path]:
    return {module_name(p): p for layer in LAYERS for p in (ROOT / layer).rglob("*.py")}


def imports_of(path: Path, known: dict[str, Path]) -> set[str]:
    """Project modules that `path` imports anywhere in its body (lazy imports included)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            # `from pkg import mod` names a module when pkg.mod is one
            names = [f"{node.module}.{a.name}" for a in node.names] + [node.module]
        for name in names:
            while name and name not in known:
                name = name.rpartition(".")[0]
            if name:
                found.add(name)
    return found


def graph() -> dict[str, set[str]]:
    known = project_modules()
    return {m: imports_of(p, known) - {m} for m, p in known.items()}


def test_imports_point_down_the_layers():
    upward = [
        f"{m} imports {dep}"
        for m, deps in graph().items()
        for dep in deps
        if LAYERS.index(dep.split(".")[0]) > LAYERS.index(m.split(".")[0])
    ]
    assert upward == []


def test_no_import_cycles_between_modules():
    edges = graph()

    # a package's __init__ and its own submodules may refer to each other (registries)
    def related(a: str, b: str) -> bool:
        return a.startswith(b + ".") or b.startswith(a + ".")

    state: dict[str, int] = {}
    cycles: list[list[str]] = []

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for dep in sorted(edges[node]):
            if related(node, dep):
                continue
            if state.get(dep) == 1:
                cycles.append(path[path.index(dep) :] + [dep])
            elif dep not in state:
                visit(dep, path + [dep])
        state[node] = 2

    for module in sorted(edges):
        if module not in state:
            visit(module, [module])
    assert cycles == []


def test_cachestore_imports_without_ray():
    """Ray is optional below the CLI: every cachestore module (the blob tier's Ray flight
    included) imports in a process where `import ray` fails."""
    code = (
        "import sys; sys.modules['ray'] = None\n"
        "import importlib, pkgutil, cachestore\n"
        "names = [m.name for m in pkgutil.walk_packages(cachestore.__path__, 'cachestore.')]\n"
        "for name in names: importlib.import_module(name)\n"
        "assert 'cachestore.remote.ray_flight' in names, names\n"
    )
    run = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr.strip().splitlines()[-1]
