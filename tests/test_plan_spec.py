"""The plan (what a container gets) and the spec rewrite (how it lands in config.json)."""

from __future__ import annotations

import copy
import functools
import json
import os
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from oci_gpu_hook import inventory as inventory_module
from oci_gpu_hook.appliers import bypath
from oci_gpu_hook.appliers.ocispec import apply as apply_edits
from oci_gpu_hook.appliers.ocispec import rewrite_text
from oci_gpu_hook.config import Config
from oci_gpu_hook.core.devices import Rule as DeviceRule
from oci_gpu_hook.core.rules import Policy, grants
from oci_gpu_hook.errors import HookError
from oci_gpu_hook.inventory import Inventory, scan
from oci_gpu_hook.oci_spec import ContainerSpec, process_env
from oci_gpu_hook.plan import build_plan, plan_for_spec
from oci_gpu_hook.request import KindAsk, Request

REPO = Path(__file__).resolve().parent.parent
EXAMPLE_SYSFS = REPO / "examples" / "hosts" / "seed-8x-gfx1100" / "sys"
EXAMPLE_BUNDLE = REPO / "examples" / "bundle" / "config.json"
NAME = "AMD_VISIBLE_DEVICES"

GPU1_NODES = [
    {"path": "/dev/dri/card2", "type": "c", "major": 226, "minor": 2, "fileMode": 438, "uid": 0, "gid": 0},
    {"path": "/dev/dri/renderD129", "type": "c", "major": 226, "minor": 129, "fileMode": 438, "uid": 0, "gid": 0},
    {"path": "/dev/kfd", "type": "c", "major": 234, "minor": 0, "fileMode": 438, "uid": 0, "gid": 0},
]
HOOK_PATH = "/bin/sh"  # any executable: the rewrite checks that the runtime could run it
GPU1_LINKS = (("/dev/dri/by-path/pci-0000:23:00.0-card", "../card2"),
              ("/dev/dri/by-path/pci-0000:23:00.0-render", "../renderD129"))
BY_PATH_DIR = os.environ["OCI_GPU_HOOK_BY_PATH_DIR"]  # the session's own (tests/conftest.py)
GPU1_MOUNT = {"destination": "/dev/dri/by-path", "type": "bind",
              "source": f"{BY_PATH_DIR}/{bypath.digest(bypath.entries(GPU1_LINKS))}",
              "options": ["bind", "ro", "nosuid", "noexec", "nodev"]}
GPU1_RULES = [
    {"allow": True, "type": "c", "major": 226, "minor": 2, "access": "rwm"},
    {"allow": True, "type": "c", "major": 226, "minor": 129, "access": "rwm"},
    {"allow": True, "type": "c", "major": 234, "minor": 0, "access": "rwm"},
]


@functools.cache
def seed() -> Inventory:
    return scan(str(EXAMPLE_SYSFS))


def config(**values: Any) -> Config:
    return Config(**{"sysfs_root": str(EXAMPLE_SYSFS), "hook_path": HOOK_PATH, "by_path_dir": BY_PATH_DIR, **values})


def req(*indices: int) -> Request:
    amd = seed().devices("amd")
    return Request([KindAsk("amd", NAME, [",".join(map(str, indices))])], {"amd": tuple(amd[i] for i in indices)})


def apply(spec: Any, plan: Any) -> bool:
    return apply_edits(ContainerSpec(spec), plan, config())


def spec_with(env: list[str] | None = None, linux: dict[str, Any] | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"ociVersion": "1.0.2", "process": {"args": ["sh"], "cwd": "/"}, "root": {"path": "rootfs"}}
    if env is not None:
        spec["process"]["env"] = env
    if linux is not None:
        spec["linux"] = linux
    return spec


def rewrite(spec: Any, cfg: Config | None = None, devices: str | None = None) -> tuple[Any, Any]:
    new_text, plan = rewrite_text(json.dumps(spec), cfg or config(), devices)
    return (None if new_text is None else json.loads(new_text)), plan


# --- the plan -------------------------------------------------------------------


def test_build_plan_for_gpu1() -> None:
    inv = seed()
    plan = build_plan(inv, req(1), config())
    assert plan
    assert plan.devices == (inv.devices("amd")[1],)
    assert [n.to_oci() for n in plan.nodes] == GPU1_NODES
    assert [r.to_oci() for r in plan.rules] == GPU1_RULES
    assert len(plan.rules) == len(plan.nodes)
    assert plan.summary() == "amd 1 (0000:23:00.0): /dev/dri/card2 /dev/dri/renderD129 /dev/kfd"
    assert plan.edits.links == (("/dev/dri/by-path/pci-0000:23:00.0-card", "../card2"),
                                ("/dev/dri/by-path/pci-0000:23:00.0-render", "../renderD129"))


def test_build_plan_shares_kfd_once() -> None:
    inv = seed()
    plan = build_plan(inv, req(0, 7), config())
    assert [n.path for n in plan.nodes] == [
        "/dev/dri/card1", "/dev/dri/renderD128", "/dev/dri/card8", "/dev/dri/renderD135", "/dev/kfd"]
    assert [r.v1_line() for r in plan.rules] == ["c 226:1 rwm", "c 226:128 rwm", "c 226:8 rwm", "c 226:135 rwm",
                                                 "c 234:0 rwm"]


def test_build_plan_uses_config() -> None:
    inv = seed()
    cfg = config(device_file_mode=0o600, device_uid=10, device_gid=44, cgroup_access="rw")
    plan = build_plan(inv, req(1), cfg)
    assert {(n.file_mode, n.uid, n.gid) for n in plan.nodes} == {(0o600, 10, 44)}
    assert {r.access for r in plan.rules} == {"rw"}


def test_empty_plan() -> None:
    plan = build_plan(seed(), Request([]), config())
    assert not plan
    assert plan.nodes == () and plan.rules == ()
    assert plan.summary() == "no GPU requested"


def test_plan_for_spec_devices_replaces_the_env() -> None:
    plan = plan_for_spec(ContainerSpec(spec_with([f"{NAME}=5"])), config(), "0000:23:00.0")
    assert [n.path for n in plan.nodes] == ["/dev/dri/card2", "/dev/dri/renderD129", "/dev/kfd"]
    assert plan.request.source == "--devices"
    plan = plan_for_spec(ContainerSpec(spec_with([f"{NAME}=5"])), config(), "none")
    assert not plan


def test_device_rule_covers() -> None:
    rule = DeviceRule.from_oci({"allow": True, "type": "c", "major": 226})
    assert rule.covers("c", 226, 129)
    assert not rule.covers("b", 226, 129)
    assert not rule.covers("c", 234, 0)
    assert DeviceRule.from_oci({"allow": False}).covers("b", 1, 2)
    assert DeviceRule.from_oci({"allow": False}).access == "rwm"


# --- the rewrite ------------------------------------------------------------------


def test_example_bundle_rewrite_adds_exactly_the_plan() -> None:
    text = EXAMPLE_BUNDLE.read_text()
    original = json.loads(text)
    new_text, plan = rewrite_text(text, config())
    assert new_text is not None
    new = json.loads(new_text)
    assert [n.path for n in plan.nodes] == ["/dev/dri/card2", "/dev/dri/renderD129", "/dev/kfd"]

    expected = copy.deepcopy(original)
    expected["linux"]["devices"] = GPU1_NODES
    expected["linux"]["resources"]["devices"] = original["linux"]["resources"]["devices"] + GPU1_RULES
    expected["mounts"] = [*original["mounts"], GPU1_MOUNT]  # the by-path links: last, above the /dev tmpfs
    assert new == expected
    # key order of everything that was there is kept
    assert list(new)[: len(original)] == list(original)
    assert [k for k in new["linux"] if k in original["linux"]] == list(original["linux"])
    assert list(new["process"]) == list(original["process"])


def test_rewrite_is_idempotent() -> None:
    text = EXAMPLE_BUNDLE.read_text()
    once, _ = rewrite_text(text, config())
    assert once is not None
    twice, plan = rewrite_text(once, config())
    assert twice is None
    assert not plan and "cannot add to them" in plan.request.note  # its GPU is in the spec: the env adds nothing
    _, explicit = rewrite_text(once, config(), "1")  # the operator's --devices still plans it, and finds it done
    assert explicit and apply(json.loads(once), explicit) is False


@pytest.mark.parametrize("env", [
    None,
    [],
    ["PATH=/bin"],
    [f"{NAME}="],
    [f"{NAME}=none"],
    [f"{NAME}=void"],
    [f"{NAME}= NONE "],
    [f"{NAME}=1", f"{NAME}=none"],
])
def test_no_request_leaves_text_untouched_and_sysfs_unread(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                           env: list[str] | None) -> None:
    def no_scan(*_args: Any, **_kwargs: Any) -> Inventory:
        raise AssertionError("sysfs was read")

    monkeypatch.setattr(inventory_module, "scan", no_scan)
    text = json.dumps(spec_with(env), indent=3) + "\n\n"
    missing = tmp_path / "no" / "such" / "sys"
    new_text, plan = rewrite_text(text, config(sysfs_root=str(missing)))
    assert new_text is None
    assert not plan
    assert not missing.exists()


def test_no_request_with_a_sysfs_that_would_fail(tmp_path: Path) -> None:
    broken = tmp_path / "sys"
    (broken / "class").mkdir(parents=True)
    (broken / "class" / "drm").write_text("")  # listing it would be a HookError
    text = json.dumps(spec_with(["PATH=/bin"]))
    new_text, plan = rewrite_text(text, config(sysfs_root=str(broken)))
    assert new_text is None and not plan
    with pytest.raises(HookError):
        rewrite_text(json.dumps(spec_with([f"{NAME}=1"])), config(sysfs_root=str(broken)))


def test_fields_it_does_not_own_are_preserved() -> None:
    linux = {
        "namespaces": [{"type": "mount"}],
        "devices": [{"path": "/dev/fuse", "type": "c", "major": 10, "minor": 229, "fileMode": 438}],
        "resources": {
            "memory": {"limit": 1 << 40},
            "devices": [{"allow": False, "access": "rwm"}, {"allow": True, "type": "c", "major": 10, "minor": 229,
                                                            "access": "rwm"}],
            "cpu": {"shares": 2},
        },
        "x-unknown": {"nested": [1, 2.5, None, True, "é"]},
        "maskedPaths": ["/proc/kcore"],
    }
    spec = spec_with(["PATH=/bin", f"{NAME}=1"], linux)
    spec["annotations"] = {"io.x": "y"}
    spec["hooks"] = {"prestart": [{"path": "/bin/true"}]}
    new, _ = rewrite(spec)
    added_devices = new["linux"]["devices"][1:]
    added_rules = new["linux"]["resources"]["devices"][2:]
    assert added_devices == GPU1_NODES
    assert added_rules == GPU1_RULES
    assert new["hooks"] == spec["hooks"]  # the by-path links are a mount: no hook
    assert new["mounts"] == [*spec.get("mounts", []), GPU1_MOUNT]
    stripped = copy.deepcopy(new)
    del stripped["linux"]["devices"][1:]
    del stripped["linux"]["resources"]["devices"][2:]
    stripped["mounts"].pop()
    if not stripped["mounts"] and "mounts" not in spec:
        del stripped["mounts"]
    assert stripped == spec


def test_mask_other_gpus_masks_every_other_gpu_sysfs_dir() -> None:
    new, _ = rewrite(spec_with([f"{NAME}=1"]), config(mask_other_gpus=True))
    masked = new["linux"]["maskedPaths"]
    assert len(masked) == 7 and all(m.startswith("/sys/devices/pci0000:") for m in masked)
    assert not any("0000:23:00.0" in m for m in masked)
    assert any(m.endswith("/0000:e3:00.0") for m in masked)
    again, _ = rewrite(new, config(mask_other_gpus=True))
    assert again is None


def test_existing_entries_are_never_removed_or_widened() -> None:
    narrow_node = {"path": "/dev/dri/renderD129", "type": "c", "major": 226, "minor": 129, "fileMode": 384,
                   "uid": 1000, "gid": 1000}
    narrow_rule = {"allow": True, "type": "c", "major": 226, "minor": 129, "access": "r"}
    spec = spec_with([f"{NAME}=1"], {"devices": [copy.deepcopy(narrow_node)],
                                     "resources": {"devices": [{"allow": False, "access": "rwm"},
                                                               copy.deepcopy(narrow_rule)]}})
    assert rewrite(spec)[0] is None  # the env cannot widen what the spec grants; the operator's --devices can
    new, _ = rewrite(spec, devices="1")
    devices = new["linux"]["devices"]
    rules = new["linux"]["resources"]["devices"]
    assert devices[0] == narrow_node
    assert [d["path"] for d in devices] == ["/dev/dri/renderD129", "/dev/dri/card2", "/dev/kfd"]
    assert rules[:2] == [{"allow": False, "access": "rwm"}, narrow_rule]
    # "r" does not grant "rwm": the full rule is added after, the narrow one stays
    assert rules[2:] == GPU1_RULES


def test_existing_device_with_other_numbers_is_an_error() -> None:
    spec = spec_with([f"{NAME}=1"], {"devices": [{"path": "/dev/dri/renderD129", "type": "c", "major": 226,
                                                  "minor": 130}]})
    with pytest.raises(HookError) as info:
        rewrite(spec, devices="1")
    assert "/dev/dri/renderD129" in str(info.value)
    assert "226:130" in str(info.value)


def test_existing_device_of_other_type_is_an_error() -> None:
    spec = spec_with([f"{NAME}=1"], {"devices": [{"path": "/dev/kfd", "type": "b", "major": 234, "minor": 0}]})
    with pytest.raises(HookError, match="/dev/kfd"):
        rewrite(spec)


def test_rule_already_granting_is_not_duplicated() -> None:
    rules = [{"allow": False, "access": "rwm"},
             {"allow": True, "type": "c", "major": 226, "minor": 129, "access": "rwm"},
             {"allow": True, "type": "c", "major": 234, "access": "mrw"}]
    spec = spec_with([f"{NAME}=1"], {"resources": {"devices": copy.deepcopy(rules)}})
    new, _ = rewrite(spec)
    assert new["linux"]["resources"]["devices"] == [*rules, GPU1_RULES[0]]


def test_wildcard_allow_grants_everything() -> None:
    rules = [{"allow": True, "access": "rwm"}]
    spec = spec_with([f"{NAME}=1"], {"resources": {"devices": copy.deepcopy(rules)}})
    new, _ = rewrite(spec)
    assert new["linux"]["resources"]["devices"] == rules
    assert new["linux"]["devices"] == GPU1_NODES


def test_wildcard_deny_in_deny_all_mode_removes_no_exception() -> None:
    """runc's emulator (and the kernel's v1 list): in deny-all mode a wildcard deny removes only an exception with
    exactly its numbers, so the allow for 226:129 stays in force and is not added again."""
    rules = [{"allow": True, "type": "c", "major": 226, "minor": 129, "access": "rwm"},
             {"allow": False, "type": "c", "major": 226, "access": "rwm"},
             {"allow": True, "type": "c", "major": 234, "minor": 0, "access": "rwm"}]
    spec = spec_with([f"{NAME}=1"], {"resources": {"devices": copy.deepcopy(rules)}})
    new, _ = rewrite(spec)
    assert new["linux"]["resources"]["devices"] == [*rules, GPU1_RULES[0]]


def test_grant_that_would_punch_a_hole_in_a_wildcard_deny_is_refused() -> None:
    """Default-allow with ``deny c 226:*``: runc refuses an allow for one minor under it, so the rewrite refuses
    first, with one line, instead of handing runc a config it will reject."""
    rules = [{"allow": True, "access": "rwm"}, {"allow": False, "type": "c", "major": 226, "access": "rwm"}]
    with pytest.raises(HookError, match="punch a hole"):
        rewrite(spec_with([f"{NAME}=1"], {"resources": {"devices": copy.deepcopy(rules)}}))


def test_partial_deny_after_allow_is_not_trusted() -> None:
    rules = [{"allow": True, "type": "a", "access": "rwm"},
             {"allow": False, "type": "c", "major": 234, "minor": 0, "access": "w"}]
    spec = spec_with([f"{NAME}=1"], {"resources": {"devices": copy.deepcopy(rules)}})
    new, _ = rewrite(spec)
    assert new["linux"]["resources"]["devices"] == [*rules, GPU1_RULES[2]]


@pytest.mark.parametrize("spec", [
    spec_with([f"{NAME}=1"], {"devices": {}}),
    spec_with([f"{NAME}=1"], {"devices": "x"}),
    spec_with([f"{NAME}=1"], {"devices": [1]}),
    spec_with([f"{NAME}=1"], {"resources": []}),
    spec_with([f"{NAME}=1"], {"resources": {"devices": {"allow": True}}}),
    spec_with([f"{NAME}=1"], {"resources": {"devices": ["c 226:* rwm"]}}),
    spec_with([f"{NAME}=1"], []),  # linux is a list
    spec_with([f"{NAME}=1", 5]),
    spec_with([f"{NAME}=1", None]),
    {"process": {"env": f"{NAME}=1"}},
    {"process": [f"{NAME}=1"]},
    [{"process": {"env": [f"{NAME}=1"]}}],
    "config",
    None,
    42,
])
def test_wrong_shapes_are_hook_errors(spec: Any) -> None:
    with pytest.raises(HookError) as info:
        rewrite_text(json.dumps(spec), config())
    assert str(info.value).startswith("config.json")


@pytest.mark.parametrize("linux", [
    {"resources": {"devices": [{"allow": True, "type": "c", "major": 226, "access": 5}]}},
    {"devices": [{"path": ["/dev/dri/card2"], "type": "c", "major": 226, "minor": 2}]},
    {"devices": [{"path": {"p": 1}, "type": "c", "major": 226, "minor": 2}]},
])
def test_malformed_existing_entries_are_hook_errors(linux: dict[str, Any]) -> None:
    # wrong-typed fields inside existing entries are a bad config.json, not an internal error
    with pytest.raises(HookError):
        rewrite(spec_with([f"{NAME}=1"], linux), devices="1")


def test_process_env_shapes() -> None:
    assert process_env({}) == []
    assert process_env({"process": {}}) == []
    assert process_env({"process": {"env": None}}) == []
    assert process_env({"process": {"env": ["A=1"]}}) == ["A=1"]
    with pytest.raises(HookError, match="not a string"):
        process_env({"process": {"env": ["A=1", {"B": 2}]}})


@pytest.mark.parametrize("text", ["", "   ", "{", '{"a": 1} {}', "{'a': 1}", "NaN", '{"a": Infinity}', "[1,]",
                                  '{"a": 1,}', "\ufeff{}"])
def test_invalid_json_is_a_hook_error(text: str) -> None:
    with pytest.raises(HookError, match=r"^config\.json is not valid JSON"):
        rewrite_text(text, config())


def test_apply_with_empty_plan_changes_nothing() -> None:
    spec = spec_with([f"{NAME}=none"])
    before = copy.deepcopy(spec)
    plan = plan_for_spec(ContainerSpec(spec), config())
    assert apply(spec, plan) is False
    assert spec == before
    assert "linux" not in spec


def test_bad_request_is_a_hook_error() -> None:
    with pytest.raises(HookError, match="'8'"):
        rewrite(spec_with([f"{NAME}=8"]))


# --- properties ---------------------------------------------------------------------

EXISTING_RULES = [
    {"allow": False, "access": "rwm"},
    {"allow": True, "access": "rwm"},
    {"allow": True, "type": "c", "major": 226, "access": "rwm"},
    {"allow": False, "type": "c", "major": 226, "minor": 129, "access": "rwm"},
    {"allow": True, "type": "c", "major": 226, "minor": 130, "access": "r"},
    {"allow": True, "type": "c", "major": 234, "minor": 0, "access": "rwm"},
    {"allow": False, "type": "c", "major": 234, "access": "m"},
]


@settings(max_examples=150, deadline=None)
@given(st.sets(st.integers(0, 7)), st.lists(st.sampled_from(EXISTING_RULES), max_size=5), st.booleans())
def test_rewrite_twice_equals_rewrite_once(gpus: set[int], rules: list[dict[str, Any]], via_devices: bool) -> None:
    value = ",".join(str(i) for i in sorted(gpus))
    linux = {"resources": {"devices": copy.deepcopy(rules)}} if rules else None
    env = ["PATH=/bin"] if via_devices else ["PATH=/bin", f"{NAME}={value}"]
    devices = value if via_devices else None
    text = json.dumps(spec_with(env, linux))

    try:
        once, plan = rewrite_text(text, config(), devices)
    except HookError as err:  # runc would refuse the list with our rules added (a wildcard deny exception)
        assert "punch a hole" in str(err)
        assert any("minor" not in r and r.get("type") == "c" for r in rules)  # only a wildcard exception can
        return
    assert [g.index for g in plan.devices] == sorted(gpus)
    if not gpus:
        assert once is None
        return
    assert once is not None
    twice, _ = rewrite_text(once, config(), devices)
    assert twice is None
    new = json.loads(once)
    # nothing that was there is dropped
    assert new["linux"]["resources"]["devices"][: len(rules)] == rules
    # every node of every GPU asked for is there, once
    paths = [d["path"] for d in new["linux"]["devices"]]
    assert len(paths) == len(set(paths))
    assert set(paths) == {n.path for n in plan.nodes}
    # and after the rewrite runc's reading of the list allows each node in full
    final = Policy.of(DeviceRule.from_oci(r) for r in new["linux"]["resources"]["devices"])
    for node in plan.nodes:
        assert grants(final.allows, node.rule("rwm"))


def test_env_request_beside_devices_of_its_kind_adds_nothing() -> None:
    """CDI/--device put GPU 1's nodes in the spec; the image's AMD_VISIBLE_DEVICES=all is then ignored."""
    linux = {"devices": [dict(GPU1_NODES[0]), dict(GPU1_NODES[1])]}
    new, plan = rewrite(spec_with([f"{NAME}=all"], linux))
    assert new is None and not plan
    assert "cannot add to them" in plan.request.note
    # devices of no GPU (a fuse node) do not count
    new, plan = rewrite(spec_with([f"{NAME}=1"], {"devices": [{"path": "/dev/fuse", "type": "c", "major": 10,
                                                                "minor": 229}]}))
    assert [d.index for d in plan.devices] == [1]
    # annotations naming other devices than the spec's: refused, never the union (one grant, whoever injects)
    spec = spec_with([f"{NAME}=all"], linux)
    spec["annotations"] = {"cdi.k8s.io/x": "amd.com/gpu=2"}
    with pytest.raises(HookError) as info:
        rewrite(spec)
    assert "name amd device 0000:43:00.0, but the container already has amd device 0000:23:00.0" in str(info.value)


def _native_cdi(*indices: int) -> dict[str, Any]:
    """linux.devices and device rules as a runtime applying our CDI spec itself leaves them (containerd, podman)."""
    devices = seed().devices("amd")
    nodes = [n for i in indices for n in devices[i].nodes] + list(seed().shared("amd"))
    return {"devices": [n.made(0o666, 0, 0).to_oci() for n in nodes],
            "resources": {"devices": [{"allow": False, "access": "rwm"},
                                      *(n.rule("rwm").to_oci() for n in nodes)]}}


@pytest.mark.parametrize("annotation", ["amd.com/gpu=0000:43:00.0", "amd.com/gpu=2",
                                        "amd.com/gpu=0000:43:00.0,amd.com/gpu=2"])
def test_annotation_agreeing_with_native_cdi_devices_is_one_grant(annotation: str) -> None:
    """The shim sees what containerd's CDI injected plus the plugin's annotation for the same GPU: nothing is
    added twice; only what CDI cannot carry that the plan has (none here but the by-path mount) is added."""
    spec = spec_with([], _native_cdi(2))
    spec["annotations"] = {"cdi.k8s.io/oci-gpu-hook_gpu": annotation}
    before = copy.deepcopy(spec)
    new, plan = rewrite(spec)
    assert [d.index for d in plan.devices] == [2]
    assert new is not None
    assert new["linux"] == before["linux"]  # each node once, each rule once
    assert new["mounts"][-1] == bypath.mount(bypath.prepare(plan.edits.links, BY_PATH_DIR))  # the one addition
    assert "hooks" not in new
    again, _ = rewrite(new)
    assert again is None


def test_annotation_disagreeing_with_native_cdi_devices_is_refused() -> None:
    spec = spec_with([], _native_cdi(2))
    spec["annotations"] = {"cdi.k8s.io/oci-gpu-hook_gpu": "amd.com/gpu=0000:63:00.0"}
    with pytest.raises(HookError) as info:
        rewrite(spec)
    assert "\n" not in str(info.value) and "a stale CDI spec on this node" in str(info.value)
    # dry-run --devices is the operator's own list: the spec's devices do not hold it back
    _, plan = rewrite(spec, devices="3")
    assert [d.index for d in plan.devices] == [3]


def test_per_container_path_imports_only_the_configured_backends(tmp_path: Path) -> None:
    """A start that plans imports the modules of the config's backends as it begins, right after the launcher's
    trust walk (nothing of the package is imported later from a path), and no other backend's, whether or not the
    container asks for a GPU (docs/security.md)."""
    import subprocess
    import sys

    from oci_gpu_hook.startpath import BACKEND_MODULES, KIND_MODULES

    def names(modules: frozenset[str]) -> set[str]:  # and the ld cache's format: the spec rewrite writes caches
        return {m.rsplit(".", 1)[1] for m in modules if m.startswith("oci_gpu_hook.inventory.")} - {"sysfs"} | {
            "ldcache"}

    host = REPO / "examples" / "hosts" / "intel-igpu-2x-gfx1100" / "sys"
    amd_only, intel_only = tmp_path / "amd.toml", tmp_path / "intel.toml"
    amd_only.write_text('backends = ["amd"]\n')
    intel_only.write_text('backends = ["intel"]\n')
    for config, env, wanted in (
            (amd_only, ["AMD_VISIBLE_DEVICES=0"], names(KIND_MODULES["amd"])),
            (intel_only, ["INTEL_VISIBLE_DEVICES=0"], names(KIND_MODULES["intel"])),
            ("/dev/null", ["AMD_VISIBLE_DEVICES=0"], names(BACKEND_MODULES)),  # the defaults: all three backends
            (amd_only, ["PATH=/bin"], names(KIND_MODULES["amd"]))):
        code = (f"import sys; sys.path.insert(0, {str(REPO)!r}); sys.argv = ['oci-gpu-hook', 'precreate']; "
                "from oci_gpu_hook.entry.cli import main; "
                "rc = main(); print(sorted(m for m in sys.modules if m.startswith('oci_gpu_hook.inventory')), "
                "file=sys.stderr); sys.exit(rc)")
        done = subprocess.run([sys.executable, "-I", "-S", "-c", code], input=json.dumps(spec_with(env)),
                              capture_output=True, text=True, cwd=REPO,
                              env={"OCI_GPU_HOOK_CONFIG": str(config),
                                   "OCI_GPU_HOOK_SYSFS_ROOT": str(host), "OCI_GPU_HOOK_HOOK_PATH": HOOK_PATH,
                                   "OCI_GPU_HOOK_BY_PATH_DIR": BY_PATH_DIR})
        assert done.returncode == 0, done.stderr
        loaded = eval(done.stderr.strip().splitlines()[-1])
        backends = {m.rsplit(".", 1)[1] for m in loaded} - {"inventory", "sysfs"}
        assert backends == wanted, (config, env, loaded)
