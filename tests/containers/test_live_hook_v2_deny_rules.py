"""The live hook in real runc containers in cgroup v2 mode, where the operator's config has deny rules.

* A default-allow config with a deny for something else gets its GPU with bpf_jit_harden 0, 1 and 2 (runc's
  program reads back with `r0 = 0` as `r0 ^= r0` under hardening: that used to stop the container).
* A default-allow config that denies the GPU's major (`deny c 226:* rwm`): the hook refuses in one line
  naming the rule, as runc refuses the same config in the spec-rewrite path; the container does not start.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers import cgroup2
from tests.helpers import containerlib as cl

pytestmark = pytest.mark.containers


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    cl.need("runc", "busybox", "unshare")
    return cl.hook_setup(tmp_path_factory.mktemp("ebpf-containers"))


harden = cgroup2.harden  # bpf_jit_harden 0, 1, 2, restored afterwards


def _run(setup: dict[str, Path], devices: list[dict[str, object]], args: list[str] | None = None):
    bundle = cl.make_bundle(setup["base"] / cl.container_id(), setup["rootfs"], ["AMD_VISIBLE_DEVICES=1"], args)
    cl.add_prestart(bundle, setup["hook"])

    def operator(spec: dict) -> None:
        spec["linux"]["resources"]["devices"] = devices

    cl.edit_spec(bundle, operator)
    return cl.run(cl.cgroup2_wrap(["runc", "run", "--bundle", str(bundle), bundle.name]), env=cl.hook_env())


def test_default_allow_with_another_deny_gets_its_gpu(setup: dict[str, Path], harden: int) -> None:
    done = _run(setup, [{"allow": True, "access": "rwm"},
                        {"allow": False, "type": "c", "major": 13, "access": "rwm"}],
                ["/bin/sh", "/wide.sh"])
    assert done.returncode == 0, done.stderr
    result = cl.parse_wide(done.stdout)
    assert result[("c", 226, 129)] == result[("c", 226, 2)] == "No such device or address"
    assert result[("c", 13, 64)] == "MKNOD-EPERM"  # the operator's deny still holds
    assert result[("c", 226, 130)] != "EPERM" and result[("c", 226, 130)] != "MKNOD-EPERM"  # default allow


def test_gpu_behind_an_operator_deny_is_refused(setup: dict[str, Path]) -> None:
    done = _run(setup, [{"allow": True, "access": "rwm"},
                        {"allow": False, "type": "c", "major": 226, "access": "rwm"}])
    assert done.returncode != 0
    assert "done" not in done.stdout
    # The live hook first reads the container's own rules as runc does, and refuses with the very line the
    # spec-rewrite paths give (v2_grant's own check, against the attached program, is tested in
    # tests/test_cgroup_v2_jit_harden.py).
    assert "would punch a hole in the wildcard rule 'deny c 226:* rwm'" in done.stderr
    assert "Traceback" not in done.stderr
