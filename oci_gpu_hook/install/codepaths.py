"""What an install runs code from: the package's parent, the environment's site-packages and standard library, its
``pyvenv.cfg``, and every file the package and its requirements put on disk.

The launchers' trust checks walk these (:mod:`oci_gpu_hook.install.launchers`), the native front bakes them
(:mod:`oci_gpu_hook.fastpath.build`), the install's pins record them (:mod:`oci_gpu_hook.pins`), and ``install``
and ``validate`` walk the package trees in full (:mod:`oci_gpu_hook.install.guard`).
"""

from __future__ import annotations

import os
import sys

from oci_gpu_hook.errors import HookError

# What site-packages and stdlib directories the interpreter has when ``site`` runs at its start-up.
_STARTUP_PATHS = ("import site, sysconfig; print(repr((site.getsitepackages(), "
                  "[sysconfig.get_path(n) for n in ('stdlib', 'platstdlib')])))")
_PATHS: list[list[str]] = []


def _startup_paths() -> list[list[str]]:
    """[site-packages, stdlib directories] of this interpreter's environment as ``site`` sets them up.  Under
    ``python -S`` (an installed launcher runs so) ``site`` did not run and ``sys.prefix`` is the base interpreter's,
    not the virtual environment's: then the interpreter itself is asked, with ``site``."""
    if not _PATHS:
        if sys.flags.no_site:
            import ast
            import subprocess

            done = subprocess.run([sys.executable, "-I", "-c", _STARTUP_PATHS], capture_output=True, text=True,
                                  timeout=120)
            if done.returncode != 0:
                raise HookError(f"cannot ask {sys.executable} for its site-packages: {done.stderr.strip()[:500]}")
            _PATHS.extend(ast.literal_eval(done.stdout.strip()))
        else:
            import site
            import sysconfig

            _PATHS.extend([site.getsitepackages(), [sysconfig.get_path(n) for n in ("stdlib", "platstdlib")]])
    return _PATHS


def site_packages() -> list[str]:
    """The site-packages directories of this interpreter's environment, whether or not ``site`` ran here."""
    return list(_startup_paths()[0])


def _package_parent() -> str:
    return os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def code_paths() -> list[str]:
    """Where a launcher loads code from: this package's parent and the environment's site-packages."""
    return list(dict.fromkeys([_package_parent(), *site_packages()]))


def package_trees() -> list[str]:
    """What the package and every distribution it requires (recursively, its extras' too: whatever of them is
    installed) put on disk: the top-level files and directories of each in its site-packages, and each file it put
    elsewhere (a script in bin/), from their installed records (``RECORD``); and the package's own directory (an
    editable install's records do not name it).  What install and ``validate`` walk
    in full (:func:`oci_gpu_hook.trust.tree_problem`): a launcher walks only down to site-packages at each start."""
    import importlib.metadata
    import re

    search = code_paths()
    todo, seen, trees = ["oci-gpu-hook"], set(), {os.path.dirname(os.path.dirname(os.path.abspath(__file__)))}
    while todo:
        name = re.sub(r"[-_.]+", "-", todo.pop()).lower()
        found = next(iter(importlib.metadata.distributions(name=name, path=search)), None)
        if name in seen or found is None:
            continue
        seen.add(name)
        for file in found.files or []:
            top = file.parts[0] if file.parts and file.parts[0] != ".." else file
            trees.add(os.path.normpath(os.path.abspath(str(found.locate_file(top)))))
        todo.extend(m.group() for m in (re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", r) for r in found.requires or [])
                    if m)
    return sorted(trees)


def stdlib_paths() -> list[str]:
    return [p for p in dict.fromkeys(_startup_paths()[1]) if p and os.path.isdir(p)]


def editable_reason() -> str | None:
    """Why this is an editable (development) install, or None: the package must live in a site-packages
    directory of the interpreter."""
    package_parent = _package_parent()
    inside = [p for p in site_packages() if package_parent == os.path.normpath(p)]
    if not inside:
        return (f"the package is loaded from {package_parent}, outside site-packages (an editable install?); "
                "install it into a root-owned environment (python3 -m venv /opt/oci-gpu-hook && "
                "/opt/oci-gpu-hook/bin/pip install .), or pass --allow-editable")
    return None



def venv_config() -> list[str]:
    """The virtual environment's ``pyvenv.cfg`` (which names the interpreter's home, its standard library: read by
    every start of the interpreter), or nothing outside a virtual environment."""
    path = os.path.join(os.path.dirname(os.path.dirname(sys.executable)), "pyvenv.cfg")
    return [path] if os.path.isfile(path) else []
