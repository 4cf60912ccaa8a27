"""The start path's declaration (:mod:`oci_gpu_hook.startpath`) holds for the source: every module it lists imports
only what its allowance names (outside the package), other start-path modules, or what :data:`OFF_PATH` names for
it; read from the source (ast), at a module's top and inside its functions, ``if TYPE_CHECKING:`` blocks aside.
Nothing on the path imports a :data:`NEVER` module at its top.  tests/test_speed_imports.py runs the entries
themselves; this one also covers what only a request reaches (the live hook's cgroup, eBPF and D-Bus code, NVML).

The checks are tried first on a planted package with one break of each rule, so that they cannot pass by reading
nothing."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from oci_gpu_hook import startpath

PACKAGE = Path(__file__).resolve().parent.parent / "oci_gpu_hook"
DYNAMIC = {"import_module", "__import__"}
POINTER = "TYPE_CHECKING = False  # not typing's: see oci_gpu_hook/startpath.py"


def module_path(root: Path, name: str) -> Path | None:
    """The file of the dotted module ``name`` of the package at ``root``, or None."""
    parts = name.split(".")[1:]
    for path in (root.joinpath(*parts, "__init__.py"), root.joinpath(*parts).with_suffix(".py") if parts else None):
        if path is not None and path.is_file():
            return path
    return None


def _is_type_checking(node: ast.If) -> bool:
    return isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"


def imports_of(root: Path, name: str) -> list[tuple[str, bool, int]]:
    """What module ``name`` imports: (the module, at its top (run on import) rather than in a function, line);
    a name inside a module of the package counts as that module; ``if TYPE_CHECKING:`` blocks are not run."""
    path = module_path(root, name)
    assert path is not None, name
    package = root.name
    here = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    found: list[tuple[str, bool, int]] = []

    def module_of(target: str) -> str:
        while "." in target and module_path(root, target) is None:
            target = target.rsplit(".", 1)[0]  # a name inside a module: the module
        return target

    def visit(node: ast.AST, top: bool) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node):
            for child in node.orelse:
                visit(child, top)
            return
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            top = False
        if isinstance(node, ast.Import):
            for alias in node.names:
                found.append((module_of(alias.name) if alias.name.split(".")[0] == package else alias.name, top,
                              node.lineno))
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join([*here[:len(here) - node.level + 1], *([node.module] if node.module else [])])
            if base.split(".")[0] == package:
                found.extend((module_of(f"{base}.{alias.name}"), top, node.lineno) for alias in node.names)
            else:
                found.append((base, top, node.lineno))
        elif (isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant)
              and isinstance(node.args[0].value, str)
              and (getattr(node.func, "attr", None) in DYNAMIC or getattr(node.func, "id", None) in DYNAMIC)):
            target = node.args[0].value
            found.append((module_of(target) if target.split(".")[0] == package else target, top, node.lineno))
        for child in ast.iter_child_nodes(node):
            visit(child, top)

    visit(ast.parse(path.read_text(encoding="utf-8"), str(path)), True)
    return found


def violations(root: Path, modules: dict[str, frozenset[str]], off_path: dict[str, dict[str, str]],
               never: frozenset[str]) -> list[str]:
    """Each import of a declared module outside its allowance, and each NEVER module imported at a module's top."""
    package = root.name
    wrong = []
    for name in sorted(modules):
        for target, top, line in imports_of(root, name):
            where = f"{name} (line {line}) imports {target}"
            if target == "__future__" or target == name:
                continue
            if target.split(".")[0] == package:
                if target not in modules and target not in off_path.get(name, {}):
                    wrong.append(f"{where}: not on the start path")
            elif target not in modules[name]:
                wrong.append(f"{where}: not in its allowance")
            elif top and target in never:
                wrong.append(f"{where} at its top: never on the start path")
    return wrong


PLANTED = {
    "__init__.py": "",
    "a.py": ("from __future__ import annotations\nimport os\nTYPE_CHECKING = False\nif TYPE_CHECKING:\n"
             "    from typing import Any\n    from pkg import off\nfrom pkg import b\n"),
    "b.py": "import re\nfrom . import off\n",
    "c.py": "import tomllib\n\ndef f():\n    import json\n    from pkg.off import x\n    return __import__('pkg.d')\n",
    "d.py": "def f():\n    import tomllib\n",
    "off.py": "import re\n",
}
PLANTED_MODULES = {"pkg": frozenset(), "pkg.a": frozenset({"os"}), "pkg.b": frozenset(),
                   "pkg.c": frozenset({"tomllib"}), "pkg.d": frozenset({"tomllib"})}


@pytest.fixture(scope="module")
def planted(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("planted") / "pkg"
    for name, text in PLANTED.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


def test_the_checks_find_what_was_planted(planted: Path) -> None:
    assert imports_of(planted, "pkg.a") == [("__future__", True, 1), ("os", True, 2), ("pkg.b", True, 7)]
    assert violations(planted, PLANTED_MODULES, {}, frozenset({"tomllib", "json"})) == [
        "pkg.b (line 1) imports re: not in its allowance",
        "pkg.b (line 2) imports pkg.off: not on the start path",
        "pkg.c (line 1) imports tomllib at its top: never on the start path",
        "pkg.c (line 4) imports json: not in its allowance",
        "pkg.c (line 5) imports pkg.off: not on the start path",
    ]  # pkg.d: tomllib inside a function, allowed; pkg.c's __import__('pkg.d'): on the path
    assert violations(planted, PLANTED_MODULES, {"pkg.b": {"pkg.off": "why"}, "pkg.c": {"pkg.off": "why"}},
                      frozenset()) == ["pkg.b (line 1) imports re: not in its allowance",
                                       "pkg.c (line 4) imports json: not in its allowance"]


def test_the_declaration_names_real_modules() -> None:
    assert len(startpath.MODULES) > 30
    assert [name for name in startpath.MODULES if module_path(PACKAGE, name) is None] == []
    for name, targets in startpath.OFF_PATH.items():
        assert name in startpath.MODULES, name
        assert all(module_path(PACKAGE, t) is not None and t not in startpath.MODULES for t in targets), targets


def test_every_entrys_modules_are_declared() -> None:
    for entry, names in [*startpath.ENTRIES.items(), ("nvidia", startpath.NVIDIA)]:
        ours = {name for name in names if name.split(".")[0] == "oci_gpu_hook"}
        assert ours <= set(startpath.MODULES), (entry, sorted(ours - set(startpath.MODULES)))


def test_each_start_path_module_imports_only_its_allowance() -> None:
    assert violations(PACKAGE, startpath.MODULES, startpath.OFF_PATH, startpath.NEVER) == []


def server_breaches(root: Path, servers: str, modules: dict[str, frozenset[str]],
                    off_path: dict[str, dict[str, str]]) -> list[str]:
    """Each import of the package, by a module of the ``servers`` package, of neither a start-path module, nor a
    module of ``servers``, nor what ``off_path`` names for it."""
    package = root.name
    names = sorted(".".join([package, *path.relative_to(root).with_suffix("").parts]).removesuffix(".__init__")
                   for path in root.joinpath(*servers.split(".")[1:]).rglob("*.py"))
    wrong = []
    for name in names:
        for target, _top, line in imports_of(root, name):
            if (target.split(".")[0] == package and target not in modules and target != servers
                    and not target.startswith(servers + ".") and target not in off_path.get(name, {})):
                wrong.append(f"{name} (line {line}) imports {target}: neither on the start path nor a server's")
    return wrong


def test_the_server_check_finds_what_was_planted(planted: Path) -> None:
    (planted / "srv").mkdir(exist_ok=True)
    (planted / "srv" / "__init__.py").write_text("from pkg import a\n")
    (planted / "srv" / "one.py").write_text("from pkg.srv import two\ndef f():\n    from pkg import off\n")
    (planted / "srv" / "two.py").write_text("import pkg.off\n")
    assert server_breaches(planted, "pkg.srv", PLANTED_MODULES, {"pkg.srv.two": {"pkg.off": "why"}}) == [
        "pkg.srv.one (line 3) imports pkg.off: neither on the start path nor a server's"]


def test_the_servers_import_only_the_start_path() -> None:
    assert len(list(PACKAGE.joinpath(*startpath.SERVERS.split(".")[1:]).rglob("*.py"))) > 10
    for name, targets in startpath.SERVER_OFF_PATH.items():
        assert name.startswith(startpath.SERVERS + ".") and module_path(PACKAGE, name) is not None, name
        assert all(module_path(PACKAGE, target) is not None for target in targets), targets
    assert server_breaches(PACKAGE, startpath.SERVERS, startpath.MODULES, startpath.SERVER_OFF_PATH) == []


def test_every_type_checking_line_points_to_the_declaration() -> None:
    lines = [(path, line.strip()) for path in sorted(PACKAGE.rglob("*.py"))
             for line in path.read_text(encoding="utf-8").splitlines() if line.startswith("TYPE_CHECKING")]
    assert len(lines) > 30
    assert [(str(path.relative_to(PACKAGE)), line) for path, line in lines if line != POINTER] == []
