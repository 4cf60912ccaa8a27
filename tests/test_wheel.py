"""The wheel carries everything the package needs at run time: every module, the native front's source (which
``launchers`` and ``install`` compile on the node), the JSON schemas and the device plugin's proto; and the two
console scripts.  Built from a clean copy of this checkout, as ``pip install .`` from a fresh clone builds it."""

from __future__ import annotations

import configparser
import zipfile

from oci_gpu_hook.fastpath.build import FRONT_PARTS
from tests.helpers import wheellib

PACKAGE = wheellib.REPO / "oci_gpu_hook"
# What the code opens at run time besides its modules (each named where it is read).
RUNTIME_DATA = [
    "oci_gpu_hook/fastpath/front.c",  # fastpath/build.py FRONT_SOURCE
    *[f"oci_gpu_hook/fastpath/{part}" for part in FRONT_PARTS],  # what front.c #includes
    *[f"oci_gpu_hook/schemas/{p.name}" for p in sorted((wheellib.REPO / "schemas").glob("*.json"))],  # schemas.py
    "oci_gpu_hook/cluster/deviceplugin/api.proto",  # the device plugin's contract, next to its generated modules
]


def package_files() -> set[str]:
    """Every file of the package in this checkout (the schemas link followed), caches aside."""
    found = set()
    for path in PACKAGE.rglob("*"):
        if "__pycache__" in path.parts or path.is_dir():
            continue
        found.add(path.relative_to(wheellib.REPO).as_posix())
    for schema in (PACKAGE / "schemas").iterdir():  # rglob does not follow the directory link
        found.add(f"oci_gpu_hook/schemas/{schema.name}")
    return found


def test_the_wheel_ships_every_runtime_file() -> None:
    wheel = wheellib.built_wheel()
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        entry_points = archive.read(next(n for n in names if n.endswith(".dist-info/entry_points.txt"))).decode()
    shipped = {n for n in names if n.startswith("oci_gpu_hook/")}
    wanted = package_files()
    assert len(RUNTIME_DATA) >= 7 and set(RUNTIME_DATA) <= wanted
    assert sorted(wanted - shipped) == [], "in the package but not in the wheel"
    assert sorted(shipped - wanted) == [], "in the wheel but not in the package"
    assert {n for n in wanted if n.endswith(".py")} >= {"oci_gpu_hook/entry/cli.py", "oci_gpu_hook/entry/runtime.py"}
    scripts = configparser.ConfigParser()
    scripts.read_string(entry_points)
    assert dict(scripts["console_scripts"]) == {"oci-gpu-hook": "oci_gpu_hook.entry.cli:main",
                                                "oci-gpu-runtime": "oci_gpu_hook.entry.runtime:main"}
    assert not any(n.startswith(("tests/", "examples/", "benchmarks/")) for n in names)


def test_the_wheel_is_built_from_a_clean_copy() -> None:
    """Nothing of this checkout's own build/ or egg-info gets in: the wheel holds the tree as it is now."""
    wheel = wheellib.built_wheel()
    assert wheellib.REPO not in wheel.parents
    with zipfile.ZipFile(wheel) as archive:
        for name in ("front.c", *FRONT_PARTS):
            assert archive.read(f"oci_gpu_hook/fastpath/{name}") == (PACKAGE / "fastpath" / name).read_bytes(), name
