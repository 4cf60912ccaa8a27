"""The repository stands alone: no file in it points outside the checkout for its facts.

The hardware facts the inventory and the test helpers rely on are in ``docs/hardware.md``; a file that cites
them names a section there (``docs/hardware.md#amd-compute-partitions``), and each such section exists.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

from tests.conftest import unavailable
from tests.test_readme import slug

REPO = Path(__file__).resolve().parent.parent
HARDWARE = REPO / "docs" / "hardware.md"
# Built from parts so that this file does not name what it looks for.
OUTSIDE = ("." + "./" + "shared", "shared" + "/" + "reference")
CITED = re.compile(r"docs/hardware\.md#([\w-]+)")


def repository_files() -> list[str]:
    """Every file git tracks, and every new one it would track (not ignored), relative to the checkout."""
    if shutil.which("git") is None or not (REPO / ".git").exists():
        unavailable("not a git checkout with git on PATH")
    out = subprocess.run(["git", "-C", str(REPO), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                         capture_output=True, check=True).stdout
    return sorted({name.decode() for name in out.split(b"\0") if name})


def text_of(name: str) -> str | None:
    """A file's text (a symlink's target, which git stores as its content); None for a binary or gone file."""
    path = REPO / name
    if path.is_symlink():
        return os.readlink(path)
    if not path.is_file():
        return None  # deleted in the work tree, or a submodule
    data = path.read_bytes()
    return None if b"\0" in data else data.decode(errors="replace")


def test_the_file_list_is_the_repository() -> None:
    names = repository_files()
    assert {"README.md", "docs/hardware.md", "tests/test_standalone.py", "oci_gpu_hook/inventory/amd.py"} <= set(
        names)
    assert not any(n.startswith(".venv/") for n in names)


def test_no_file_refers_outside_the_repository() -> None:
    found = []
    for name in repository_files():
        text = text_of(name)
        for line_number, line in enumerate((text or "").splitlines(), 1):
            if any(needle in line for needle in OUTSIDE):
                found.append(f"{name}:{line_number}: {line.strip()}")
    assert not found, "\n".join(found)


def test_the_needles_are_found() -> None:
    """The check above finds the references it is for (and nothing in an ordinary line)."""
    citations = [f"see {OUTSIDE[0]}/reference/platform-facts.md", f"`{OUTSIDE[1]}/testing-here.md`"]
    assert all(any(needle in line for needle in OUTSIDE) for line in citations)
    assert not any(needle in "shared by amd GPUs: /dev/kfd" for needle in OUTSIDE)


def anchors(markdown: str) -> set[str]:
    """The anchors GitHub gives the headings of ``markdown`` (fenced blocks are not headings)."""
    outside_fences = re.sub(r"^```.*?^```", "", markdown, flags=re.M | re.S)
    return {slug(heading) for heading in re.findall(r"^#+ (.*)$", outside_fences, re.M)}


def test_every_cited_hardware_section_exists() -> None:
    sections = anchors(HARDWARE.read_text())
    cited: dict[str, list[str]] = {}
    for name in repository_files():
        for anchor in CITED.findall(text_of(name) or ""):
            cited.setdefault(anchor, []).append(name)
    for anchor in re.findall(r"\]\(#([^)]+)\)", HARDWARE.read_text()):  # its links to its own sections
        cited.setdefault(anchor, []).append("docs/hardware.md")
    missing = {anchor: names for anchor, names in cited.items() if anchor not in sections}
    assert not missing, missing
    # the inventory's backends and the helpers that build fake hosts cite it
    citing = {name for names in cited.values() for name in names}
    assert {"oci_gpu_hook/inventory/amd.py", "oci_gpu_hook/inventory/nvidia.py", "tests/helpers/fakesysfs.py",
            "tests/helpers/fakenvidia.py", "tests/helpers/containerlib.py", "README.md"} <= citing, citing


def test_anchors_are_githubs() -> None:
    assert anchors("# Hardware\n## AMD compute partitions\n```\n# not a heading\n```\n### NVIDIA MIG\n") == {
        "hardware", "amd-compute-partitions", "nvidia-mig"}
