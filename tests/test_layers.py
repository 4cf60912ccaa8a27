"""The package's layers, read from its source (ast): every import, at a module's top, inside a function or under
``TYPE_CHECKING``, and every ``importlib.import_module``/``__import__`` of a constant name.

The packages are stacked by when and where they run (docs/development.md has the map), and an import only goes
down the stack or stays on its floor (:data:`LAYERS`, top first):

- ``entry/``: the command lines; the one place that knows every command, so nothing below it imports it (what a
  lower layer needs of it is passed in: the planner's ``launch``).
- ``install/`` and ``fastpath/``'s Python: what runs once, at install (the launchers, the native front's build, the
  runtimes' configuration); it reads the planner's constants to bake them into the launchers, so it sits above
  ``serve/``.
- ``serve/``: the per-container servers (the planner, the NRI plugin), on the start path; the planner's metrics
  endpoint serves ``cluster/``'s health and counters, so it sits above ``cluster/``.
- ``cluster/``: the daemons beside the containers (device plugin, DRA driver, health, metrics, watch).
- the rest: the per-container pipeline (``core/``, ``inventory/``, ``request.py``, ``plan.py``, ``appliers/``,
  the top-level modules), which takes nothing from the layers above it: a container start must not load the
  operator's code.

And: no import cycle between the package's modules; no hand-written source file (Python or C) over 650 lines.

The import checks are tried first on a planted package with one break of each rule, so that they cannot pass by
reading nothing."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "oci_gpu_hook"
DYNAMIC = {"import_module", "__import__"}


def module_names(root: Path) -> dict[str, Path]:
    """Every module below ``root`` (a package directory), by its dotted name."""
    found = {}
    for path in sorted(root.rglob("*.py")):
        if "__pycache__" in path.parts:
            continue
        parts = [root.name, *path.relative_to(root).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def imported(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The package's modules that ``name`` (at ``path``) imports: ``from P import M`` counts as M where M is a
    module, else as P."""
    package = name.split(".")[0]
    here = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    targets: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            targets.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join([*here[:len(here) - node.level + 1], *([node.module] if node.module else [])])
            targets.update(f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base
                           for alias in node.names)
        elif (isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant)
              and isinstance(node.args[0].value, str)
              and (getattr(node.func, "attr", None) in DYNAMIC or getattr(node.func, "id", None) in DYNAMIC)):
            targets.add(node.args[0].value)
    found = set()
    for target in targets:
        while target and target not in modules and target.startswith(package + "."):
            target = target.rsplit(".", 1)[0]  # a name inside a module: the module
        if target in modules and target != name:
            found.add(target)
    return found


def import_graph(root: Path) -> dict[str, set[str]]:
    modules = module_names(root)
    return {name: imported(name, path, modules) for name, path in modules.items()}


def inside(name: str, layer: str) -> bool:
    return name == layer or name.startswith(layer + ".")


# Top first, a floor's packages together; a package not named here is the per-container pipeline, the bottom floor.
# fastpath/'s Python is the native front's build, run at install (it bakes the planner's constants).
LAYERS = (("entry",), ("install", "fastpath"), ("serve",), ("cluster",))


def floor(name: str, package: str) -> int:
    """How far down the stack ``name`` sits: 0 for ``entry/``, len(LAYERS) for the pipeline."""
    for depth, layer in enumerate(LAYERS):
        if any(inside(name, f"{package}.{part}") for part in layer):
            return depth
    return len(LAYERS)


def upward(graph: dict[str, set[str]], package: str) -> list[str]:
    """Every import that climbs: into a layer above the importer's."""
    return [f"{name} imports {target}" for name, targets in sorted(graph.items()) for target in sorted(targets)
            if floor(target, package) < floor(name, package)]


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's, without recursion)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


PLANTED = {
    "__init__.py": "",
    "entry/__init__.py": "",
    "entry/cli.py": "PRECREATE = 'precreate'\n",
    "entry/serve.py": "from pkg.serve import planner\n",
    "install/__init__.py": "",
    "install/launchers.py": "from ..entry import cli\nfrom pkg.serve import planner\nfrom pkg.fastpath import build\n",
    "fastpath/__init__.py": "",
    "fastpath/build.py": "from pkg.serve import planner\nfrom pkg.entry.cli import PRECREATE\n",
    "serve/__init__.py": "",
    "serve/planner.py": "def f():\n    from pkg.entry.cli import PRECREATE\n    return PRECREATE\n",
    "serve/nri.py": "from pkg.install import launchers\nfrom pkg.cluster import metrics\n",
    "cluster/__init__.py": "",
    "cluster/metrics.py": "",
    "cluster/watch.py": "import importlib\nimportlib.import_module('pkg.entry.cli')\nfrom pkg.serve import nri\n",
    "core/__init__.py": "",
    "core/a.py": "TYPE_CHECKING = False\nif TYPE_CHECKING:\n    from . import b\nfrom pkg.cluster.watch import x\n",
    "core/b.py": "from .c import y\n",
    "core/c.py": "import pkg.core.a\n",
    "plan.py": "from pkg.core import a\n",
}


@pytest.fixture(scope="module")
def planted(tmp_path_factory: pytest.TempPathFactory) -> dict[str, set[str]]:
    root = tmp_path_factory.mktemp("planted") / "pkg"
    for name, text in PLANTED.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return import_graph(root)


def test_the_checks_find_what_was_planted(planted: dict[str, set[str]]) -> None:
    assert planted["pkg.plan"] == {"pkg.core.a"}
    assert upward(planted, "pkg") == [
        "pkg.cluster.watch imports pkg.entry.cli", "pkg.cluster.watch imports pkg.serve.nri",
        "pkg.core.a imports pkg.cluster.watch", "pkg.fastpath.build imports pkg.entry.cli",
        "pkg.install.launchers imports pkg.entry.cli",
        "pkg.serve.nri imports pkg.install.launchers", "pkg.serve.planner imports pkg.entry.cli"]
    assert cycles(planted) == [["pkg.core.a", "pkg.core.b", "pkg.core.c"]]


def test_the_package_is_read() -> None:
    graph = import_graph(PACKAGE)
    assert len(graph) > 50
    assert {"oci_gpu_hook.oci_argv", "oci_gpu_hook.errors"} <= graph["oci_gpu_hook.entry.runtime"]
    assert "oci_gpu_hook.serve.planner" in graph["oci_gpu_hook.fastpath.build"]  # a lazy import, inside a function
    assert "oci_gpu_hook.config" in graph["oci_gpu_hook.serve.planner.server"]  # under TYPE_CHECKING


def test_no_import_climbs_a_layer() -> None:
    assert upward(import_graph(PACKAGE), "oci_gpu_hook") == []


def test_no_import_cycle() -> None:
    assert cycles(import_graph(PACKAGE)) == []


MAX_LINES = 650  # a module a reader can hold; past it, split by responsibility


def test_no_source_file_is_too_long() -> None:
    """Every hand-written source file, Python or C, is at most MAX_LINES lines (the grpcio-tools output,
    *_pb2*.py, aside)."""
    paths = [*module_names(PACKAGE).values(), *sorted(PACKAGE.rglob("*.[ch]"))]
    lengths = {str(path.relative_to(PACKAGE)): len(path.read_text(encoding="utf-8").splitlines())
               for path in paths if "_pb2" not in path.name}
    assert len(lengths) > 50 and "fastpath/front.c" in lengths
    assert {name: n for name, n in lengths.items() if n > MAX_LINES} == {}
