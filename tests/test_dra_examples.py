"""examples/kubernetes/dra-*.yaml: the DRA driver's DeviceClasses, claims, RBAC and DaemonSet parse, select on
attributes the driver publishes, use only classes that exist, grant what the driver does at the API server, and
run the command with options it has."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from oci_gpu_hook.cluster.dra import DEFAULT_DRIVER
from oci_gpu_hook.cluster.dra.devices import ATTRIBUTES, build
from oci_gpu_hook.inventory import scan

REPO = Path(__file__).resolve().parent.parent
EXAMPLES = REPO / "examples" / "kubernetes"
HOSTS = REPO / "examples" / "hosts"


def _documents(name: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all((EXAMPLES / name).read_text()) if d]


def _all() -> list[dict[str, Any]]:
    return [d for path in sorted(EXAMPLES.glob("dra-*.yaml")) for d in _documents(path.name)]


def test_the_files_hold_the_kinds_they_are_for() -> None:
    kinds = {name: sorted({d["kind"] for d in _documents(name)}) for name in (
        "dra-deviceclasses.yaml", "dra-claims.yaml", "dra-rbac.yaml", "dra-daemonset.yaml")}
    assert kinds == {"dra-deviceclasses.yaml": ["DeviceClass"], "dra-claims.yaml": ["Pod", "ResourceClaimTemplate"],
                     "dra-rbac.yaml": ["ClusterRole", "ClusterRoleBinding", "ServiceAccount"],
                     "dra-daemonset.yaml": ["DaemonSet"]}
    assert {d["apiVersion"] for d in _all() if d["kind"] in ("DeviceClass", "ResourceClaimTemplate")} == {
        "resource.k8s.io/v1"}


def test_selectors_name_attributes_the_driver_publishes() -> None:
    text = "\n".join((EXAMPLES / p.name).read_text() for p in sorted(EXAMPLES.glob("dra-*.yaml")))
    used = set(re.findall(r'device\.attributes\["([^"]+)"\]\.(\w+)', text))
    matched = set(re.findall(r"matchAttribute: ([\w.-]+)/(\w+)", text))
    assert used and matched
    assert {domain for domain, _ in used | matched} == {DEFAULT_DRIVER}
    assert {name for _, name in used | matched} <= set(ATTRIBUTES)
    assert set(re.findall(r'device\.driver == "([^"]+)"', text)) == {DEFAULT_DRIVER}
    published = {name for host in HOSTS.iterdir() for device in build(scan(
        str(host / "sys"), strict=False, proc_root=str(host / "proc") if (host / "proc").is_dir() else "/proc"))[0]
        for name in device.attributes}
    assert {name for _, name in used | matched} - published <= {"migProfile"}  # MIG: NVML (tests/test_dra.py)


def test_claims_use_the_classes_there_are() -> None:
    classes = {d["metadata"]["name"] for d in _documents("dra-deviceclasses.yaml")}
    templates = {d["metadata"]["name"]: d for d in _documents("dra-claims.yaml")
                 if d["kind"] == "ResourceClaimTemplate"}
    for template in templates.values():
        for request in template["spec"]["spec"]["devices"]["requests"]:
            assert request["exactly"]["deviceClassName"] in classes
    for pod in (d for d in _documents("dra-claims.yaml") if d["kind"] == "Pod"):
        claims = {c["name"]: c["resourceClaimTemplateName"] for c in pod["spec"]["resourceClaims"]}
        assert set(claims.values()) <= set(templates)
        for container in pod["spec"]["containers"]:
            assert {c["name"] for c in container["resources"]["claims"]} <= set(claims)


def test_rbac_grants_what_the_driver_does_and_the_daemonset_uses_it() -> None:
    role = next(d for d in _documents("dra-rbac.yaml") if d["kind"] == "ClusterRole")
    granted = {(group, resource, verb) for rule in role["rules"] for group in rule["apiGroups"]
               for resource in rule["resources"] for verb in rule["verbs"]}
    # slices.Publisher: list, create, update (PUT), delete; claims.Claims: get; the Node (the slices' owner): get
    needed = {("resource.k8s.io", "resourceslices", v) for v in ("list", "create", "update", "delete")} | {
        ("resource.k8s.io", "resourceclaims", "get"), ("", "nodes", "get")}
    assert needed <= granted
    (daemonset,) = _documents("dra-daemonset.yaml")
    account = next(d for d in _documents("dra-rbac.yaml") if d["kind"] == "ServiceAccount")
    assert daemonset["spec"]["template"]["spec"]["serviceAccountName"] == account["metadata"]["name"]


def test_the_daemonset_runs_the_command_with_options_it_has() -> None:
    (daemonset,) = _documents("dra-daemonset.yaml")
    (container,) = daemonset["spec"]["template"]["spec"]["containers"]
    command = container["command"]
    assert command[:2] == ["/opt/oci-gpu-hook/bin/oci-gpu-hook", "dra"]
    usage = subprocess.run([sys.executable, "-m", "oci_gpu_hook.entry.cli", "dra", "--help"], capture_output=True,
                           text=True, timeout=60, cwd=REPO).stdout
    for option in (a.split("=")[0] for a in command[2:] if a.startswith("--")):
        assert option in usage
    env = {e["name"]: e for e in container["env"]}
    assert env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    mounts = {m["mountPath"] for m in container["volumeMounts"]}
    assert {"/var/lib/kubelet/plugins_registry", "/var/lib/kubelet/plugins", "/var/run/cdi"} <= mounts
