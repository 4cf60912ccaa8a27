"""benchmarks/gpu_create.py, one round: it still builds, installs and measures every path on both images, prints
its table, leaves no container, mount or file behind, and never writes the host's /etc or /usr/local.  Timing is
not judged here (one sample each on a shared machine); the table's numbers are docs/speed.md's business."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import need
from tests.helpers import wheellib

pytestmark = pytest.mark.containers
REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "benchmarks" / "gpu_create.py"
PATHS = ("shim", "precreate", "prestart", "cdi", "nri")
WATCHED = ("/etc/oci-gpu-hook", "/usr/local/libexec/oci-gpu-hook", "/usr/share/containers/oci/hooks.d",
           "/run/oci-gpu-hook")


def _listing() -> dict[str, list[str]]:
    return {path: sorted(os.listdir(path)) if os.path.isdir(path) else [] for path in WATCHED}


def test_one_round_of_every_path_and_image(tmp_path: Path) -> None:
    need("runc", "busybox", "unshare", "ldconfig")
    before = _listing()
    mounts_before = Path("/proc/self/mountinfo").read_text().count("ogh-bench-")
    out = tmp_path / "samples.json"
    # 200 of the host's libraries (and their links) for the cuda image: hundreds, copied in a fraction of the time
    done = subprocess.run([sys.executable, str(SCRIPT), "--rounds", "1", "--warmup", "0", "--cuda-libs", "200",
                           "--wheel", str(wheellib.built_wheel()), "--json", str(out)], capture_output=True,
                          text=True, timeout=600, cwd="/", check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    data = json.loads(out.read_text())
    cases = {case["key"]: case for case in data["cases"]}
    for image in ("small", "cuda"):
        for path in ("bare", "floor", *PATHS):
            assert len(cases[f"{image}/{path}"]["samples"]) == 1, (image, path, sorted(cases))
        for path in PATHS:  # every path has a floor that is a case of its image, with the GPU's node (checked)
            assert cases[f"{image}/{path}"]["floor"].startswith(f"{image}/floor"), cases[f"{image}/{path}"]
    # a CDI spec gives every capability: more mounts than the shim's request, so a floor of its own
    assert cases["small/cdi"]["floor"] == "small/floor (cdi)"
    assert cases["small/prestart"]["floor"] == cases["small/shim"]["floor"] == "small/floor"
    table = [line for line in done.stdout.splitlines() if line.startswith("| ")]
    assert table[0].startswith("| path | image | median ms | p10 | p90 | over bare runc | over floor | ratio to floor")
    assert len(table) == 1 + len(cases), done.stdout  # the header, then one row a case
    assert "cuda: " in data["meta"]["images"] and int(data["meta"]["images"].split("cuda: ")[1].split()[0]) > 100
    assert data["targets"] and {t["name"].split(":")[0] for t in data["targets"]} == {
        f"{image}/{path}" for image in ("small", "cuda") for path in PATHS}
    # nothing left: containers, mounts, the host's directories as they were
    left = subprocess.run(["runc", "list", "--quiet"], capture_output=True, text=True, check=True).stdout.split()
    assert not [c for c in left if c.startswith("ogh-bench-")], left
    assert Path("/proc/self/mountinfo").read_text().count("ogh-bench-") == mounts_before
    assert _listing() == before
