"""Every bench imports only public names that exist, so that a moved or renamed module
fails the suite in the same change (as bench_remote's `pipeline.render.job` once did not).

Read from the source, imports inside functions included: a name a bench imports must
exist where it imports it from, must not be private (`_name`), and no bench reaches into
a private attribute (`obj._name`) of anything but its own objects (`self._name`). The
benches themselves run in CI with `just bench-quick`; this check takes seconds.
"""

from __future__ import annotations

import ast
import importlib
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "bench"
PROJECT = {"cachestore", "pipeline", "watcher", "hotplate", "tests", "bench", "harness"}
FILES = sorted(BENCH.glob("*.py"))
TESTKIT = sorted((ROOT / "testkit").glob("*.py"))


def imported(tree: ast.AST) -> list[tuple[int, str, str | None]]:
    """(line, module, name or None for `import module`) for the project's imports."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name, None) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found += [(node.lineno, node.module, a.name) for a in node.names]
    return [f for f in found if f[1].split(".")[0] in PROJECT]


def private_attributes(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, `x._name`) for private attributes read off anything but self or cls."""
    return [
        (node.lineno, f"{ast.unparse(node.value)}.{node.attr}")
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute)
        and node.attr.startswith("_")
        and not (node.attr.startswith("__") and node.attr.endswith("__"))
        and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"))
    ]


def packages(tree: ast.AST) -> set[str]:
    """The top-level names of every module imported, the project's or not."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module.split(".")[0])
    return found


@pytest.fixture(autouse=True)
def bench_on_path(monkeypatch):
    """As a bench run as a script sees it: bench/ (for `harness`) and the checkout."""
    monkeypatch.syspath_prepend(str(ROOT))
    monkeypatch.syspath_prepend(str(BENCH))


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.stem)
def test_what_a_bench_imports_is_installed(path):
    """CI installs the dev and runtime extras (`just setup`): a package a bench needs
    belongs to one of them."""
    import importlib.util

    missing = sorted(
        name
        for name in packages(ast.parse(path.read_text(), str(path)))
        if importlib.util.find_spec(name) is None
    )
    assert missing == [], f"{path.name} imports {missing}: add them to pyproject's dev extra"


def pytest_mentions(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, what) for every import of pytest or of tests/, and every "pytest" string
    (`python -m pytest` run as a command)."""
    found = [
        (getattr(node, "lineno", 0), name)
        for node in ast.walk(tree)
        if isinstance(node, ast.Import | ast.ImportFrom)
        for name in (
            [a.name for a in node.names]
            if isinstance(node, ast.Import)
            else [node.module or ""] * (node.level == 0)
        )
        if name.split(".")[0] in ("pytest", "_pytest", "tests")
    ]
    found += [
        (node.lineno, repr(node.value))
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and node.value in ("pytest", "tests")
    ]
    return found


@pytest.mark.parametrize("path", FILES + TESTKIT, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_benches_and_testkit_stand_alone(path):
    """A bench is a script: it imports no tests/ module and no pytest, and runs none; nor
    does testkit, which benches import (its `require` raises `Missing`, which the tests'
    conftest turns into a skip and the harness into exit 2)."""
    found = pytest_mentions(ast.parse(path.read_text(), str(path)))
    assert found == [], f"{path.relative_to(ROOT)}: {found}"


def test_importing_testkit_and_the_harness_loads_no_pytest():
    """Read above, loaded here: no module testkit or the harness imports pulls pytest in."""
    import subprocess

    modules = [f"testkit.{p.stem}" for p in TESTKIT if p.stem != "__init__"]
    probe = (
        f"import sys; sys.path[:0] = [{str(ROOT)!r}, {str(BENCH)!r}]\n"
        f"import harness\n"
        + "".join(f"import {m}\n" for m in modules)
        + "print(sorted(m for m in sys.modules if m.split('.')[0] in ('pytest', '_pytest')))"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]", done.stdout


def test_every_bench_is_checked():
    names = {p.stem for p in FILES}
    assert "harness" in names and len([n for n in names if n.startswith("bench_")]) >= 16


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.stem)
def test_a_bench_imports_only_public_names_that_exist(path):
    tree = ast.parse(path.read_text(), str(path))
    problems = []
    for line, module, name in imported(tree):
        where = f"{path.name}:{line}"
        try:
            mod = importlib.import_module(module)
        except ImportError as e:
            problems.append(f"{where}: import {module}: {e}")
            continue
        if name is None:
            continue
        if name.startswith("_"):
            problems.append(f"{where}: from {module} import {name}: a private name")
        elif not hasattr(mod, name):
            try:
                importlib.import_module(f"{module}.{name}")
            except ImportError:
                problems.append(f"{where}: from {module} import {name}: {module} has no {name}")
    problems += [
        f"{path.name}:{line}: {text}: a private attribute"
        for line, text in private_attributes(tree)
    ]
    assert problems == []


@pytest.mark.parametrize(
    "path", [p for p in FILES if p.stem.startswith("bench_")], ids=lambda p: p.stem
)
def test_a_bench_runs_on_the_harness(path):
    """Read, not imported: a bench may import what must not load inside pytest (Locust
    monkey-patches the standard library when imported)."""
    tree = ast.parse(path.read_text(), str(path))
    assert ast.get_docstring(tree), f"{path.name} has no docstring (it is the bench's --help)"
    mains = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "main"]
    calls = [
        n
        for n in ast.walk(tree)
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "run_bench"
    ]
    assert mains and calls, f"{path.name} is not a harness bench (main(bench) run by run_bench)"


def test_the_harness_is_one_module_under_both_names():
    """A bench imports `harness`; one bench importing another may reach `bench.harness`:
    MissingPrecondition must be the same class under both, or exit 2 becomes a traceback."""
    import harness

    assert importlib.import_module("bench.harness") is harness
    assert sys.modules["harness"] is sys.modules["bench.harness"]


TINY = '''"""A bench of nothing: one figure from its options."""
import sys
sys.path.insert(0, {bench!r})
from harness import run_bench


def add_arguments(ap):
    ap.add_argument("--frames", type=int, default=250)
    ap.add_argument("--missing", action="store_true")
    ap.add_argument("--nothing", action="store_true")
    ap.add_argument("--tool", action="store_true")


def main(bench):
    if bench.args.missing:
        bench.missing("the thing it names is not here (install it)")
    if bench.args.tool:
        from testkit.preconditions import require

        require(False, "espeak-ng is not installed (apt-get install espeak-ng)")
    if not bench.args.nothing:
        bench.figure("frames seen", bench.args.frames, "frames", baseline="none", baseline_value=2,
                     inputs={{"loop_frames": bench.args.frames}})


if __name__ == "__main__":
    run_bench(main, __doc__, add_arguments, quick={{"frames": 4}})
'''


def run_tiny(tmp_path, *args):
    import json
    import subprocess

    script = tmp_path / "bench_tiny.py"
    script.write_text(TINY.format(bench=str(BENCH)))
    out = tmp_path / "out.json"
    done = subprocess.run(
        [sys.executable, str(script), "--json", str(out), *args], capture_output=True, text=True
    )
    return done, (json.loads(out.read_text()) if out.exists() else None)


def test_quick_sets_the_small_inputs_and_a_flag_still_wins(tmp_path):
    done, result = run_tiny(tmp_path, "--quick")
    assert done.returncode == 0, done.stderr
    assert result["quick"] is True and result["figures"][0]["value"] == 4
    assert result["figures"][0]["ratio"] == 2 and result["bench"] == "tiny"
    m = result["machine"]
    assert m["cores"] and m["cpu"] and len(m["load_start"]) == 3 and len(m["load_end"]) == 3
    assert m["load_max"] >= 0 and result["commit"]
    done, result = run_tiny(tmp_path, "--quick", "--frames", "9")
    assert result["figures"][0]["value"] == 9
    done, result = run_tiny(tmp_path)
    assert result["quick"] is False and result["figures"][0]["value"] == 250


def test_a_missing_precondition_is_one_line_and_exit_2_and_no_result(tmp_path):
    done, result = run_tiny(tmp_path, "--missing")
    assert done.returncode == 2 and result is None
    assert done.stderr.strip() == (
        "bench tiny: cannot measure: the thing it names is not here (install it)"
    )
    done, result = run_tiny(tmp_path, "--tool")  # testkit's require, as fx.espeak calls it
    assert done.returncode == 2 and result is None
    assert done.stderr.strip() == (
        "bench tiny: cannot measure: espeak-ng is not installed (apt-get install espeak-ng)"
    )
    done, result = run_tiny(tmp_path, "--nothing")
    assert done.returncode == 3 and result is None and "measured nothing" in done.stderr
