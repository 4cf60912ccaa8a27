"""examples/kubernetes: the files parse, agree with each other and with the code they describe."""

from __future__ import annotations

import itertools
import os
import re
import shlex
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

from oci_gpu_hook import __version__
from oci_gpu_hook.config import FIELDS
from oci_gpu_hook.install.containerd import RUNTIME_NAME, drop_in
from oci_gpu_hook.kinds import KINDS
from oci_gpu_hook.serve import planner
from tests.helpers.containerlib import INSTALL_DEV, SEED_SYSFS
from tests.helpers.installtrees import CONTAINERD_V2, CONTAINERD_V3, containerd_binary, put

REPO = Path(__file__).resolve().parent.parent
EXAMPLES = REPO / "examples" / "kubernetes"
LAUNCHER_DIR = "/usr/local/libexec/oci-gpu-hook"
CDI_KIND = KINDS["amd"][0]
DEVICE_PLUGIN_DIR = "/var/lib/kubelet/device-plugins"
PLANNER_DIR = "/run/oci-gpu-hook"
NRI_DIR = "/var/run/nri"  # the NRI socket's directory (the plugin's default socket's)


def _load(name: str) -> dict[str, Any]:
    documents = list(yaml.safe_load_all((EXAMPLES / name).read_text()))
    assert len(documents) == 1, f"{name}: expected one document"
    assert isinstance(documents[0], dict)
    return documents[0]


def _cli(*args: str) -> str:
    done = subprocess.run([sys.executable, "-m", "oci_gpu_hook.entry.cli", *args], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.fixture(scope="module")
def usage() -> str:
    return _cli("--help")


def _commands(usage: str) -> set[str]:
    """The subcommand names of ``oci-gpu-hook --help`` (``  list [--json]  ...`` -> ``list``)."""
    names = set()
    for line in usage.splitlines():
        match = re.match(r"  ([a-z][a-z-]*)\b", line)
        if match:
            names.add(match.group(1))
            names.update(re.findall(r"\(or ([a-zA-Z-]+)\)", line))
    return names


def test_containerd_drop_in_is_what_the_code_writes() -> None:
    """The example is the drop-in install writes on a containerd 1.6 node without a main config (main None)."""
    text = (EXAMPLES / "containerd-oci-gpu.toml").read_text()
    assert text == drop_in(f"{LAUNCHER_DIR}/oci-gpu-runtime", None)
    data = tomllib.loads(text)
    assert data.keys() == {"version", "plugins"} and data["version"] == 2
    assert data["plugins"] == {"io.containerd.grpc.v1.cri": {"containerd": {"runtimes": {
        "runc": {"runtime_type": "io.containerd.runc.v2"},  # what default_runtime_name needs
        RUNTIME_NAME: {
            "runtime_type": "io.containerd.runc.v2",
            "container_annotations": ["cdi.k8s.io/*"],  # no pod_annotations: a pod's author could set those
            "options": {"BinaryName": f"{LAUNCHER_DIR}/oci-gpu-runtime"},
        },
    }}}}


def test_runtime_class() -> None:
    runtime_class = _load("runtimeclass.yaml")
    assert runtime_class["apiVersion"] == "node.k8s.io/v1"
    assert runtime_class["kind"] == "RuntimeClass"
    assert runtime_class["metadata"]["name"] == RUNTIME_NAME
    assert runtime_class["handler"] == RUNTIME_NAME


def test_pod_example() -> None:
    pod = _load("pod-example.yaml")
    assert (pod["apiVersion"], pod["kind"]) == ("v1", "Pod")
    assert pod["spec"]["runtimeClassName"] == _load("runtimeclass.yaml")["metadata"]["name"]
    (container,) = pod["spec"]["containers"]
    assert container["resources"]["limits"] == {CDI_KIND: 1}


def _hook_command(command: list[str]) -> tuple[str, list[str]]:
    """(subcommand, its arguments) of an ``oci-gpu-hook`` or ``python -m oci_gpu_hook.entry.cli`` command line."""
    for i, word in enumerate(command):
        if word.endswith("/oci-gpu-hook") or word == "oci-gpu-hook":
            return command[i + 1], command[i + 2:]
        if word == "oci_gpu_hook.entry.cli" and command[i - 1] == "-m":
            return command[i + 1], command[i + 2:]
    raise AssertionError(f"not an oci-gpu-hook command: {command}")


def _exec_tail(command: list[str]) -> list[str]:
    """The command a ``/bin/sh -c '... && exec COMMAND'`` container ends in (the planner's, after its lock)."""
    if command[:2] == ["/bin/sh", "-c"]:
        return shlex.split(command[2].rpartition("exec ")[2])
    return command


def test_daemon_set(usage: str) -> None:
    daemon_set = _load("daemonset.yaml")
    assert (daemon_set["apiVersion"], daemon_set["kind"]) == ("apps/v1", "DaemonSet")
    assert daemon_set["metadata"]["annotations"]["oci-gpu-hook/runtime-handler"] == _load("runtimeclass.yaml")[
        "handler"]
    pod = daemon_set["spec"]["template"]["spec"]
    assert pod["hostPID"] is True  # the planner serves only a front it can see by its pid (docs/image.md)
    assert daemon_set["spec"]["selector"]["matchLabels"].items() <= daemon_set["spec"]["template"]["metadata"][
        "labels"].items()
    # The DaemonSet installs on exactly the nodes where pods of the RuntimeClass may run.
    assert pod["nodeSelector"] == _load("runtimeclass.yaml")["scheduling"]["nodeSelector"]

    volumes = {v["name"]: v["hostPath"]["path"] for v in pod["volumes"]}
    # install reads the main config and replaces it (a rename in /etc/containerd): the whole directory.
    assert set(volumes.values()) == {"/etc/containers/oci/hooks.d", "/etc/containerd", "/var/run/cdi", "/sys",
                                     LAUNCHER_DIR, "/var/lib/oci-gpu-hook", DEVICE_PLUGIN_DIR, "/", PLANNER_DIR,
                                     NRI_DIR}
    types = {v["hostPath"]["path"]: v["hostPath"]["type"] for v in pod["volumes"]}
    assert types["/etc/containerd"] == "Directory"  # never create a containerd config on a node without one
    containers = {c["name"]: c for c in pod["initContainers"] + pod["containers"]}
    for container in containers.values():
        assert container["image"] == f"localhost/oci-gpu-hook:{__version__}"  # image/build.sh (tests/test_image.py)
        for mount in container["volumeMounts"]:
            host = volumes[mount["name"]]
            if host == "/sys":  # the inventory reads it through OCI_GPU_HOOK_SYSFS_ROOT
                assert mount.get("readOnly") is True
                env = {e["name"]: e["value"] for e in container["env"]}
                assert env["OCI_GPU_HOOK_SYSFS_ROOT"] == mount["mountPath"]
            elif host == "/":  # install finds the node's containerd there (--host-root), and only reads it
                assert mount == {"name": mount["name"], "mountPath": "/host", "readOnly": True}
                assert container["name"] == "install" and container["command"][-2:] == ["--host-root", "/host"]
            else:  # install writes the real paths (hook.path, BinaryName): same path inside and outside
                assert mount["mountPath"] == host
    header = (EXAMPLES / "daemonset.yaml").read_text().split("apiVersion")[0]
    assert f"The image, localhost/oci-gpu-hook:{__version__}, is the one image/build.sh builds" in header

    (installer,) = (c for c in pod["initContainers"] if c["name"] == "install")
    installed = {volumes[m["name"]] for m in installer["volumeMounts"]}
    # everything install reads or writes, /etc/containerd included; the kubelet's directory is the plugin's, the
    # socket's the planner's, the NRI socket's the runtime's
    assert installed == set(volumes.values()) - {DEVICE_PLUGIN_DIR, PLANNER_DIR, NRI_DIR}
    assert not any(m.get("readOnly") for m in installer["volumeMounts"] if volumes[m["name"]] not in ("/sys", "/"))
    shell = ("copy-environment", "remove-old-environments")  # sh from the image (tests/test_image.py)
    init_commands = [_hook_command(c["command"]) for c in pod["initContainers"] if c["name"] not in shell]
    main_commands = [_hook_command(_exec_tail(c["command"])) for c in pod["containers"]]
    assert init_commands == [("install", ["--only", "containerd,cdi", "--set", "OCI_GPU_HOOK_ALLOW_ENV_REQUESTS=false",
                                          "--host-root", "/host"])]  # no --prefix
    # the plugin keeps the CDI spec current itself: no watch beside it (two writers of one file); the planner; the
    # NRI plugin on the runtime's socket (tests/test_image.py)
    assert main_commands == [("device-plugin", ["--resource-strategy=mixed"]), ("serve", []),
                             ("nri", ["--socket", f"{NRI_DIR}/nri.sock"])]
    assert {"install", "device-plugin", "serve"} <= _commands(usage)
    for name, args in init_commands + main_commands:
        assert name in _commands(usage)
        help_text = _cli(name, "--help")
        for flag in (a.partition("=")[0] for a in args if a.startswith("-")):
            assert flag in help_text, f"{name} {flag} is not in its --help"
    for _name, args in init_commands:
        for key, value in itertools.pairwise(args):
            if key == "--set":  # a baked default must be a real setting with a valid value
                variable, _, setting = value.partition("=")
                field = next(f for f, spec in FIELDS.items() if spec.env == variable)
                assert field == "allow_env_requests" and setting == "false"
    for container in containers.values():
        if container["name"] not in (*shell, "device-plugin", "nri"):
            assert container["securityContext"]["privileged"] is True
    # The device plugin reads sysfs, writes its sockets where the kubelet looks and the CDI spec where
    # containerd reads it (--cdi-dir's default, cdi_dir): no privileges needed.
    plugin = containers["device-plugin"]
    assert plugin["securityContext"] == {"privileged": False, "allowPrivilegeEscalation": False,
                                         "capabilities": {"drop": ["ALL"]}}
    mounts = {volumes[m["name"]]: m for m in plugin["volumeMounts"]}
    assert mounts.keys() == {"/sys", DEVICE_PLUGIN_DIR, FIELDS["cdi_dir"].default}
    assert not mounts[FIELDS["cdi_dir"].default].get("readOnly")
    assert "--no-cdi-specs" not in plugin["command"]
    assert mounts[DEVICE_PLUGIN_DIR]["mountPath"] == DEVICE_PLUGIN_DIR  # the --kubelet-dir default
    assert f"(default {DEVICE_PLUGIN_DIR})" in " ".join(_cli("device-plugin", "--help").split())
    assert types[DEVICE_PLUGIN_DIR] == "Directory"  # the kubelet makes it; a node without one runs no plugin
    # The planner: the launcher install wrote (the node's code, the build the launchers check), its socket where
    # the launchers look, privileged (each request enters the asking launcher's mount namespace).
    server = containers["planner"]
    assert _exec_tail(server["command"]) == [f"{LAUNCHER_DIR}/oci-gpu-hook", "serve"]
    assert {volumes[m["name"]] for m in server["volumeMounts"]} == {LAUNCHER_DIR, PLANNER_DIR}
    assert os.path.dirname(planner.DEFAULT_SOCKET) == PLANNER_DIR and types[PLANNER_DIR] == "DirectoryOrCreate"
    assert server["securityContext"] == {"privileged": True}
    # The NRI plugin: the launcher install wrote (the node's code and baked settings, as the planner), on the
    # plugin's default socket, holding its environment as the planner does (tests/test_image.py runs its command);
    # what the runtime reads by path is at that path (the loop above): the socket's directory and by_path_dir's
    # (the runtime bind-mounts the by-path directories the plugin prepares); no privilege.
    from oci_gpu_hook.serve.nri import plugin as nri_plugin

    nri = containers["nri"]
    assert _exec_tail(nri["command"]) == [f"{LAUNCHER_DIR}/oci-gpu-hook", "nri", "--socket", nri_plugin.DEFAULT_SOCKET]
    assert f"exec 9>>{LAUNCHER_DIR}/.in-use-env-{__version__} && flock -s 9 &&" in nri["command"][2]
    assert {volumes[m["name"]] for m in nri["volumeMounts"]} == {LAUNCHER_DIR, PLANNER_DIR, NRI_DIR, "/sys"}
    assert os.path.dirname(nri_plugin.DEFAULT_SOCKET) == NRI_DIR and types[NRI_DIR] == "DirectoryOrCreate"
    assert os.path.dirname(FIELDS["by_path_dir"].default) == PLANNER_DIR
    assert nri["securityContext"] == plugin["securityContext"]


def test_partition_pod_example() -> None:
    from oci_gpu_hook.inventory.amd import resource_for

    pod = _load("pod-partition.yaml")
    assert (pod["apiVersion"], pod["kind"]) == ("v1", "Pod")
    assert pod["spec"]["runtimeClassName"] == RUNTIME_NAME
    (container,) = pod["spec"]["containers"]
    # the name the plugin gives a CPX/NPS1 partition under the DaemonSet's --resource-strategy=mixed
    assert container["resources"]["limits"] == {resource_for("mixed", "CPX", "NPS1"): 1}


def test_contract_names_real_commands_and_settings(usage: str) -> None:
    text = (EXAMPLES / "device-plugin-contract.md").read_text()
    for command in re.findall(r"`oci-gpu-hook ([a-z-]+)", text):
        assert command in _commands(usage), command
    for setting in ("allow_env_requests", "cdi_dir", "cgroup_access", "log_file"):
        assert setting in text and setting in FIELDS
    assert f"`runtimeClassName: {RUNTIME_NAME}`" in text
    assert FIELDS["cdi_dir"].default in text
    flat = " ".join(text.split())
    # What the drop-in passes, and how the node's own CRI settings survive it.
    assert '`container_annotations = ["cdi.k8s.io/*"]`' in flat
    assert "**Pod annotations are not passed.**" in flat
    assert "`Annotations` of `ContainerAllocateResponse`" in flat
    assert "containerd 1.6 has no CDI support of its own" in flat
    assert 'adds `imports = ["/etc/containerd/conf.d/*.toml"]` to the main config' in flat
    assert "after editing the CRI section of `/etc/containerd/config.toml`, run `oci-gpu-hook install` again" in flat
    assert "known problem" not in flat


DAEMONSET_NODES = {
    # Docker's containerd.io 1.7 package in /usr/bin, the node's version 2 config
    "1.7": ("v1.7.24", "/usr/bin/containerd", CONTAINERD_V2, 2),
    # containerd 2.x from the release tarball in /usr/local/bin, its version 3 config
    "2.x": ("v2.1.9", "/usr/local/bin/containerd", CONTAINERD_V3, 3),
    # containerd 2.x running on its built-in defaults: /etc/containerd is there, config.toml is not
    "2.x-no-config": ("v2.1.9", "/usr/local/bin/containerd", None, 3),
}


@pytest.mark.parametrize("node", DAEMONSET_NODES)
def test_daemon_set_install_on_a_node(tmp_path: Path, node: str) -> None:
    """The install container's command, exactly as the DaemonSet has it, on a tree that looks like the node: the
    pod's mounts are the node's own paths (the tree), /host is the tree, and the container has no containerd."""
    version, binary, main, config_version = DAEMONSET_NODES[node]
    pod = _load("daemonset.yaml")["spec"]["template"]["spec"]
    (installer,) = (c for c in pod["initContainers"] if c["name"] == "install")
    mounts = {m["mountPath"]: m for m in installer["volumeMounts"]}
    assert mounts["/host"]["readOnly"] is True
    node_root = tmp_path / "node"
    containerd_binary(node_root, version, "build-info", binary)
    (node_root / "etc/containerd").mkdir(parents=True, exist_ok=True)
    if main is not None:
        put(node_root, "/etc/containerd/config.toml", main)
    _name, args = _hook_command(installer["command"])
    args = [str(node_root) if a == "/host" else a for a in args]
    empty = tmp_path / "empty-path"
    empty.mkdir()
    env = {"PATH": str(empty), "OCI_GPU_HOOK_CONFIG": os.devnull, "OCI_GPU_HOOK_SYSFS_ROOT": str(SEED_SYSFS)}
    done = subprocess.run([sys.executable, "-m", "oci_gpu_hook.entry.cli", "install", *INSTALL_DEV, *args,
                           "--prefix", str(node_root)], capture_output=True, text=True, env=env, timeout=120,
                          cwd=REPO, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    drop_in_file = tomllib.loads((node_root / "etc/containerd/conf.d/oci-gpu-hook.toml").read_text())
    assert drop_in_file["version"] == config_version
    cri = drop_in_file["plugins"]["io.containerd.grpc.v1.cri" if config_version == 2
                                  else "io.containerd.cri.v1.runtime"]
    assert cri["enable_cdi"] is True and cri["cdi_spec_dirs"] == ["/etc/cdi", "/var/run/cdi"]
    assert cri["containerd"]["runtimes"][RUNTIME_NAME]["options"]["BinaryName"] == f"{LAUNCHER_DIR}/oci-gpu-runtime"
    assert tomllib.loads((node_root / "etc/containerd/config.toml").read_text())["version"] == config_version
    assert f"note: containerd: containerd {version[1:]} ({node_root}{binary}, its build info): native CDI on" \
        in done.stdout
    assert "no native CDI" not in done.stdout
