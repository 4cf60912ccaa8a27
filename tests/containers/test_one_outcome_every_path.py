"""The same config gives the same outcome on every path: spec rewrite (dry-run, shim), live hook in v1 and v2.

A default-allow container (``allow a``) whose operator denied ``c 226:*``: runc refuses to punch a hole in that
wildcard for one GPU, so every path refuses with the same line (before: v2 granted over the deny, the shim was
refused by runc, v1 reported success and left the GPU denied).  A default-allow container with one specific
deny gets its GPU on every path, and the denied device stays denied.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import containerlib as cl

pytestmark = pytest.mark.containers

WILDCARD_DENY = [{"allow": True, "access": "rwm"}, {"allow": False, "type": "c", "major": 226, "access": "rwm"}]
ONE_DENY = [{"allow": True, "access": "rwm"}, {"allow": False, "type": "c", "major": 226, "minor": 130,
                                               "access": "rwm"}]
PATHS = ["dry-run-v1", "shim-v1", "shim-v2", "prestart-v1", "prestart-v2"]


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    cl.need("runc", "busybox", "unshare")
    return cl.hook_setup(tmp_path_factory.mktemp("policy"))


def _start(setup: dict[str, Path], path: str, rules: list[dict[str, Any]]) -> subprocess.CompletedProcess[str]:
    bundle = cl.make_bundle(setup["base"] / cl.container_id(), setup["rootfs"], ["AMD_VISIBLE_DEVICES=1"])

    def change(spec: dict[str, Any]) -> None:
        spec["linux"]["resources"]["devices"] = rules

    cl.edit_spec(bundle, change)
    runtime = "runc"
    if path.startswith("dry-run"):
        done = cl.run([str(setup["hook"]), "dry-run", str(bundle)], env=cl.hook_env())
        if done.returncode:
            return done
        (bundle / "config.json").write_text(done.stdout)
    elif path.startswith("shim"):
        runtime = str(setup["runtime"])
    else:
        cl.add_prestart(bundle, setup["hook"])
    argv = [runtime, "run", "--bundle", str(bundle), bundle.name]
    return cl.run(cl.cgroup2_wrap(argv) if path.endswith("v2") else argv, env=cl.hook_env())


@pytest.mark.parametrize("path", PATHS)
def test_a_hole_in_an_operator_wildcard_deny_is_refused_everywhere(setup: dict[str, Path], path: str) -> None:
    done = _start(setup, path, WILDCARD_DENY)
    assert done.returncode != 0, done.stdout
    assert "would punch a hole in the wildcard rule 'deny c 226:* rwm'" in done.stderr, done.stderr
    assert "done" not in done.stdout and "Traceback" not in done.stderr


@pytest.mark.parametrize("path", PATHS)
def test_default_allow_with_one_deny_grants_the_gpu_everywhere(setup: dict[str, Path], path: str) -> None:
    done = _start(setup, path, ONE_DENY)
    assert done.returncode == 0, done.stderr
    result = cl.ProbeResult.parse(done.stdout)
    assert result.nodes["/dev/dri/renderD129"] == result.nodes["/dev/kfd"] == "ENXIO"
    # the operator's deny stands: it covers m too, so even the probe's mknod of 226:130 is refused
    assert (226, 130) not in result.access and (226, 131) in result.access
    assert result.access[(226, 129)] == result.access[(226, 2)] == "ENXIO"
