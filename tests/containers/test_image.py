"""The DaemonSet's containers run from the built image (image/build.sh) against a private node root.

Needs the image's archive: ``OCI_GPU_HOOK_IMAGE=image/out/oci-gpu-hook-VERSION.oci.tar`` (docs/image.md); without
it every test here skips with that line (the build takes minutes, longer than the suite's budget for it).  podman
loads the archive into storage of its own (a temporary directory; the host's image store never changes), then runs
the DaemonSet's copy-environment and install containers exactly as written, each volume's hostPath a directory of
a node tree in a temporary directory (the node's / is the tree, /sys the seed host's fake sysfs).  Checked on the
tree afterwards: what install wrote (the containerd drop-in, the CDI spec, the launchers: the prebuilt native
fronts); that nothing on the node names a path that exists only inside the image (/opt/oci-gpu-hook, or the
image's own libraries); and that the launchers run on the host, outside any container, from the copied environment
alone: every file the interpreter maps is the copy's (no library of the host, none of the image).
"""

from __future__ import annotations

import json
import os
import subprocess
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from oci_gpu_hook import __version__
from oci_gpu_hook.host import planner as planner_module
from oci_gpu_hook.host.containerd import RUNTIME_NAME
from tests.conftest import need
from tests.helpers import containerdlib as ctrd
from tests.helpers import containerlib as cl
from tests.helpers import plannerlib
from tests.helpers.installtrees import CONTAINERD_V2, containerd_binary, put

pytestmark = pytest.mark.containers
daemon = ctrd.daemon  # a private containerd 1.6, for the import

REPO = Path(__file__).resolve().parent.parent.parent
DAEMONSET = REPO / "examples" / "kubernetes" / "daemonset.yaml"
LAUNCHER_DIR = "/usr/local/libexec/oci-gpu-hook"
ENV_DIR = f"{LAUNCHER_DIR}/env-{__version__}"
IMAGE_ONLY = "/opt/oci-gpu-hook"


def _files(root: Path) -> dict[str, bytes]:
    """Every file and link under a node tree, by path: its bytes (a link: its target)."""
    found = {}
    for directory, _dirs, names in os.walk(root):
        for name in names:
            path = Path(directory) / name
            found[str(path.relative_to(root))] = os.readlink(path).encode() if path.is_symlink() else path.read_bytes()
    return found


@dataclass
class Node:
    base: Path
    root: Path
    podman: list[str]
    image: str
    pristine: dict[str, bytes] | None = None  # the node's files before anything ran

    def run(self, container: dict[str, object]) -> subprocess.CompletedProcess[str]:
        """One container of the DaemonSet, as the kubelet would start it, on this node tree."""
        pod = yaml.safe_load(DAEMONSET.read_text())["spec"]["template"]["spec"]
        volumes = {v["name"]: v["hostPath"]["path"] for v in pod["volumes"]}
        argv = [*self.podman, "run", "--rm", "--net=none", *cl.PODMAN_RUN[3:7]]  # the ulimits this machine allows
        if (container.get("securityContext") or {}).get("privileged"):  # type: ignore[attr-defined]
            argv.append("--privileged")
        for mount in container.get("volumeMounts", []):  # type: ignore[attr-defined]
            host = volumes[mount["name"]]
            source = cl.SEED_SYSFS if host == "/sys" else self.root / host.lstrip("/")
            source.mkdir(parents=True, exist_ok=True)
            argv += ["-v", f"{source}:{mount['mountPath']}:{'ro' if mount.get('readOnly') else 'rw'}"]
        for variable in container.get("env", []):  # type: ignore[attr-defined]
            argv += ["-e", f"{variable['name']}={variable['value']}"]
        argv += ["--entrypoint", container["command"][0], self.image, *container["command"][1:]]  # type: ignore[index]
        return subprocess.run(argv, capture_output=True, text=True, timeout=600, check=False)


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Node]:
    archive = os.environ.get("OCI_GPU_HOOK_IMAGE")
    if not archive:
        pytest.skip("OCI_GPU_HOOK_IMAGE is not set: build the image (image/build.sh, docs/image.md), name its archive")
    need("podman")
    base = tmp_path_factory.mktemp("image-node")
    podman = [*cl.PODMAN, "--root", str(base / "storage"), "--runroot", str(base / "run"), "--runtime", "runc"]
    done = subprocess.run([*podman, "load", "-i", archive], capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    image = f"localhost/oci-gpu-hook:{__version__}"
    assert image in done.stdout, done.stdout
    root = base / "node"
    containerd_binary(root, "v1.7.24", "build-info", "/usr/bin/containerd")
    put(root, "/etc/containerd/config.toml", CONTAINERD_V2)
    (root / "sys").mkdir()  # where the node's sysfs is mounted, under its / (the DaemonSet mounts both)
    yield Node(base, root, podman, image, _files(root))
    subprocess.run([*podman, "rmi", "-af"], capture_output=True, timeout=300, check=False)


@pytest.fixture(scope="module")
def installed(node: Node) -> Node:
    pod = yaml.safe_load(DAEMONSET.read_text())["spec"]["template"]["spec"]
    for container in pod["initContainers"]:  # copy-environment, then install, as the kubelet runs them
        done = node.run(container)
        assert done.returncode == 0, f"{container['name']}: {done.stdout}{done.stderr}"
    return node


def test_containerd_imports_and_runs_the_image(node: Node, daemon: ctrd.Daemon) -> None:
    """``ctr images import`` of the archive (containerd 1.6), and a container of it: the CLI from the environment."""
    archive = os.environ["OCI_GPU_HOOK_IMAGE"]
    done = daemon.ctr("images", "import", archive, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    assert node.image in daemon.ctr("images", "ls", "-q").stdout.split()
    done = daemon.ctr("run", "--rm", "--runc-root", str(daemon.base / "runc"), "--fifo-dir", str(daemon.base / "fifo"),
                      node.image, f"image-{os.getpid()}", "/opt/oci-gpu-hook/bin/oci-gpu-hook", "--help", timeout=120)
    assert done.returncode == 0 and "usage: oci-gpu-hook" in done.stdout, done.stdout + done.stderr


def test_install_from_the_image_writes_the_node_files(installed: Node) -> None:
    root = installed.root
    drop_in = tomllib.loads((root / "etc/containerd/conf.d/oci-gpu-hook.toml").read_text())
    runtime = drop_in["plugins"]["io.containerd.grpc.v1.cri"]["containerd"]["runtimes"][RUNTIME_NAME]
    assert runtime["options"]["BinaryName"] == f"{LAUNCHER_DIR}/oci-gpu-runtime"
    spec = json.loads((root / "var/run/cdi/amd.com-gpu.json").read_text())
    assert spec["kind"] == "amd.com/gpu" and len(spec["devices"]) > 0
    for name in ("oci-gpu-hook", "oci-gpu-runtime"):
        front = root / LAUNCHER_DIR.lstrip("/") / name
        assert front.read_bytes()[:4] == b"\x7fELF"  # the native front, prebuilt (the image has no compiler)
        readelf = subprocess.run(["readelf", "-l", str(front)], capture_output=True, text=True, check=True)
        assert "INTERP" not in readelf.stdout  # static: no loader or library of the host or the image
    assert (root / ENV_DIR.lstrip("/") / "bin/python3").is_symlink()
    st = (root / ENV_DIR.lstrip("/")).stat()
    assert st.st_uid == 0 and not st.st_mode & 0o022


def _strings(data: bytes) -> set[str]:
    import re

    path = rb"/(?:usr|opt|lib|lib64|bin|etc|var|run)[^\x00-\x20\x7f-\xff'\"\\,()\[\]{}]*"
    return {m.decode() for m in re.findall(path, data)}


def test_nothing_on_the_node_names_the_images_files(installed: Node) -> None:
    """Every absolute path in the launchers and what names them exists on the node, and none is the image's."""
    root = installed.root
    launcher_dir = root / LAUNCHER_DIR.lstrip("/")
    named = set()
    for path in sorted(p for p in launcher_dir.iterdir() if p.is_file()):
        named |= {s for s in _strings(path.read_bytes()) if s.startswith(LAUNCHER_DIR)}
        assert IMAGE_ONLY.encode() not in path.read_bytes(), path
    for path in (root / "etc/containerd/conf.d/oci-gpu-hook.toml", root / "var/run/cdi/amd.com-gpu.json"):
        assert IMAGE_ONLY not in path.read_text(), path
    assert f"{ENV_DIR}/bin/python3" in named
    for real in named:  # each exists on the node itself: under the copied environment or the launchers
        path = root / real.lstrip("/")
        assert os.path.lexists(path), real
    # the environment's own links stay inside it (bin/python3 -> base/bin/python3.11)
    env = root / ENV_DIR.lstrip("/")
    for directory, _dirs, files in os.walk(env):
        for name in files:
            path = Path(directory) / name
            if path.is_symlink():
                target = os.readlink(path)
                assert not target.startswith("/") or target.startswith(ENV_DIR), (path, target)


def test_the_launchers_run_on_the_host_from_the_copy_alone(installed: Node) -> None:
    """Outside any container, with the node's launcher directory at its real path (a private mount namespace):
    the front hands over to the copied environment's Python, which maps no file of the host's or the image's
    libraries (glibc's locale data aside: read by name, not code)."""
    launcher_dir = installed.root / LAUNCHER_DIR.lstrip("/")
    check = ("import json, sys, oci_gpu_hook.entry.cli, oci_gpu_hook.host.deviceplugin.server, ssl, ctypes, yaml, "
             "pydantic_core\n"
             "maps = {l.split()[-1] for l in open('/proc/self/maps') if '/' in l}\n"
             "print(json.dumps([sys.executable, sorted(m for m in maps if not m.startswith(sys.argv[1]))]))\n")
    script = (f"mount -t tmpfs -o mode=755 tmpfs /usr/local && mkdir -p {LAUNCHER_DIR} && "
              f"mount --bind {launcher_dir} {LAUNCHER_DIR} && "
              f"{LAUNCHER_DIR}/oci-gpu-hook --help >/dev/null && "
              f"env -i {ENV_DIR}/bin/python3 -I -c \"$1\" {ENV_DIR}/")
    done = subprocess.run(["unshare", "-m", "sh", "-c", script, "sh", check], capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    executable, outside = json.loads(done.stdout)
    assert executable == f"{ENV_DIR}/bin/python3"
    foreign = [m for m in outside if not m.startswith("/usr/lib/locale/") and "/gconv/" not in m]
    assert foreign == [], foreign


def test_install_again_from_the_image_changes_nothing(installed: Node) -> None:
    """A pod restart: copy-environment and install run again; every file on the node is as it was."""
    def snapshot() -> dict[str, bytes]:
        return {str(p.relative_to(installed.root)): p.read_bytes()
                for p in sorted(installed.root.rglob("*")) if p.is_file() and not p.is_symlink()
                and "journal.d" not in p.parts}

    before = snapshot()
    pod = yaml.safe_load(DAEMONSET.read_text())["spec"]["template"]["spec"]
    for container in pod["initContainers"]:
        done = installed.run(container)
        assert done.returncode == 0, f"{container['name']}: {done.stdout}{done.stderr}"
    after = snapshot()
    assert sorted(after) == sorted(before)
    assert [k for k in before if before[k] != after[k]] == []


def _version_lines(launcher_dir: Path) -> set[bytes]:
    """The planner version lines the node's launchers carry."""
    import re

    return {m for p in launcher_dir.iterdir() if p.is_file()
            for m in re.findall(rb"oci-gpu-hook [0-9][^ \0]* planner/[0-9]+ [0-9a-f]{24}", p.read_bytes())}


def test_upgrade_from_a_newer_image(installed: Node, tmp_path: Path) -> None:
    """A newer image over this one (OCI_GPU_HOOK_IMAGE_NEXT, the same commit with another version: docs/image.md):
    its copy-environment and install, the DaemonSet's with the new version, rewrite the launchers to name the new
    environment, once; the old planner, still running, refuses the new launchers' version line (they start Python
    until the new planner takes the socket) and no launcher of the old build is left.  Run last: it changes the
    module's node."""
    archive = os.environ.get("OCI_GPU_HOOK_IMAGE_NEXT")
    if not archive:
        pytest.skip("OCI_GPU_HOOK_IMAGE_NEXT is not set: build a newer version's image (docs/image.md), name it")
    done = subprocess.run([*installed.podman, "load", "-i", archive], capture_output=True, text=True, timeout=600,
                          check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    (next_image,) = {w for w in done.stdout.split() if w.startswith("localhost/oci-gpu-hook:")} - {installed.image}
    next_version = next_image.rpartition(":")[2]
    launcher_dir = installed.root / LAUNCHER_DIR.lstrip("/")
    (old_line,) = _version_lines(launcher_dir)
    socket_path = tmp_path / "planner" / "planner.sock"
    socket_path.parent.mkdir(mode=0o700)
    serve = (f"mount -t tmpfs -o mode=755 tmpfs /usr/local && mkdir -p {LAUNCHER_DIR} && "
             f"mount --bind {launcher_dir} {LAUNCHER_DIR} && exec {LAUNCHER_DIR}/oci-gpu-hook serve \"$@\"")
    old_planner = plannerlib.Planner(launcher_dir / "oci-gpu-hook", socket_path, {"PATH": "/usr/sbin:/usr/bin:/bin"},
                                     workers=1, argv=["unshare", "-m", "sh", "-c", serve, "sh"]).start()
    fds = plannerlib.namespace_fds()
    try:
        def answer(line: bytes) -> bytes:
            data = plannerlib.request_bytes(line.decode(), "oci-gpu-hook", "/x", ["precreate"], ["PATH=/bin"], b"{}")
            try:
                return plannerlib.ask(socket_path, data, fds)
            except BrokenPipeError:
                return b""

        assert planner_module.decode_answer(answer(old_line))[1] == b"ok"
        text = DAEMONSET.read_text().replace(f"env-{__version__}", f"env-{next_version}").replace(
            f"oci-gpu-hook:{__version__}", f"oci-gpu-hook:{next_version}")
        pod = yaml.safe_load(text)["spec"]["template"]["spec"]
        upgrade = Node(installed.base, installed.root, installed.podman, next_image)
        for container in pod["initContainers"]:
            done = upgrade.run(container)
            assert done.returncode == 0, f"{container['name']}: {done.stdout}{done.stderr}"
        (new_line,) = _version_lines(launcher_dir)
        assert new_line != old_line and f"oci-gpu-hook {next_version} ".encode() in new_line
        hook_py = (launcher_dir / "oci-gpu-hook.py").read_text()
        assert f"env-{next_version}/" in hook_py and f"env-{__version__}/" not in hook_py
        assert (installed.root / ENV_DIR.lstrip("/")).is_dir()  # the old environment: its running planner's
        refused = planner_module.encode_answer(old_line.decode(), "refused")
        assert answer(new_line) in (b"", refused)  # the old planner does not serve the new launchers
        # install again from the new image (a pod restart): nothing changes
        before = {p.name: p.read_bytes() for p in launcher_dir.iterdir() if p.is_file()}
        for container in pod["initContainers"]:
            assert upgrade.run(container).returncode == 0
        assert {p.name: p.read_bytes() for p in launcher_dir.iterdir() if p.is_file()} == before
    finally:
        for fd in fds:
            os.close(fd)
        old_planner.stop()


def test_uninstall_from_the_image_returns_the_node(installed: Node) -> None:
    """The install container with ``install --uninstall`` (no --set, --host-root: it reads the manifest) puts every
    file install wrote or changed back as it was; what is left is copy-environment's (the environments, which no
    install wrote) and the directories the DaemonSet's volumes made.  Run after the upgrade where it ran."""
    pod = yaml.safe_load(DAEMONSET.read_text())["spec"]["template"]["spec"]
    (installer,) = (c for c in pod["initContainers"] if c["name"] == "install")
    command = [*installer["command"][:installer["command"].index("install") + 1], "--uninstall"]
    done = installed.run({**installer, "command": command})
    assert done.returncode == 0, done.stdout + done.stderr
    after = {k: v for k, v in _files(installed.root).items()
             if not k.startswith(f"{LAUNCHER_DIR.lstrip('/')}/env-")}
    assert installed.pristine is not None
    assert sorted(after) == sorted(installed.pristine)
    assert [k for k in after if after[k] != installed.pristine[k]] == []
