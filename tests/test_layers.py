"""The package's layers: the import graph of python/distgemm has no cycle and points only down.

The graph is read with ``ast`` from every import statement, those inside functions and under
``TYPE_CHECKING`` included. The layers, bottom to top: ``_core`` (C++), ``plan/``, ``runtime/``
(whose modules form a DAG of their own), ``ops``, ``compat/``, then the command-line modules and
the package's ``__init__``. Also: the plan layer loads without torch, and no module is over 500
lines.
"""

import ast
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "python" / "distgemm"
# Bottom to top; a module may import its own layer's modules (acyclically) and the layers below.
LAYERS = ["_core", "plan", "runtime", "ops", "compat", "top"]
MAX_LINES = 500


def module_name(path: pathlib.Path) -> str:
    rel = path.relative_to(PACKAGE.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules() -> dict[str, pathlib.Path]:
    found = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    assert len(found) > 20, f"only {len(found)} modules under {PACKAGE}"
    return found


def imports_of(name: str, path: pathlib.Path, known: set[str]) -> set[str]:
    """The package's modules that ``name`` imports, wherever the import statement stands."""
    is_package = path.name == "__init__.py"
    package = name if is_package else name.rsplit(".", 1)[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            for alias in node.names:
                full = f"{target}.{alias.name}"
                if full in known:
                    out.add(full)
                elif target in known:
                    out.add(target)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name in known)
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "import_module":
            # importlib.import_module(f".{x}", __name__): only the package facade may do this
            assert name == "distgemm", f"{name} imports through importlib"
    out.discard(name)
    return out


def import_graph() -> dict[str, set[str]]:
    mods = modules()
    known = set(mods) | {"distgemm._core"}
    graph = {name: imports_of(name, path, known) for name, path in mods.items()}
    graph["distgemm._core"] = set()
    return graph


def layer_of(name: str) -> str:
    parts = name.split(".")
    if len(parts) == 1:
        return "top"  # the package facade
    first = parts[1]
    return first if first in LAYERS else "top"  # __main__, simulate, tune


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(n: str) -> list[str] | None:
        state[n] = 1
        stack.append(n)
        for m in sorted(graph[n]):
            if state.get(m) == 1:
                return stack[stack.index(m) :] + [m]
            if m not in state:
                found = visit(m)
                if found:
                    return found
        stack.pop()
        state[n] = 2
        return None

    for n in sorted(graph):
        if n not in state:
            found = visit(n)
            if found:
                return found
    return None


def test_the_import_graph_has_no_cycle():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_the_cycle_finder_finds_a_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_every_import_points_to_the_same_layer_or_below():
    graph = import_graph()
    up = [
        f"{n} ({layer_of(n)}) imports {m} ({layer_of(m)})"
        for n, deps in graph.items()
        for m in deps
        if m != "distgemm" and LAYERS.index(layer_of(m)) > LAYERS.index(layer_of(n))
    ]
    assert up == []
    # Only the package facade and the command-line modules import the facade itself.
    facade_users = sorted(n for n, deps in graph.items() if "distgemm" in deps)
    assert all(layer_of(n) == "top" for n in facade_users), facade_users


def test_each_path_module_imports_no_other_path_but_shared_helpers():
    """The paths are alternatives: what they share lives in paths/common.py; no path module
    imports another."""
    graph = import_graph()
    paths = [n for n in graph if n.startswith("distgemm.runtime.paths.")]
    crossing = {
        (n, m)
        for n in paths
        for m in graph[n]
        if m.startswith("distgemm.runtime.paths.") and not m.endswith(".common")
    }
    assert crossing == set()


def test_the_plan_layer_loads_without_torch():
    code = (
        "import sys, distgemm, distgemm.plan, distgemm.simulate; "
        "assert 'torch' not in sys.modules, 'torch was imported'"
    )
    import distgemm  # the package under test: the sources, or where it is installed (CI)

    res = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env={
            "PYTHONPATH": str(pathlib.Path(distgemm.__file__).parents[1]),
            "PATH": "/usr/bin:/bin",
        },
        timeout=120,
    )
    assert res.returncode == 0, res.stderr[-2000:]


@pytest.mark.parametrize("folder", ["python/distgemm", "benchmarks"])
def test_no_module_is_over_500_lines(folder):
    base = ROOT / folder
    if not base.exists():
        pytest.fail(f"{base} is missing")
    long = {
        str(p.relative_to(ROOT)): n
        for p in base.rglob("*.py")
        if "results" not in p.parts and (n := len(p.read_text().splitlines())) > MAX_LINES
    }
    assert long == {}


def test_every_module_says_its_job_in_its_first_line():
    missing = [
        name
        for name, path in modules().items()
        if not path.read_text().startswith('"""') or len(path.read_text().splitlines()[0]) < 20
    ]
    assert missing == []
