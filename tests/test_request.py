"""Requests: AMD_VISIBLE_DEVICES syntax, every error, sources per kind, and properties over arbitrary text."""

from __future__ import annotations

import functools
import json
import shutil
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from oci_gpu_hook.config import Config
from oci_gpu_hook.errors import HookError
from oci_gpu_hook.inventory import Device, Inventory, scan
from oci_gpu_hook.oci_spec import ContainerSpec, env_value
from oci_gpu_hook.plan import Plan, plan_for_spec
from oci_gpu_hook.request import (
    CDI_SOURCE,
    Request,
    annotation_names,
    parse_devices_option,
    requested,
    select,
    valid_values,
)
from oci_gpu_hook.request import resolve as resolve_asks
from tests.helpers import fakesysfs, imageenvs

REPO = Path(__file__).resolve().parent.parent
EXAMPLE_SYSFS = REPO / "examples" / "hosts" / "seed-8x-gfx1100" / "sys"
NAME = "AMD_VISIBLE_DEVICES"
GPU1_UID = "3149e0fac5157acf"
GPU5_UID = "3149e0fac5157acb"


@functools.cache
def seed() -> Inventory:
    return scan(str(EXAMPLE_SYSFS))


def resolve(value: str | None, inventory: Inventory, source: str = NAME) -> tuple[Device, ...]:
    return select("amd", value or "", inventory.devices("amd"), source)


def indices(value: str | None) -> list[int]:
    return [g.index for g in resolve(value, seed(), NAME)]


def error(value: str) -> str:
    with pytest.raises(HookError) as info:
        resolve(value, seed(), NAME)
    return str(info.value)


# --- syntax -------------------------------------------------------------------


@pytest.mark.parametrize("value", ["all", "ALL", " all ", "All\n"])
def test_all(value: str) -> None:
    assert indices(value) == list(range(8))


@pytest.mark.parametrize("value", [None, "", "   ", "none", "NONE", " none ", "void", "Void"])
def test_no_gpu(value: str | None) -> None:
    assert resolve(value, seed(), NAME) == ()


@pytest.mark.parametrize(("value", "expected"), [
    ("0", [0]),
    ("1", [1]),
    ("7", [7]),
    ("3,1", [1, 3]),
    ("0-3", [0, 1, 2, 3]),
    ("2-2", [2]),
    ("6-7,0", [0, 6, 7]),
    ("0-7", list(range(8))),
    ("00", [0]),
])
def test_indices_and_ranges(value: str, expected: list[int]) -> None:
    assert indices(value) == expected


@pytest.mark.parametrize(("value", "expected"), [
    ("0000:23:00.0", [1]),
    ("23:00.0", [1]),
    ("0000:A3:00.0", [5]),
    ("a3:00.0", [5]),
    ("0000:03:00.0,0000:e3:00.0", [0, 7]),
])
def test_pci_addresses(value: str, expected: list[int]) -> None:
    assert indices(value) == expected


@pytest.mark.parametrize(("value", "expected"), [
    (f"0x{GPU1_UID}", [1]),
    (f"0X{GPU1_UID.upper()}", [1]),
    (f"GPU-{GPU1_UID}", [1]),
    (f"gpu-{GPU1_UID}", [1]),
    (f"GPU-{GPU5_UID},0x{GPU1_UID}", [1, 5]),
])
def test_unique_ids(value: str, expected: list[int]) -> None:
    assert indices(value) == expected


def test_duplicates_collapse() -> None:
    assert indices(f"1,1,0-2,23:00.0,0000:23:00.0,0x{GPU1_UID},GPU-{GPU1_UID}") == [0, 1, 2]
    assert len(resolve("1,1", seed(), NAME)) == 1


@pytest.mark.parametrize("value", [" 1 , 2 ", "\t1,\n2", "1,  2", " 1,2 "])
def test_whitespace_around_tokens(value: str) -> None:
    assert indices(value) == [1, 2]


def test_result_is_the_inventory_gpus() -> None:
    inv = seed()
    assert resolve("all", inv) == inv.devices("amd")
    assert resolve("5", inv)[0] is inv.devices("amd")[5]


# --- errors -------------------------------------------------------------------


@pytest.mark.parametrize(("value", "named"), [
    ("8", "'8'"),
    ("1,99", "'99'"),
    ("3-1", "'3-1'"),
    ("0000:24:00.0", "'0000:24:00.0'"),
    ("24:00.0", "'24:00.0'"),
    ("0000:zz:00.0", "'0000:zz:00.0'"),
    ("0000:23:00.8", "'0000:23:00.8'"),
    ("0xdeadbeef", "'0xdeadbeef'"),
    ("GPU-0123456789abcdef", "'GPU-0123456789abcdef'"),
    ("0x", "'0x'"),
    ("GPU-", "'GPU-'"),
    ("0xnothex", "'0xnothex'"),
    ("banana", "'banana'"),
    ("1,banana", "'banana'"),
    ("all,1", "'all'"),
    ("1,all", "'all'"),
    ("1,none", "'none'"),
    ("1,void", "'void'"),
    ("²", "'²'"),
])
def test_bad_tokens_are_named(value: str, named: str) -> None:
    message = error(value)
    assert named in message
    assert "valid:" in message
    assert message.startswith(f"{NAME}=")
    assert "\n" not in message


@pytest.mark.parametrize("value", ["0-9", "9-10"])
def test_range_out_of_range(value: str) -> None:
    message = error(value)
    assert "out of range" in message
    assert "'9'" in message or f"'{value}'" in message
    assert "valid:" in message


@pytest.mark.parametrize("value", ["0,,1", "0,", ",0", ","])
def test_empty_entry(value: str) -> None:
    message = error(value)
    assert "empty entry" in message
    assert "valid:" in message


@pytest.mark.parametrize("value", ["1-", "-1", "0,2-,3"])
def test_malformed_range_is_named_not_called_empty(value: str) -> None:
    token = next(t.strip() for t in value.split(",") if "-" in t)
    message = error(value)
    assert f"'{token}'" in message
    assert "empty entry" not in message
    assert "valid:" in message


@pytest.mark.parametrize("value", ["9" * 5000, "0-" + "9" * 5000, "1," + "1" * 4301, "1" * 9, "123456789"])
def test_huge_index_is_a_hook_error(value: str) -> None:
    # int() refuses decimal strings over 4300 digits with ValueError; that must not escape.  More than 8
    # digits is a hex unique id to AMD's toolkit, and so here.
    message = error(value)
    assert "out of range" in message or "unique id" in message
    assert "valid:" in message


@pytest.mark.parametrize("value", [GPU1_UID, GPU1_UID.upper(), "0x0000" + GPU1_UID, GPU1_UID.lstrip("0")])
def test_bare_hex_longer_than_8_digits_is_a_unique_id(value: str) -> None:
    """AMD's toolkit: a unique id as 0x..., GPU-..., or bare hex longer than 8 digits, zero padding optional."""
    assert indices(value) == [1]


def test_out_of_range_says_what_is_valid() -> None:
    message = error("8")
    assert "indices 0-7" in message
    assert "0000:03:00.0" in message


def test_valid_values_lists_the_host() -> None:
    text = valid_values("amd", seed().devices("amd"))
    assert text.startswith("valid: all, none, indices 0-7")
    assert "unique ids like 0x" in text


def test_no_gpus_host(tmp_path: Path) -> None:
    empty = scan(str(tmp_path))
    assert resolve("none", empty) == ()
    assert resolve("all", empty) == ()  # every one the host has: none (the module docstring's rule)
    for value in ("0", "0-1", "0000:03:00.0", GPU1_UID, "all,0"):
        with pytest.raises(HookError) as info:
            resolve(value, empty, NAME)
        assert "valid: all or none, which grant no amd GPU on this host" in str(info.value), info.value


# --- the environment ----------------------------------------------------------


def config(names: tuple[str, ...] = (NAME,), allow_env: bool = True) -> Config:
    return Config(request_env={"amd": list(names), "intel": ["INTEL_VISIBLE_DEVICES"],
                               "nvidia": ["NVIDIA_VISIBLE_DEVICES"]},
                  allow_env_requests=allow_env)


def from_env(env: list, names: tuple[str, ...], inventory: Inventory) -> Request:
    """The env path of requested() + resolve(), as the spec-rewrite paths take it."""
    return resolve_asks(requested(env, None, config(names)), inventory)


def amd(request: Request) -> list[int]:
    return [d.index for d in request.devices.get("amd", ())]


def test_env_value_last_entry_wins() -> None:
    env = [f"{NAME}=1", "PATH=/bin", f"{NAME}=2"]
    assert env_value(env, NAME) == "2"
    assert env_value([*env, f"{NAME}="], NAME) == ""


@pytest.mark.parametrize("env", [None, [], ["PATH=/bin"], [NAME], [f"{NAME}_X=1"], [f"X{NAME}=1"], [5, None]])
def test_env_value_absent(env: list | None) -> None:
    assert env_value(env, NAME) is None


def test_env_value_keeps_everything_after_the_first_equals() -> None:
    assert env_value([f"{NAME}=a=b"], NAME) == "a=b"


def test_from_env_uses_the_last_entry() -> None:
    request = from_env([f"{NAME}=1", f"{NAME}=2,3"], (NAME,), seed())
    assert request.source == NAME
    assert request.value == "amd.com/gpu=2,3"
    assert amd(request) == [2, 3]
    assert request

    request = from_env([f"{NAME}=1", f"{NAME}=none"], (NAME,), seed())
    assert amd(request) == []
    assert not request


def test_from_env_without_request() -> None:
    request = from_env(["PATH=/bin"], (NAME,), seed())
    assert amd(request) == []
    assert request.value is None


# --- CDI names in annotations, and which source decides ---------------------------

KIND = "amd.com/gpu"


def test_cdi_names_from_annotations() -> None:
    annotations = {
        "cdi.k8s.io/amd-plugin": "amd.com/gpu=1, amd.com/gpu=0000:43:00.0",
        "cdi.k8s.io/other": "example.com/gpu=0,vendor.example/nic=eth1",
        "io.kubernetes.pod.name": "amd.com/gpu=7",  # not a CDI annotation
        "cdi.k8s.io/z": "amd.com/gpu=all",
    }
    assert annotation_names(annotations, ["amd", "intel"]) == {"amd": ["1", "0000:43:00.0", "all"]}
    asks = requested([], annotations, config())
    assert [(a.kind, a.source) for a in asks] == [("amd", "cdi.k8s.io annotations")]
    assert amd(resolve_asks(asks, seed())) == list(range(8))


def test_annotations_of_two_kinds_give_two_asks() -> None:
    asks = requested(["INTEL_VISIBLE_DEVICES=0"], {"cdi.k8s.io/a": "amd.com/gpu=1,intel.com/gpu=card0"}, config())
    assert [(a.kind, a.values) for a in asks] == [("amd", ["1"]), ("intel", ["card0"])]
    assert "ignored" in asks[1].note


@pytest.mark.parametrize("value", ["amd.com/gpu", "amd.com/gpu=", "amd.com/gpu=1,amd.com/gpu", "amd.com/gpux=1"])
def test_malformed_cdi_name_of_a_served_kind_is_an_error(value: str) -> None:
    with pytest.raises(HookError, match="is not a CDI device name"):
        annotation_names({"cdi.k8s.io/x": value}, ["amd"])


def test_unknown_cdi_device_is_an_error_naming_it() -> None:
    asks = requested([], {"cdi.k8s.io/x": "amd.com/gpu=9"}, config())
    with pytest.raises(HookError, match=r"'9' is out of range.*valid:"):
        resolve_asks(asks, seed())


def test_annotations_decide_over_the_env() -> None:
    asks = requested([f"{NAME}=all"], {"cdi.k8s.io/x": "amd.com/gpu=3"}, config())
    request = resolve_asks(asks, seed())
    assert amd(request) == [3]
    assert "ignored" in request.note


def test_env_requests_can_be_refused() -> None:
    asks = requested([f"{NAME}=all"], {}, config(allow_env=False))
    assert len(asks) == 1 and asks[0].values == [] and "allow_env_requests" in asks[0].note
    asks = requested([f"{NAME}=all"], {"cdi.k8s.io/x": "amd.com/gpu=2"}, config(allow_env=False))
    assert amd(resolve_asks(asks, seed())) == [2]


def test_nothing_asked() -> None:
    assert requested([f"{NAME}=void"], {"cdi.k8s.io/x": "example.com/gpu=0"}, config()) == []


def test_two_request_variables_is_an_error() -> None:
    names = (NAME, "ROCR_VISIBLE_DEVICES")
    with pytest.raises(HookError) as info:
        from_env([f"{NAME}=1", "ROCR_VISIBLE_DEVICES=2"], names, seed())
    assert NAME in str(info.value)
    assert "ROCR_VISIBLE_DEVICES" in str(info.value)


def test_second_request_variable_set_to_none_is_fine() -> None:
    names = (NAME, "ROCR_VISIBLE_DEVICES")
    request = from_env([f"{NAME}=none", "ROCR_VISIBLE_DEVICES=2"], names, seed())
    assert request.source == "ROCR_VISIBLE_DEVICES"
    assert amd(request) == [2]


def test_error_names_the_variable() -> None:
    with pytest.raises(HookError, match=r"^ROCR_VISIBLE_DEVICES=9: '9'"):
        from_env(["ROCR_VISIBLE_DEVICES=9"], ("ROCR_VISIBLE_DEVICES",), seed())


def test_devices_option_takes_qualified_names() -> None:
    asks = parse_devices_option("amd.com/gpu=1,amd.com/gpu=3,intel.com/gpu=card0", ["amd", "intel"])
    assert [(a.kind, a.values) for a in asks] == [("amd", ["1,3"]), ("intel", ["card0"])]
    assert [(a.kind, a.values) for a in parse_devices_option("0-2", ["amd", "intel"])] == [("amd", ["0-2"])]
    assert parse_devices_option("none", ["amd"]) == []
    with pytest.raises(HookError, match="not in use"):
        parse_devices_option("intel.com/gpu=0", ["amd"])


# --- properties -----------------------------------------------------------------


@st.composite
def index_items(draw: st.DrawFn) -> tuple[str, set[int]]:
    if draw(st.booleans()):
        i = draw(st.integers(0, 7))
        return str(i), {i}
    start = draw(st.integers(0, 7))
    stop = draw(st.integers(start, 7))
    return f"{start}-{stop}", set(range(start, stop + 1))


@settings(max_examples=200, deadline=None)
@given(st.lists(index_items(), min_size=1, max_size=10), st.sampled_from(["", " ", "  ", "\t"]))
def test_index_lists_resolve_to_the_union(items: list[tuple[str, set[int]]], pad: str) -> None:
    text = ",".join(pad + token + pad for token, _ in items)
    expected = sorted(set().union(*(chosen for _, chosen in items)))
    assert indices(text) == expected


def _resolves_or_hook_error(text: str) -> None:
    try:
        gpus = resolve(text, seed(), NAME)
    except HookError as err:
        message = str(err)
        assert "valid:" in message or "more than one" in message
        return
    assert isinstance(gpus, tuple)
    got = [g.index for g in gpus]
    assert got == sorted(set(got))


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.text(), st.integers(4290, 4400).map(lambda n: "7" * n)))
def test_any_text_resolves_or_raises_hook_error(text: str) -> None:
    _resolves_or_hook_error(text)


@settings(max_examples=500, deadline=None)
@given(st.text(alphabet="0123456789abcdefxX:.,- GPUgpu\t", max_size=30))
def test_request_like_text_resolves_or_raises_hook_error(text: str) -> None:
    _resolves_or_hook_error(text)


@settings(max_examples=200, deadline=None)
@given(st.text(min_size=1).filter(lambda t: t.strip().lower() not in ("", "none", "void")))
def test_any_text_in_env_resolves_or_raises_hook_error(value: str) -> None:
    try:
        from_env([f"{NAME}={value}"], (NAME,), seed())
    except HookError:
        pass


# --- stable names: partitions by <pci>-p<N> ------------------------------------------------------------

CPX_SYSFS = REPO / "examples" / "hosts" / "mi300x-2x-cpx" / "sys"
DPX_SYSFS = REPO / "examples" / "hosts" / "mi300x-2x-dpx-dot-naming" / "sys"


@functools.cache
def cpx() -> Inventory:
    return scan(str(CPX_SYSFS))


@pytest.mark.parametrize(("value", "expected"), [
    ("0000:05:00.0-p0", [0]),
    ("0000:05:00.0-p3", [3]),
    ("05:00.0-p7", [7]),
    ("0000:26:00.0-P3", [11]),  # case does not matter, as for PCI addresses
    ("0000:26:00.0-p3,0000:26:00.0-p3,11", [11]),
    ("0000:05:00.0-p1,0000:26:00.0", [1, *range(8, 16)]),
])
def test_partition_names_name_one_partition(value: str, expected: list[int]) -> None:
    chosen = select("amd", value, cpx().devices("amd"), "cdi.k8s.io annotations")
    assert [d.index for d in chosen] == expected


def test_every_device_has_a_stable_name_that_requests_it() -> None:
    from oci_gpu_hook.inventory import stable_name

    for inventory in (seed(), cpx(), scan(str(DPX_SYSFS))):
        for device in inventory.devices("amd"):
            name = stable_name(device)
            assert select("amd", name, inventory.devices("amd")) == (device,), name
            assert name == (device.pci_address if device.partition is None
                            else f"{device.pci_address}-p{device.partition}")


@pytest.mark.parametrize(("host", "value", "why"), [
    ("cpx", "0000:05:00.0-p8", "is not a valid partition name (expected PCI-pN"),
    ("cpx", "0000:05:00.0-p", "is not a valid partition name"),
    ("cpx", "0000:05:00.0-p01", "is not a valid partition name"),
    ("cpx", "0000:05:00.0-x1", "is not a valid partition name"),
    ("cpx", "0000:zz:00.0-p1", "is not a valid partition name"),
    ("cpx", "0000:06:00.0-p1", "is not a partition of an AMD GPU on this host"),
    ("seed", "0000:23:00.0-p0", "is not a partition: the AMD GPU at 0000:23:00.0 is not partitioned "
                                "(its name is 0000:23:00.0)"),
    ("dpx", "0000:26:00.0-p2", "is not a partition of the AMD GPU at 0000:26:00.0 in its mode "
                               "(DPX: 0000:26:00.0-p0, 0000:26:00.0-p1)"),
])
def test_bad_partition_names_are_strict_errors(host: str, value: str, why: str) -> None:
    inventory = {"cpx": cpx, "seed": seed, "dpx": lambda: scan(str(DPX_SYSFS))}[host]()
    with pytest.raises(HookError) as info:
        select("amd", value, inventory.devices("amd"), "cdi.k8s.io annotations")
    message = str(info.value)
    assert message.startswith(f"cdi.k8s.io annotations={value}: '{value}' {why}"), message
    assert "valid:" in message and "\n" not in message


def test_valid_forms_list_partition_names() -> None:
    text = valid_values("amd", cpx().devices("amd"))
    assert "partitions like 0000:05:00.0-p0" in text
    assert "partitions like" not in valid_values("amd", seed().devices("amd"))  # no partitions there
    with pytest.raises(HookError, match=r"is not a GPU index, range, PCI address, partition name \(PCI-pN\) or "
                                        r"unique id"):
        select("amd", "banana", cpx().devices("amd"))


# --- one grant, whoever injects --------------------------------------------------------------------

def numbers(inventory: Inventory, *indices: int, shared: bool = True) -> set[tuple[str, int, int]]:
    """The device numbers a runtime's CDI injection of those devices puts into linux.devices."""
    devices = inventory.devices("amd")
    found = {n.number for i in indices for n in devices[i].nodes}
    return found | ({n.number for n in inventory.shared("amd")} if shared else set())


def annotated(value: str, env: list[str] | None = None) -> list:
    return requested(env, {"cdi.k8s.io/oci-gpu-hook_gpu": value}, config())


def test_annotation_naming_the_present_devices_is_one_grant() -> None:
    request = resolve_asks(annotated("amd.com/gpu=0000:43:00.0"), seed(), numbers(seed(), 2))
    assert amd(request) == [2] and not request.note
    both = resolve_asks(annotated("amd.com/gpu=0000:43:00.0,amd.com/gpu=5"), seed(), numbers(seed(), 2, 5))
    assert amd(both) == [2, 5]


def test_annotation_disagreeing_with_the_present_devices_is_refused_in_one_line() -> None:
    with pytest.raises(HookError) as info:
        resolve_asks(annotated("amd.com/gpu=0000:63:00.0"), seed(), numbers(seed(), 2))
    message = str(info.value)
    assert message == ("cdi.k8s.io annotations name amd device 0000:63:00.0, but the container already has amd "
                       "device 0000:43:00.0 (CDI, --device or the orchestrator): refused, one grant whoever "
                       "injects and never their union (a stale CDI spec on this node, or an orchestrator that "
                       "disagrees with itself)")
    # more, fewer, or overlapping: all refused, never the union
    for value, present in (("amd.com/gpu=2,amd.com/gpu=3", (2,)), ("amd.com/gpu=2", (2, 3)),
                           ("amd.com/gpu=2,amd.com/gpu=3", (3, 4))):
        with pytest.raises(HookError, match="never their union"):
            resolve_asks(annotated(value), seed(), numbers(seed(), *present))


def test_one_grant_for_partitions_names_them_by_stable_name() -> None:
    inventory = cpx()
    request = resolve_asks(annotated("amd.com/gpu=0000:26:00.0-p3"), inventory, numbers(inventory, 11))
    assert amd(request) == [11]
    whole = resolve_asks(annotated("amd.com/gpu=0000:05:00.0"), inventory, numbers(inventory, *range(8)))
    assert amd(whole) == list(range(8))
    with pytest.raises(HookError) as info:
        resolve_asks(annotated("amd.com/gpu=0000:26:00.0-p3"), inventory, numbers(inventory, 3, 4))
    assert "name amd device 0000:26:00.0-p3, but the container already has amd devices 0000:05:00.0-p3, " \
           "0000:05:00.0-p4 (" in str(info.value)


def test_what_does_not_identify_a_device_does_not_count() -> None:
    """Only a device's own nodes make it present: /dev/kfd (shared), a fuse node or a card alone of another
    kind's numbers change nothing; one node of a device (its render node) is enough."""
    kfd_only = {n.number for n in seed().shared("amd")} | {("c", 10, 229)}
    assert amd(resolve_asks(annotated("amd.com/gpu=4"), seed(), kfd_only)) == [4]
    render_only = {n.number for n in seed().devices("amd")[2].nodes if "render" in n.path}
    with pytest.raises(HookError) as info:
        resolve_asks(annotated("amd.com/gpu=4"), seed(), render_only)
    assert "already has amd device 0000:43:00.0 (" in str(info.value)


def test_an_annotation_naming_no_device_adds_nothing_and_refuses_nothing() -> None:
    request = resolve_asks(annotated("amd.com/gpu=none"), seed(), numbers(seed(), 2))
    assert amd(request) == [] and not request


def test_env_beside_present_devices_is_set_aside_without_changing_the_asks() -> None:
    asks = requested([f"{NAME}=all"], None, config())
    request = resolve_asks(asks, seed(), numbers(seed(), 1))
    assert amd(request) == [] and not request
    assert request.source == "none" and request.value is None
    assert f"{NAME}=all ignored: the container already has amd GPUs" in request.note
    assert asks[0].values == ["all"] and not asks[0].note  # decided in resolution; the asks are as parsed
    # nothing present: the env asks as usual
    assert amd(resolve_asks(asks, seed(), set())) == list(range(8))


# --- what the node cannot serve: `all` of a kind it lacks grants nothing, a name of one device is refused ---


def _plan(env: list[str], sysfs: Path, tmp_path: Path, **values: object) -> Plan:
    """The plan of a container with ``env`` under the default backends and names, on the host at ``sysfs``."""
    settings = Config(sysfs_root=str(sysfs), proc_root=str(tmp_path / "no-proc"), driver_root=str(tmp_path),
                      hook_path="/bin/true", log_file=str(tmp_path / "log"), **values)  # type: ignore[arg-type]
    spec = ContainerSpec({"ociVersion": "1.0.2", "process": {"env": env}, "root": {"path": "rootfs"}})
    return plan_for_spec(spec, settings)


AMD_HOST = EXAMPLE_SYSFS
INTEL_HOST = REPO / "examples" / "hosts" / "intel-i915-xe" / "sys"


@pytest.mark.parametrize("sysfs", [AMD_HOST, INTEL_HOST, None], ids=["amd", "intel", "no-gpus"])
def test_a_cuda_image_on_a_host_without_nvidia_gpus_gets_nothing_and_a_note(tmp_path: Path, sysfs: Path | None) -> None:
    host = sysfs or tmp_path / "sys"
    host.mkdir(exist_ok=True)
    plan = _plan(imageenvs.CUDA_BASE, host, tmp_path)
    assert not plan and plan.devices == () and not plan.edits.mounts
    assert plan.request.note == "NVIDIA_VISIBLE_DEVICES=all: this host has no nvidia GPUs, none granted"
    assert plan.summary() == "no GPU granted (NVIDIA_VISIBLE_DEVICES=all: this host has no nvidia GPUs, none granted)"
    plan.record(Config(log_file=str(tmp_path / "log")), "precreate", "c1", 0.0)
    line = json.loads((tmp_path / "log").read_text())
    assert (line["outcome"], line["request"], line["note"], line["devices"]) == (
        "ignored", "nvidia.com/gpu=all", plan.request.note, [])


def test_a_cuda_image_asking_for_an_amd_gpu_beside_gets_it(tmp_path: Path) -> None:
    plan = _plan([*imageenvs.CUDA_BASE, f"{NAME}=1"], AMD_HOST, tmp_path)
    assert [(d.kind, d.index) for d in plan.devices] == [("amd", 1)]
    assert {n.path for n in plan.nodes} == {"/dev/dri/card2", "/dev/dri/renderD129", "/dev/kfd"}
    assert plan.summary().endswith("(NVIDIA_VISIBLE_DEVICES=all: this host has no nvidia GPUs, none granted)")


def test_nvidia_options_are_not_read_where_no_nvidia_gpu_is_granted(tmp_path: Path) -> None:
    """NVIDIA_DRIVER_CAPABILITIES (a word the hook refuses on an NVIDIA host), NVIDIA_REQUIRE_CUDA and the rest of a
    CUDA image's env change nothing on a host without NVIDIA GPUs."""
    env = [*imageenvs.CUDA_BASE, "NVIDIA_DRIVER_CAPABILITIES=compute,compat32", f"{NAME}=0"]
    plan = _plan(env, AMD_HOST, tmp_path)
    assert [(d.kind, d.index) for d in plan.devices] == [("amd", 0)] and not plan.edits.mounts
    assert not _plan([*imageenvs.CUDA_BASE, "NVIDIA_DRIVER_CAPABILITIES=compat32"], AMD_HOST, tmp_path)


def test_a_rocm_image_asks_for_nothing(tmp_path: Path) -> None:
    plan = _plan(imageenvs.ROCM, AMD_HOST, tmp_path)
    assert not plan and plan.request.asks == [] and plan.summary() == "no GPU requested"


@pytest.mark.parametrize(("value", "why"), [
    ("0", "'0' is out of range: this host has no nvidia GPUs"),
    ("0-1", "is a range whose end '0' is out of range: this host has no nvidia GPUs"),
    ("GPU-8f6e2a1c-5d1b-4c3e-9a7f-0123456789ab", "is not the UUID of an NVIDIA GPU on this host"),
    ("0000:1a:00.0", "is not the PCI address of an NVIDIA GPU on this host"),
    ("0:0", "names GPU '0', which is out of range: this host has no nvidia GPUs"),
    ("all,0", "'all' cannot be combined with other entries"),
])
def test_a_named_nvidia_device_on_a_host_without_nvidia_gpus_is_refused(tmp_path: Path, value: str, why: str) -> None:
    with pytest.raises(HookError) as info:
        _plan([*imageenvs.CUDA_BASE, f"NVIDIA_VISIBLE_DEVICES={value}"], AMD_HOST, tmp_path)
    text = str(info.value)
    assert text.startswith(f"NVIDIA_VISIBLE_DEVICES={value}: ") and why in text, text
    assert text.endswith("(valid: all or none, which grant no nvidia GPU on this host)") and "\n" not in text


def _annotated_plan(names: str, tmp_path: Path, env: list[str] | None = None, **values: object) -> Plan:
    """The plan of a container whose ``cdi.k8s.io/x`` annotation is ``names`` on the AMD example host."""
    settings = Config(sysfs_root=str(AMD_HOST), proc_root=str(tmp_path), driver_root=str(tmp_path),
                      hook_path="/bin/true", **values)  # type: ignore[arg-type]
    spec = ContainerSpec({"ociVersion": "1.0.2", "process": {"env": env or []}, "annotations": {"cdi.k8s.io/x": names}})
    return plan_for_spec(spec, settings)


NO_NVIDIA_CDI = "(valid: none, which grants no nvidia GPU; a CDI name must name a device this host has)"


@pytest.mark.parametrize(("names", "line"), [
    ("nvidia.com/gpu=all", f"cdi.k8s.io annotations=all: 'all' names no device: this host has no nvidia GPUs "
                           f"{NO_NVIDIA_CDI}"),
    ("nvidia.com/gpu=ALL ", "cdi.k8s.io annotations=all: 'all' names no device: this host has no nvidia GPUs"),
    ("amd.com/gpu=2,nvidia.com/gpu=all", "cdi.k8s.io annotations=all: 'all' names no device: this host has no "
                                         "nvidia GPUs"),
    ("intel.com/gpu=all,amd.com/gpu=2", "cdi.k8s.io annotations=all: 'all' names no device: this host has no intel "
                                        "GPUs (valid: none, which grants no intel GPU; a CDI name must name a device "
                                        "this host has)"),
    ("nvidia.com/gpu=0", f"cdi.k8s.io annotations=0: '0' is out of range: this host has no nvidia GPUs "
                         f"{NO_NVIDIA_CDI}"),
    ("nvidia.com/gpu=GPU-8f6e2a1c", "cdi.k8s.io annotations=GPU-8f6e2a1c: 'GPU-8f6e2a1c' is not the UUID of an "
                                    f"NVIDIA GPU on this host {NO_NVIDIA_CDI}"),
    ("intel.com/gpu=card0", "cdi.k8s.io annotations=card0: 'card0' "),
])
def test_a_cdi_name_of_a_kind_the_host_lacks_is_refused(tmp_path: Path, names: str, line: str) -> None:
    """An annotation is an orchestrator's explicit CDI name: ``all`` of a kind the node lacks resolves to no device
    and is refused (containerd and podman refuse an unresolvable CDI name), in the one line of a name of a device the
    node lacks; whatever else the annotations or the env ask for."""
    for env in ([], imageenvs.CUDA_BASE, [f"{NAME}=1"]):
        with pytest.raises(HookError) as info:
            _annotated_plan(names, tmp_path, env)
        text = str(info.value)
        assert text.startswith(line) and "\n" not in text, text


@pytest.mark.parametrize("names", ["nvidia.com/gpu=none", "nvidia.com/gpu=void", "nvidia.com/gpu=",
                                   "vendor.example/gpu=all", "amd.com/gpu=none,nvidia.com/gpu=VOID"])
def test_an_annotation_naming_no_device_of_a_kind_the_host_lacks_changes_nothing(tmp_path: Path, names: str) -> None:
    """``none``, ``void`` and empty name no device, whatever the node has; another vendor's kind is someone else's."""
    if names.endswith("="):  # a CDI name without a name is malformed, as on every node
        with pytest.raises(HookError, match="is not a CDI device name"):
            _annotated_plan(names, tmp_path)
        return
    plan = _annotated_plan(names, tmp_path, [*imageenvs.CUDA_BASE])
    decided = names.startswith(("nvidia", "amd.com/gpu=none,nvidia"))  # the annotation decides for nvidia
    assert not plan and plan.devices == () and not plan.edits.mounts
    assert plan.request.note == ("NVIDIA_VISIBLE_DEVICES=all ignored: annotations decide" if decided else
                                 "NVIDIA_VISIBLE_DEVICES=all: this host has no nvidia GPUs, none granted"), names


def test_an_annotation_of_a_kind_not_in_backends_is_not_read(tmp_path: Path) -> None:
    plan = _annotated_plan("nvidia.com/gpu=all,amd.com/gpu=2", tmp_path, backends=("amd", "intel"))
    assert [d.index for d in plan.devices] == [2] and plan.request.note == ""


def test_the_env_all_of_a_kind_the_host_lacks_still_starts(tmp_path: Path) -> None:
    """The image's habit stays what it was: ``NVIDIA_VISIBLE_DEVICES=all`` grants nothing, noted; an annotation
    naming an AMD GPU beside it grants that one and the nvidia env still only notes."""
    plan = _annotated_plan("amd.com/gpu=2", tmp_path, imageenvs.CUDA_BASE)
    assert [d.index for d in plan.devices] == [2]
    assert plan.request.note == "NVIDIA_VISIBLE_DEVICES=all: this host has no nvidia GPUs, none granted"


def test_a_cdi_all_where_the_kind_is_there_but_nothing_can_be_granted_says_so(tmp_path: Path) -> None:
    """A node whose backend sees devices it cannot grant is not without the kind: the annotation's ``all`` is refused
    with what was seen, the line the env's ``all`` gets."""
    host = fakesysfs.seed_host()
    sysfs = Path(fakesysfs.build(str(tmp_path / "amd" / "sys"), host))
    shutil.rmtree(sysfs / "devices" / "virtual" / "kfd")
    settings = Config(sysfs_root=str(sysfs), proc_root=str(tmp_path), hook_path="/bin/true")
    spec = ContainerSpec({"ociVersion": "1.0.2", "annotations": {"cdi.k8s.io/x": "amd.com/gpu=all"}})
    with pytest.raises(HookError, match=r"^cdi.k8s.io annotations=all: this host's amd GPUs cannot be granted: "):
        plan_for_spec(spec, settings)


def test_valid_values_of_an_annotation_on_a_host_with_the_kind_are_the_envs() -> None:
    devices = seed().devices("amd")
    assert valid_values("amd", devices, CDI_SOURCE) == valid_values("amd", devices)
    assert valid_values("amd", ()) == "valid: all or none, which grant no amd GPU on this host"


def test_a_kind_not_in_backends_is_not_read_at_all(tmp_path: Path) -> None:
    env = [*imageenvs.CUDA_BASE, "NVIDIA_VISIBLE_DEVICES=GPU-8f6e2a1c", f"{NAME}=1"]
    plan = _plan(env, AMD_HOST, tmp_path, backends=("amd", "intel"))
    assert [d.index for d in plan.devices] == [1] and plan.request.note == ""
    assert [a.kind for a in plan.request.asks] == ["amd"]


def test_gpus_removed_while_the_node_runs(tmp_path: Path) -> None:
    """Hot-removal on a copy of the seed host: ``all`` follows what is there (none at the end: nothing granted,
    noted); an index of a removed GPU is refused; the same container env throughout."""
    host = fakesysfs.seed_host()
    sysfs = Path(fakesysfs.build(str(tmp_path / "sys"), host))
    amd_gpus = [g for g in host.gpus if g.driver == "amdgpu"]
    assert [d.index for d in _plan([f"{NAME}=all"], sysfs, tmp_path).devices] == list(range(len(amd_gpus)))
    fakesysfs.remove_gpu(str(sysfs), host, amd_gpus[-1].pci)
    assert [d.index for d in _plan([f"{NAME}=all"], sysfs, tmp_path).devices] == list(range(len(amd_gpus) - 1))
    with pytest.raises(HookError, match=f"'{len(amd_gpus) - 1}' is out of range"):
        _plan([f"{NAME}={len(amd_gpus) - 1}"], sysfs, tmp_path)
    for gpu in amd_gpus[:-1]:
        fakesysfs.remove_gpu(str(sysfs), host, gpu.pci)
    plan = _plan([f"{NAME}=all"], sysfs, tmp_path)
    assert not plan and plan.request.note == f"{NAME}=all: this host has no amd GPUs, none granted"
    with pytest.raises(HookError, match="'1' is out of range: this host has no amd GPUs"):
        _plan([f"{NAME}=1"], sysfs, tmp_path)
    with pytest.raises(HookError, match="is not the PCI address of an AMD GPU on this host"):
        _plan([f"{NAME}={amd_gpus[0].pci}"], sysfs, tmp_path)


def test_all_where_the_kind_is_there_but_nothing_can_be_granted_is_refused(tmp_path: Path) -> None:
    """A node with the vendor's GPUs that its backend cannot grant (every GPU excluded by the NVIDIA driver; amdgpu
    devices without KFD) is not a node without the kind: ``all`` there is refused with what was seen."""
    nvidia = tmp_path / "nvidia"
    shutil.copytree(REPO / "examples" / "hosts" / "nvidia-4x-h100", nvidia, symlinks=True)
    for info in (nvidia / "proc" / "driver" / "nvidia" / "gpus").glob("*/information"):
        info.write_text(info.read_text().replace("GPU Excluded:\t No", "GPU Excluded:\t Yes"))
    settings = Config(sysfs_root=str(nvidia / "sys"), proc_root=str(nvidia / "proc"),
                      driver_root=str(nvidia / "driver"), hook_path="/bin/true")
    spec = ContainerSpec({"ociVersion": "1.0.2", "process": {"env": imageenvs.CUDA_BASE}})
    with pytest.raises(HookError) as info:
        plan_for_spec(spec, settings)
    assert str(info.value) == ("NVIDIA_VISIBLE_DEVICES=all: this host's nvidia GPUs cannot be granted: 0000:1b:00.0: "
                               "excluded by the driver (GPU Excluded: Yes) (and 3 more)")
    host = fakesysfs.seed_host()
    sysfs = Path(fakesysfs.build(str(tmp_path / "amd" / "sys"), host))
    shutil.rmtree(sysfs / "devices" / "virtual" / "kfd")  # amdgpu loaded, its compute side not
    with pytest.raises(HookError, match=r"^AMD_VISIBLE_DEVICES=all: this host's amd GPUs cannot be granted: "
                                        r"0000:03:00.0: renderD128 has no KFD topology node.* \(and 7 more\)$"):
        _plan([f"{NAME}=all"], sysfs, tmp_path)
