"""The layers of ARCHITECTURE.md, read from the source: imports point down only
(hotplate -> watcher -> pipeline -> cachestore) and no two modules import each other,
directly or round a loop, at module level or inside functions."""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

pytestmark = pytest.mark.quick  # the quick tier (tests/quick_tier.py)

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


def imported(node: ast.AST, into: set[str]) -> None:
    if isinstance(node, ast.Import):
        into.update(a.name for a in node.names)
    elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
        into.update([node.module] + [f"{node.module}.{a.name}" for a in node.names])


def imports_at_load(tree: ast.Module, run: Callable[[ast.FunctionDef], bool]) -> set[str]:
    """Modules a module imports when it is loaded (its body and its classes', not
    `if TYPE_CHECKING:` blocks), and inside the functions `run` names."""
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and run(node):
            for inner in ast.walk(node):
                imported(inner, found)
            return
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            return
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            return
        imported(node, found)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return found


QUICK_MARK = "pytest.mark.quick"


def quick_tests(tree: ast.Module) -> Callable[[ast.FunctionDef], bool]:
    """Which of a test module's functions are quick tests: all its tests when its
    `pytestmark` has the mark, else those decorated with it."""
    module_marked = any(
        isinstance(n, ast.Assign)
        and any(isinstance(t, ast.Name) and t.id == "pytestmark" for t in n.targets)
        and QUICK_MARK in ast.unparse(n.value)
        for n in tree.body
    )
    return lambda f: (
        f.name.startswith("test_")
        and (module_marked or any(QUICK_MARK in ast.unparse(d) for d in f.decorator_list))
    )


def test_the_quick_tier_needs_no_extra():
    """`pytest -m quick` runs with the core and [dev] alone (tests/quick_tier.py): no quick
    test imports an extra's module, Ray or Playwright, in its body or through what its
    module loads (test helpers and project modules, as far as they import at load). What
    a function imports when a quick test calls it is checked where it runs: `-m quick`
    hides those modules."""
    from tests.quick_tier import WITHOUT

    known = project_modules()
    for folder in ("tests", "testkit"):
        known.update({module_name(p): p for p in (ROOT / folder).rglob("*.py")})
    trees: dict[str, ast.Module] = {}
    loads: dict[str, set[str]] = {}

    def tree(m: str) -> ast.Module:  # parsed when reached: most modules never are
        if m not in trees:
            trees[m] = ast.parse(known[m].read_text(), str(known[m]))
        return trees[m]

    def at_load(m: str) -> set[str]:
        if m not in loads:
            loads[m] = imports_at_load(tree(m), lambda f: False)
        return loads[m]

    quick = {
        m: quick_tests(tree(m))
        for m, p in known.items()
        if p.name.startswith("test_") and QUICK_MARK in p.read_text()
    }
    assert len(quick) >= 20, sorted(quick)  # the tier is marked (a typo leaves it empty)
    for p in (ROOT / "tests").rglob("conftest.py"):
        quick[module_name(p)] = lambda f: False
    bad = []
    for root, run in quick.items():
        seen, todo = {root: [root]}, [root]
        while todo:
            m = todo.pop()
            for name in imports_at_load(tree(m), run) if m == root else at_load(m):
                if name.split(".")[0] in WITHOUT:
                    bad.append(" -> ".join(seen[m] + [name]))
                    continue
                while name and name not in known:
                    name = name.rpartition(".")[0]
                while name:  # the module, and the packages above it, which load first
                    if name in known and name not in seen:
                        seen[name] = seen[m] + [name]
                        todo.append(name)
                    name = name.rpartition(".")[0]
    assert bad == [], "the quick tier reaches modules it goes without:\n" + "\n".join(bad)
