"""The DaemonSet's containers run from the built image (image/build.sh) against a private node root.

Needs the image's archive: ``OCI_GPU_HOOK_IMAGE=image/out/oci-gpu-hook-VERSION.oci.tar`` (docs/image.md), and for
the upgrade's test ``OCI_GPU_HOOK_IMAGE_NEXT``, a newer version's; .ci/run builds both (image/build.sh --also) and
names them. Without them each test fails under ``CI=true``, and elsewhere skips with that line. podman loads the
archives into storage of its own (a temporary directory; the host's image store never changes), then runs the
DaemonSet's containers exactly as examples/kubernetes/daemonset.yaml and dra-daemonset.yaml write them (command,
env, security context, hostPID, hostNetwork, volume mounts: all read from the manifests), each volume's hostPath a
directory of a node tree in a temporary directory (the node's / is the tree, /sys the seed host's fake sysfs), with
a fake kubelet and a fake API server for the cluster. The tests run in order on one node: install, item 3's trust
(what the node runs is root's, none of it the image's), the pod's device plugin and planner, GPU containers through
the node's runtime launcher (the isolation probe), the pod's NRI plugin against the NRI runtime double, a pod
restart under them (the node tree compared by content, mode and owner), the DRA driver, the upgrade to the newer
image (old planner, old environment's removal) and uninstall. GPU containers and the launchers run on the host in
private mount namespaces (the node's launchers' directory at its real path); nothing of the host changes.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import subprocess
import sys
import time
import tomllib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from oci_gpu_hook import __version__
from oci_gpu_hook.install.containerd import RUNTIME_NAME
from oci_gpu_hook.serve import planner as planner_module
from oci_gpu_hook.serve.nri import api_pb2
from tests.conftest import need, unavailable
from tests.helpers import containerdlib as ctrd
from tests.helpers import containerlib as cl
from tests.helpers import nriruntime as nr
from tests.helpers.fakeapiserver import FakeApiServer
from tests.helpers.fakekubelet import FakeKubelet
from tests.helpers.installtrees import CONTAINERD_V2, containerd_binary, put

pytestmark = pytest.mark.containers
daemon = ctrd.daemon  # a private containerd 1.6, for the import

REPO = Path(__file__).resolve().parent.parent.parent
EXAMPLES = REPO / "examples" / "kubernetes"
DAEMONSET = EXAMPLES / "daemonset.yaml"
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


def _tree(root: Path, skip: tuple[str, ...] = ()) -> dict[str, tuple[object, ...]]:
    """Every entry under a node tree, by path: its kind, mode, owner and content (a file's SHA-256, a link's target;
    a socket or directory: none).  ``skip``: path prefixes left out."""
    found: dict[str, tuple[object, ...]] = {}
    for directory, dirs, names in os.walk(root):
        for name in [*dirs, *names]:
            path = Path(directory) / name
            key = str(path.relative_to(root))
            if key.startswith(skip):
                continue
            st = os.lstat(path)
            if stat.S_ISREG(st.st_mode):
                content: object = hashlib.sha256(path.read_bytes()).hexdigest()
            elif stat.S_ISLNK(st.st_mode):
                content = os.readlink(path)
            else:
                content = None
            found[key] = (stat.S_IFMT(st.st_mode), stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid, content)
    return found


def _differences(before: dict[str, tuple[object, ...]], after: dict[str, tuple[object, ...]]) -> list[str]:
    return [f"{k}: {before.get(k)} -> {after.get(k)}" for k in sorted(before.keys() | after.keys())
            if before.get(k) != after.get(k)]


def _pod(version: str = __version__, manifest: Path = DAEMONSET) -> dict[str, Any]:
    """The pod template of a manifest, as the DaemonSet of ``version``: every place that names this version (its
    image tag, the environment's path, the version copy-environment checks) names ``version``, as an upgrade does."""
    text = manifest.read_text().replace(__version__, version)
    return yaml.safe_load(text)["spec"]["template"]["spec"]  # type: ignore[no-any-return]


NODE_NAME = "seed"
SERVICE_ACCOUNT = "/var/run/secrets/kubernetes.io/serviceaccount"


@dataclass
class Node:
    base: Path
    root: Path
    podman: list[str]
    image: str
    pristine: dict[str, bytes] | None = None  # the node's files before anything ran
    pristine_tree: dict[str, tuple[object, ...]] | None = None
    api: tuple[str, Path] | None = None  # the API server's URL and a service account directory (token, ca.crt)

    def argv(self, pod: dict[str, Any], container: dict[str, Any], name: str | None = None) -> list[str]:
        """``podman run`` of one container of ``pod`` as the kubelet would start it on this node tree: its command,
        env, security context and volume mounts from the manifest, each hostPath a directory of the tree (the
        node's /sys: the seed host's sysfs); ``name``: detached, a long-running container of the pod."""
        volumes = {v["name"]: v["hostPath"]["path"] for v in pod["volumes"]}
        argv = [*self.podman, "run", *(["-d", "--name", name] if name else ["--rm"]),
                "--net=host" if pod.get("hostNetwork") else "--net=none", *_ulimits()]
        if pod.get("hostPID"):
            argv.append("--pid=host")
        security = container.get("securityContext") or {}
        if security.get("privileged"):
            argv.append("--privileged")
        if "ALL" in (security.get("capabilities") or {}).get("drop", []):
            argv += ["--cap-drop", "ALL"]
        for capability in (security.get("capabilities") or {}).get("add", []):
            argv += ["--cap-add", capability]
        if security.get("allowPrivilegeEscalation") is False:
            argv += ["--security-opt", "no-new-privileges"]
        for mount in container.get("volumeMounts", []):
            host = volumes[mount["name"]]
            source = cl.SEED_SYSFS if host == "/sys" else self.root / host.lstrip("/")
            source.mkdir(parents=True, exist_ok=True)
            argv += ["-v", f"{source}:{mount['mountPath']}:{'ro' if mount.get('readOnly') else 'rw'}"]
        for variable in container.get("env", []):
            if "value" in variable:
                value = variable["value"]
            else:  # the downward API: the one field the manifests use
                assert variable["valueFrom"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}, variable
                value = NODE_NAME
            argv += ["-e", f"{variable['name']}={value}"]
        if pod.get("serviceAccountName"):  # what the kubelet gives a pod of a service account
            assert self.api is not None, "no API server for a pod with a service account"
            url, account = self.api
            host, _, port = url.removeprefix("https://").rpartition(":")
            argv += ["-e", f"KUBERNETES_SERVICE_HOST={host}", "-e", f"KUBERNETES_SERVICE_PORT={port}",
                     "-v", f"{account}:{SERVICE_ACCOUNT}:ro"]
        return [*argv, "--entrypoint", container["command"][0], self.image, *container["command"][1:]]

    def run(self, container: dict[str, Any], pod: dict[str, Any] | None = None) -> subprocess.CompletedProcess[str]:
        """One container of the DaemonSet (an init container: it runs to its end)."""
        return subprocess.run(self.argv(pod or _pod(), container), capture_output=True, text=True, timeout=600,
                              check=False)

    def start_pod(self, pod: dict[str, Any], prefix: str) -> list[str]:
        """The pod as the kubelet starts it: each init container to its end, in order, then every container,
        detached (named ``prefix-NAME``).  Returns the containers' names."""
        for container in pod.get("initContainers", []):
            done = self.run(container, pod)
            assert done.returncode == 0, f"{container['name']}: {done.stdout}{done.stderr}"
        names = []
        for container in pod["containers"]:
            name = f"{prefix}-{container['name']}"
            done = subprocess.run(self.argv(pod, container, name), capture_output=True, text=True, timeout=300,
                                  check=False)
            assert done.returncode == 0, f"{container['name']}: {done.stdout}{done.stderr}"
            names.append(name)
        return names

    def logs(self, names: list[str]) -> str:
        logs = ""
        for name in names:
            done = subprocess.run([*self.podman, "logs", name], capture_output=True, text=True, timeout=60,
                                  check=False)
            logs += f"--- {name}\n{done.stdout}{done.stderr}"
        return logs

    def delete_pod(self, names: list[str]) -> str:
        """Delete the pod's containers as the kubelet does (SIGTERM, SIGKILL after the grace period); their logs."""
        logs = self.logs(names)
        for name in names:
            subprocess.run([*self.podman, "stop", "-t", "10", name], capture_output=True, timeout=120, check=False)
            subprocess.run([*self.podman, "rm", "-f", name], capture_output=True, timeout=120, check=False)
        return logs

    def running(self, name: str) -> bool:
        done = subprocess.run([*self.podman, "inspect", "-f", "{{.State.Running}}", name], capture_output=True,
                              text=True, timeout=60, check=False)
        return done.stdout.strip() == "true"


def _limits() -> dict[str, int]:
    """The open-file and process limits of the DaemonSet's containers here and of the fronts that ask their planner
    (containerd gives a container the shim's limits, and the node's launchers run under the shim too).  The planner
    takes each asking front's limits, which it cannot raise past its own where it lacks CAP_SYS_RESOURCE of the
    machine (this machine runs in a user namespace: a privileged container cannot); podman's default (nofile
    1048576) is more than this machine allows, and its runc sets no nproc above 32768 here."""
    import resource

    return {"n": min(resource.getrlimit(resource.RLIMIT_NOFILE)[1], 1048576),
            "p": min(resource.getrlimit(resource.RLIMIT_NPROC)[1], 32768)}  # dash's ulimit -p: processes


def _ulimits() -> list[str]:
    limits = _limits()
    return ["--ulimit", f"nofile={limits['n']}:{limits['n']}", "--ulimit", f"nproc={limits['p']}:{limits['p']}"]


def _limited() -> str:
    """Shell words (dash's) that set the shell's limits to the containers' (``_limits``)."""
    return " && ".join(f"ulimit -{flag} {value}" for flag, value in _limits().items())


def _until(condition: Callable[[], object], what: str, timeout: float = 120) -> None:
    """Wait for a condition (a container starting up); fail with ``what`` if it does not come."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} did not happen in {timeout} s")
        time.sleep(0.2)


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Node]:
    archive = os.environ.get("OCI_GPU_HOOK_IMAGE")
    if not archive:
        unavailable("OCI_GPU_HOOK_IMAGE is not set: build the image (image/build.sh, docs/image.md), name its archive")
    need("podman", "runc", "busybox", "flock")
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
    for directory in ("var/lib/kubelet/device-plugins", "var/lib/kubelet/plugins_registry"):  # the kubelet's
        (root / directory).mkdir(parents=True)
    os.chmod(root, 0o755)
    yield Node(base, root, podman, image, _files(root), _tree(root))
    subprocess.run([*podman, "rm", "-af", "-t", "5"], capture_output=True, timeout=300, check=False)
    subprocess.run([*podman, "rmi", "-af"], capture_output=True, timeout=300, check=False)


@pytest.fixture(scope="module")
def installed(node: Node) -> Node:
    pod = _pod()
    for container in pod["initContainers"]:  # copy-environment, install, remove-old-environments, in order
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
    check = ("import json, sys, oci_gpu_hook.entry.cli, oci_gpu_hook.cluster.deviceplugin.server, ssl, ctypes, yaml, "
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
    """A pod restart: the init containers run again; every entry on the node is as it was (content, mode, owner),
    but install's journal, which records each run (var/lib/oci-gpu-hook/journal.d)."""
    before = _tree(installed.root, JOURNAL)
    for container in _pod()["initContainers"]:
        done = installed.run(container)
        assert done.returncode == 0, f"{container['name']}: {done.stdout}{done.stderr}"
    assert _differences(before, _tree(installed.root, JOURNAL)) == []


# --- the pod's containers from the image, a GPU container through what install wrote ------------------------------

JOURNAL = ("var/lib/oci-gpu-hook/journal.d",)
PLANNER_LEFT = ("run/oci-gpu-hook/planner.sock.lock", "run/oci-gpu-hook/warm")  # serve's, after it stopped
BY_PATH_LEFT = "run/oci-gpu-hook/by-path"  # the GPU containers' by-path directories (bypath.py: none is removed)
PLANNER_AT = "/usr/local/oci-gpu-hook-planner"  # the node's /run/oci-gpu-hook, on the host (a trusted path)
# The node's launchers and planner, asked for a GPU container, prepare its by-path directory under by_path_dir
# (the node's /run/oci-gpu-hook/by-path): here the node's, as the planner's socket is, never the host's.
GPU_ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "OCI_GPU_HOOK_SYSFS_ROOT": str(cl.SEED_SYSFS),
           "OCI_GPU_HOOK_PLANNER_SOCKET": f"{PLANNER_AT}/planner.sock",
           "OCI_GPU_HOOK_BY_PATH_DIR": f"{PLANNER_AT}/by-path"}
SEED_IDS = [f"0000:{bus}:00.0" for bus in cl.SEED_PCI]


# a request as a front of a version line sends it (argv: socket, line); the answer on stdout (b'': none)
ASK = ("import sys\nfrom pathlib import Path\nfrom tests.helpers import plannerlib\n"
       "data = plannerlib.request_bytes(sys.argv[2], 'oci-gpu-hook', '/x', ['precreate'], ['PATH=/bin'], b'{}')\n"
       "fds = plannerlib.namespace_fds()\n"
       "try:\n    answer = plannerlib.ask(Path(sys.argv[1]), data, fds)\n"
       "except (BrokenPipeError, ConnectionError, FileNotFoundError):\n    answer = b''\n"
       "sys.stdout.buffer.write(answer)\n")


def _ok(answer: bytes) -> bool:
    """The planner served the request (b'': no planner answered)."""
    return answer != b"" and planner_module.decode_answer(answer)[1] == b"ok"


@dataclass
class Running:
    """What runs on the module's node: the DaemonSet's pod (its containers' names), its version, and the GPU
    containers started through the node's launchers (ids, in the node's runc root), with their GPUs."""
    node: Node
    kubelet: FakeKubelet
    rootfs: Path
    version: str = __version__
    pod: list[str] | None = None
    gpu: dict[str, list[int]] | None = None
    starts: int = 0

    @property
    def runc_root(self) -> Path:
        return self.node.base / "runc"

    def on_node(self, argv: list[str], *, own_run: bool = False) -> list[str]:
        """``argv`` on the host, in a private mount namespace with the node's launcher directory at its real path
        and the node's /run/oci-gpu-hook (the planner's socket, the by-path directories: GPU_ENV) at PLANNER_AT (a
        path the front trusts: root's all the way up); ``own_run``: at its real path too, on a /run of its own (a
        tmpfs: the host's /run is not seen), for a runc that mounts what a runtime's NRI plugin prepared there."""
        launcher_dir = self.node.root / LAUNCHER_DIR.lstrip("/")
        planner_dir = self.node.root / "run/oci-gpu-hook"
        run = (f"mount -t tmpfs -o mode=755 tmpfs /run && mkdir /run/oci-gpu-hook && "
               f"mount --bind {planner_dir} /run/oci-gpu-hook && ") if own_run else ""
        script = (f"{_limited()} && mount -t tmpfs -o mode=755 tmpfs /usr/local && "
                  f"mkdir -p {LAUNCHER_DIR} {PLANNER_AT} && "
                  f"mount --bind {launcher_dir} {LAUNCHER_DIR} && mount --bind {planner_dir} {PLANNER_AT} && "
                  f'{run}exec "$@"')
        return ["unshare", "-m", "sh", "-c", script, "sh", *argv]

    def allocate(self, ids: list[str]) -> dict[str, str]:
        """The device plugin's Allocate answer for ``ids``: the container annotations containerd's CRI passes."""
        (answer,) = self.kubelet.allocate("amd.com/gpu", ids).container_responses
        annotations = dict(answer.annotations)
        assert list(annotations) == ["cdi.k8s.io/oci-gpu-hook_gpu"], annotations
        return annotations

    def gpu_container(self, ids: list[str], *, detach: bool) -> tuple[str, subprocess.CompletedProcess[str]]:
        """A container the node's runtime launcher (what install wrote, as containerd's shim runs it) starts with
        the Allocate answer for ``ids``: the probe (``detach``: ``sleep``, probed later by ``probe``)."""
        cid = cl.container_id()
        bundle = cl.make_bundle(self.node.base / "bundles" / cid, self.rootfs, [],
                                args=["/bin/sleep", "100000"] if detach else None)
        annotations = self.allocate(ids)
        cl.edit_spec(bundle, lambda spec: spec.setdefault("annotations", {}).update(annotations))
        runtime = f"{LAUNCHER_DIR}/oci-gpu-runtime"
        argv = self.on_node([runtime, "--root", str(self.runc_root), "run", *(["-d"] if detach else []), "--bundle",
                             str(bundle), cid])
        if detach:  # the container keeps runc's stdio: a file, not a pipe this call would wait on
            out = self.node.base / f"{cid}.out"
            with open(out, "w") as handle:
                code = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=handle, stderr=handle, env=GPU_ENV,
                                      timeout=120, check=False).returncode
            return cid, subprocess.CompletedProcess(argv, code, out.read_text(), "")
        return cid, cl.run(argv, env=GPU_ENV)

    def probe(self, cid: str) -> str:
        """The isolation probe, run inside a running GPU container (runc exec: the container's cgroup and
        capabilities)."""
        again = "/bin/busybox rm -f /tmp/p* /tmp/kfd; exec /bin/sh /probe.sh"  # the nodes of the last probe go
        done = cl.run(["runc", "--root", str(self.runc_root), "exec", cid, "/bin/sh", "-c", again])
        assert done.returncode == 0, done.stderr
        return done.stdout

    def keep_their_devices(self) -> None:
        for cid, gpus in (self.gpu or {}).items():
            cl.assert_isolated(self.probe(cid), gpus)

    def ask_planner(self, line: bytes) -> bytes:
        """The node's planner's answer to a request of a launcher of the version line ``line`` (b'': none), asked by
        a process with the fronts' limits (``_limits``)."""
        socket_path = self.node.root / "run/oci-gpu-hook/planner.sock"
        done = subprocess.run(["sh", "-c", f'{_limited()} && "$@"; exit $?', "sh", sys.executable, "-c", ASK,
                               str(socket_path), line.decode()], capture_output=True, timeout=120, cwd=REPO,
                              check=False)
        assert done.returncode == 0, done.stderr
        return done.stdout

    def start(self, pod: dict[str, Any], *, init: bool = True) -> None:
        """The DaemonSet's pod (``init``: its init containers first), until the device plugin advertises the
        seed host's 8 GPUs and the planner answers the launchers' version line."""
        spec = pod if init else {**pod, "initContainers": []}
        self.starts += 1
        registered = len(self.kubelet.registrations)
        self.pod = self.node.start_pod(spec, f"pod-{self.starts}")
        self.kubelet.wait(lambda: len(self.kubelet.registrations) > registered, 120, "the device plugin registering")
        self.kubelet.devices("amd.com/gpu", lambda d: len(d) == 8, timeout=120)
        (line,) = _version_lines(self.node.root / LAUNCHER_DIR.lstrip("/"))
        try:
            _until(lambda: _ok(self.ask_planner(line)), "the planner answering")
        except AssertionError as err:
            raise AssertionError(f"{err}; last answer {self.ask_planner(line)!r}; the pod's logs:\n"
                                 f"{self.node.logs(self.pod)}") from None

    def delete(self) -> str:
        logs = self.node.delete_pod(self.pod or [])
        self.pod = None
        return logs


@pytest.fixture(scope="module")
def running(installed: Node) -> Iterator[Running]:
    """The DaemonSet's containers (device plugin, planner) from the image on the node, behind a fake kubelet."""
    kubelet = FakeKubelet(str(installed.root / "var/lib/kubelet/device-plugins"))
    kubelet.start()
    state = Running(installed, kubelet, cl.make_rootfs(installed.base / "rootfs"), gpu={})
    try:
        state.start(_pod(), init=False)  # the init containers ran (installed)
        yield state
    finally:
        for cid in state.gpu or {}:
            cl.run(["runc", "--root", str(state.runc_root), "kill", cid, "KILL"])
            cl.run(["runc", "--root", str(state.runc_root), "delete", "-f", cid])
        if state.pod:
            state.delete()
        kubelet.stop()


def test_the_pods_containers_run_from_the_image(running: Running) -> None:
    """The device plugin (unprivileged, no capabilities) registers at the kubelet and advertises the seed host's
    GPUs; the planner (``serve`` through the launcher install wrote) answers the node's launchers from a directory
    root's alone."""
    devices = running.kubelet.devices("amd.com/gpu", lambda d: len(d) == 8)
    assert sorted(devices) == SEED_IDS
    assert all(running.node.running(name) for name in running.pod or []), running.pod
    planner_dir = (running.node.root / "run/oci-gpu-hook").stat()
    assert planner_dir.st_uid == 0 and stat.S_IMODE(planner_dir.st_mode) == 0o700
    # the planner holds its environment's lock (remove-old-environments leaves the environment alone)
    lock = running.node.root / LAUNCHER_DIR.lstrip("/") / f".in-use-{os.path.basename(ENV_DIR)}"
    done = subprocess.run(["flock", "-n", "-x", str(lock), "true"], capture_output=True, timeout=30, check=False)
    assert done.returncode == 1, "nothing holds the environment's lock while the planner runs"


@pytest.mark.parametrize(("ids", "gpus"), [([SEED_IDS[2]], [2]), ([SEED_IDS[6], SEED_IDS[0]], [0, 6])],
                         ids=["one", "two"])
def test_a_gpu_container_through_what_install_wrote_gets_exactly_its_gpus(running: Running, ids: list[str],
                                                                         gpus: list[int]) -> None:
    """The device plugin's Allocate answer, as containerd's CRI passes it (the container's annotations), and the
    node's runtime launcher (the prebuilt front, the planner or the copied environment's Python, runc): the
    isolation probe sees exactly the allocated GPUs.  The container keeps running (the next tests restart and
    upgrade the DaemonSet under it); the spec runc runs names nothing of the image or of one environment."""
    cid, done = running.gpu_container(ids, detach=True)
    assert done.returncode == 0, done.stdout
    assert running.gpu is not None
    running.gpu[cid] = gpus
    cl.assert_isolated(running.probe(cid), gpus)
    assert any((running.node.root / BY_PATH_LEFT).iterdir())  # its by-path directory: the node's (GPU_ENV)
    state = (running.runc_root / cid / "state.json").read_text()
    assert IMAGE_ONLY not in state and "/env-" not in state  # hooks: the launchers' paths, no environment's


NRI_SOCKET = "var/run/nri/nri.sock"  # the node's (the manifest's nri volume)
NRI_POD = api_pb2.PodSandbox(id="pod-image", name="gpu-pod", namespace="default", uid="1111-2222")


def test_the_nri_plugin_runs_from_the_image(running: Running) -> None:
    """The pod's nri container (``nri`` through the launcher install wrote): while the node has no NRI socket it
    waits, running, and says so; then it registers with the runtime's (the NRI double, tests/helpers/nriruntime.py,
    at the node's socket) and answers CreateContainer by the node's settings.  A container with the device plugin's
    Allocate answer as its annotations gets exactly its GPUs and their by-path links (the adjustment applied as
    containerd applies it, then runc, the isolation probe), from a by-path directory of the node's; one that asks by
    env gets nothing (the DaemonSet's install turns env requests off), nor does one that asks for nothing.  With
    the runtime's socket closed, the plugin exits (the kubelet starts it again)."""
    node = running.node
    (name,) = [n for n in running.pod or [] if n.endswith("-nri")]
    assert node.running(name), node.logs([name])
    assert "waiting for one" in node.logs([name])
    socket_path = node.root / NRI_SOCKET
    double = nr.NRIRuntime(socket_path)
    try:
        plugin = double.accept()
        assert (plugin.name, plugin.idx) == ("oci-gpu-hook", "10")
        cases = [([], running.allocate([SEED_IDS[3]]), [3]), (["AMD_VISIBLE_DEVICES=1"], {}, []), ([], {}, [])]
        for env, annotations, gpus in cases:
            cid = cl.container_id()
            bundle = cl.make_bundle(node.base / "bundles" / cid, running.rootfs, env)
            spec = json.loads((bundle / "config.json").read_text())
            spec["annotations"] = dict(annotations)
            before = json.loads(json.dumps(spec))
            nr.apply_adjustment(spec, double.create_container(NRI_POD, nr.container_of(spec, cid,
                                                                                         annotations=annotations)))
            (bundle / "config.json").write_text(json.dumps(spec))
            by_path = [m["source"] for m in spec["mounts"] if m["destination"] == "/dev/dri/by-path"]
            assert (spec == before) == (not gpus), (env, annotations, spec)
            if gpus:
                (source,) = by_path
                assert source.startswith("/run/oci-gpu-hook/by-path/"), source
                assert (node.root / source.lstrip("/")).is_dir(), source  # the node's, as the runtime mounts it
            done = cl.run(running.on_node(["runc", "--root", str(running.runc_root), "run", "--bundle", str(bundle),
                                           cid], own_run=True))
            assert done.returncode == 0, done.stderr
            result = cl.assert_isolated(done.stdout, gpus)
            assert result.links == cl.expected_links(gpus)
    finally:
        double.close()
        socket_path.unlink(missing_ok=True)
    _until(lambda: not node.running(name), "the plugin's exit after the runtime closed its socket")
    assert "Traceback" not in node.logs([name])


def test_deleting_and_starting_the_pod_again_changes_nothing(running: Running) -> None:
    """The DaemonSet's pod deleted (its containers stopped as the kubelet stops them) and started again, init
    containers and all, with GPU containers running: every entry on the node is as it was (content, mode, owner;
    install's journal aside), and the running GPU containers keep exactly their devices."""
    assert running.gpu, "no GPU container runs (the test before)"
    before = _tree(running.node.root, JOURNAL)
    running.delete()
    running.keep_their_devices()
    running.start(_pod(running.version))
    assert _differences(before, _tree(running.node.root, JOURNAL)) == []
    running.keep_their_devices()


def test_the_dra_driver_runs_from_the_image(running: Running) -> None:
    """dra-daemonset.yaml's container from the image, with the fake API server as the cluster's (its service
    account: token, CA): it publishes the seed host's GPUs as a ResourceSlice of the node, registers at the kubelet
    (the fake one, in a private mount namespace where the node's /var/lib/kubelet is the real path) and prepares a
    claim as a CDI spec under the node's /var/run/cdi whose hooks are the node's launchers: podman with that spec
    gets exactly the claim's GPUs."""
    node = running.node
    api = FakeApiServer(node.base)
    account = node.base / "serviceaccount"
    account.mkdir(exist_ok=True)
    (account / "token").write_text(api.token_file.read_text())
    (account / "ca.crt").write_bytes(api.cert.read_bytes())
    dra = Node(node.base, node.root, node.podman, f"localhost/oci-gpu-hook:{running.version}", api=(api.url, account))
    names: list[str] = []
    try:
        names = dra.start_pod(_pod(running.version, EXAMPLES / "dra-daemonset.yaml"), "dra")
        _until(api.slices, "a ResourceSlice published")
        (published,) = api.slices()
        assert published["spec"]["nodeName"] == NODE_NAME and len(published["spec"]["devices"]) == 8, published
        uid = "uid-image"
        device = "gpu-0000-" + SEED_IDS[5].split(":")[1] + "-00-0"
        api.add_claim("default", uid, uid, [{"request": "gpus", "driver": DRA_DRIVER, "pool": NODE_NAME,
                                             "device": device}])
        prepare = ("import json, sys\nfrom tests.helpers.fakedrakubelet import FakeDraKubelet\n"
                   "kubelet = FakeDraKubelet('/var/lib/kubelet/plugins_registry')\nkubelet.discover()\n"
                   "answer = kubelet.prepare(('default', sys.argv[1], sys.argv[1])).claims[sys.argv[1]]\n"
                   "print(json.dumps([answer.error, [n for d in answer.devices for n in d.cdi_device_ids]]))\n"
                   "kubelet.close()\n")
        script = (f"mount -t tmpfs -o mode=755 tmpfs /var/lib && mkdir /var/lib/kubelet && "
                  f"mount --bind {node.root}/var/lib/kubelet /var/lib/kubelet && cd {REPO} && "
                  f'exec {sys.executable} -c "$1" {uid}')
        done = cl.run(["unshare", "-m", "sh", "-c", script, "sh", prepare], timeout=120)
        assert done.returncode == 0, done.stderr
        error, prepared = json.loads(done.stdout)
        assert error == "" and prepared == [f"k8s.{DRA_DRIVER}/claim={uid}-{device}"], done.stdout
        spec_text = (node.root / f"var/run/cdi/k8s.{DRA_DRIVER}-claim_{uid}.json").read_text()
        assert IMAGE_ONLY not in spec_text and f"{LAUNCHER_DIR}/oci-gpu-hook" in spec_text, spec_text
        argv = [*cl.PODMAN, "--runtime=runc", f"--hooks-dir={node.base}/no-hooks", *cl.PODMAN_RUN,
                "--device", prepared[0], "--rootfs", str(running.rootfs), "/bin/sh", "/probe.sh"]
        done = cl.run(running.on_node(cl.private_cdi(argv, node.root / "var/run/cdi")), env=GPU_ENV)
        assert done.returncode == 0, done.stderr
        cl.assert_isolated(done.stdout, [5])
    finally:
        logs = dra.delete_pod(names)
        api.close()
        for name in os.listdir(node.root / "var/run/cdi"):  # the claim's spec (the kubelet would unprepare it)
            if name.startswith(f"k8s.{DRA_DRIVER}-claim_"):
                os.unlink(node.root / "var/run/cdi" / name)
    assert "Traceback" not in logs, logs


DRA_DRIVER = "gpu.oci-gpu-hook.io"


# --- the item-3 trust: what the node runs -------------------------------------------------------------------------

def _code_paths(root: Path) -> set[str]:
    """The absolute paths under the launchers' directory that what install wrote (the launchers, the containerd
    drop-in, the CDI specs) names: what runs on the node at a container's start."""
    named: set[str] = set()
    written = [p for p in (root / LAUNCHER_DIR.lstrip("/")).iterdir() if p.is_file()]
    written += [root / "etc/containerd/conf.d/oci-gpu-hook.toml", *sorted((root / "var/run/cdi").glob("*.json"))]
    for path in written:
        data = path.read_bytes()
        assert IMAGE_ONLY.encode() not in data, path
        named |= {s.rstrip(".:;") for s in _strings(data) if s.startswith(LAUNCHER_DIR)}
    return named


def _resolve_in(root: Path, path: str) -> Path:
    """``path`` as the node resolves it, with ``root`` as its /: each link's target (absolute: from the node's /)
    followed inside the tree, never out of it."""
    parts, done, hops = [p for p in path.split("/") if p], root, 0
    while parts:
        part = parts.pop(0)
        if part == "..":
            done = done.parent if done != root else root
            continue
        step = done / part
        if step.is_symlink():
            hops += 1
            assert hops < 40, path
            target = os.readlink(step)
            parts = [p for p in target.split("/") if p] + parts
            if target.startswith("/"):
                done = root
            continue
        done = step
    return done


def test_what_install_wrote_runs_only_root_owned_files_of_the_node(installed: Node) -> None:
    """Item 3: every path under the launchers' directory named by what install wrote (from the image) exists on the
    node, in directories root's all the way up from the node's /, none writable by group or others (a link's target
    too); and every file of the copied environment those paths run is root's and not writable by others."""
    root = installed.root
    named = _code_paths(root)
    assert f"{LAUNCHER_DIR}/oci-gpu-runtime" in named or (root / LAUNCHER_DIR.lstrip("/") / "oci-gpu-runtime").exists()
    assert any(n.startswith(f"{ENV_DIR}/") for n in named), named
    for real in sorted(named):
        path = root / real.lstrip("/")
        assert os.path.lexists(path), real
        resolved = _resolve_in(root, real)
        assert resolved.exists(), (real, resolved)
        for part in [resolved, *resolved.parents]:
            if not part.is_relative_to(root):
                break
            st = os.lstat(part)
            assert st.st_uid == 0 and not st.st_mode & 0o022, (real, str(part), oct(st.st_mode), st.st_uid)
    for directory, dirs, files in os.walk(root / ENV_DIR.lstrip("/")):
        for name in [*dirs, *files]:
            st = os.lstat(Path(directory) / name)
            if not stat.S_ISLNK(st.st_mode):
                assert st.st_uid == 0 and not st.st_mode & 0o022, (directory, name, oct(st.st_mode))


def _version_lines(launcher_dir: Path) -> set[bytes]:
    """The planner version lines the node's launchers carry."""
    import re

    return {m for p in launcher_dir.iterdir() if p.is_file()
            for m in re.findall(rb"oci-gpu-hook [0-9][^ \0]* planner/[0-9]+ [0-9a-f]{24}", p.read_bytes())}


def test_upgrade_from_a_newer_image(running: Running) -> None:
    """Item 4: the DaemonSet of a newer image (OCI_GPU_HOOK_IMAGE_NEXT: this commit built as another version,
    docs/image.md) over this one, with GPU containers running.  First the new pod's init containers while the old
    pod still runs (a surge): the launchers are rewritten to name the new environment, the old planner refuses their
    version line (a GPU container started meanwhile gets its GPU through Python), the old environment stays (its
    planner holds it).  Then the old pod goes and the new one's containers start: the new planner answers, the old
    line gets no answer, a new GPU container gets exactly its GPU.  Then the new pod restarts: the old environment,
    which nothing names or holds now, is removed, and no launcher, spec or config is written again.  The running
    GPU containers keep their devices throughout."""
    archive = os.environ.get("OCI_GPU_HOOK_IMAGE_NEXT")
    if not archive:
        unavailable("OCI_GPU_HOOK_IMAGE_NEXT is not set: build a newer version's image (docs/image.md), name it")
    node = running.node
    done = subprocess.run([*node.podman, "load", "-i", archive], capture_output=True, text=True, timeout=600,
                          check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    (next_image,) = {w for w in done.stdout.split() if w.startswith("localhost/oci-gpu-hook:")} - {node.image}
    next_version = next_image.rpartition(":")[2]
    assert running.gpu, "no GPU container runs (the tests before)"
    launcher_dir = node.root / LAUNCHER_DIR.lstrip("/")
    old_env, new_env = node.root / ENV_DIR.lstrip("/"), launcher_dir / f"env-{next_version}"
    (old_line,) = _version_lines(launcher_dir)
    assert _ok(running.ask_planner(old_line))

    new_pod = _pod(next_version)
    upgrade = Node(node.base, node.root, node.podman, next_image)
    outputs = {}
    for container in new_pod["initContainers"]:  # the old pod still runs
        done = upgrade.run(container, new_pod)
        assert done.returncode == 0, f"{container['name']}: {done.stdout}{done.stderr}"
        outputs[container["name"]] = done.stdout
    (new_line,) = _version_lines(launcher_dir)
    assert new_line != old_line and f"oci-gpu-hook {next_version} ".encode() in new_line
    hook_py = (launcher_dir / "oci-gpu-hook.py").read_text()
    assert f"env-{next_version}/" in hook_py and f"env-{__version__}/" not in hook_py
    kept = f"kept env-{__version__}: a process runs from it"  # the old planner: its maps, seen with hostPID
    assert old_env.is_dir() and kept in outputs["remove-old-environments"], outputs
    refused = planner_module.encode_answer(old_line.decode(), "refused")
    assert running.ask_planner(new_line) in (b"", refused)  # the old planner does not serve the new launchers
    _cid, done = running.gpu_container([SEED_IDS[1]], detach=False)  # so the new front starts Python: a new GPU
    assert done.returncode == 0, done.stderr                          # container gets its GPU meanwhile
    cl.assert_isolated(done.stdout, [1])
    running.keep_their_devices()
    written = _written(node.root)

    logs = running.delete()  # the old pod goes (its planner with it); the new pod's containers start
    running.keep_their_devices()
    node.image, running.version = next_image, next_version
    running.start(new_pod, init=False)
    assert _ok(running.ask_planner(new_line))
    assert running.ask_planner(old_line) in (b"", planner_module.encode_answer(new_line.decode(), "refused"))
    _cid, done = running.gpu_container([SEED_IDS[4]], detach=False)
    assert done.returncode == 0, done.stderr
    cl.assert_isolated(done.stdout, [4])
    running.keep_their_devices()

    running.delete()  # the new pod restarts: the old environment is removed now, nothing is written again
    running.start(new_pod)
    assert not old_env.exists() and new_env.is_dir(), sorted(os.listdir(launcher_dir))
    assert not [n for n in os.listdir(launcher_dir) if n.startswith(".removing-")]
    assert _written(node.root) == written
    running.keep_their_devices()
    assert "Traceback" not in logs, logs


def _written(root: Path) -> dict[str, tuple[int, int, bytes]]:
    """What install writes (launchers, drop-in, main config, CDI specs): inode, mtime, bytes (a rewrite of the same
    bytes shows as a new inode or mtime)."""
    # (not the planners' locks beside the environments, .in-use-env-VERSION: the pods' own, not install's)
    paths = [p for p in (root / LAUNCHER_DIR.lstrip("/")).iterdir()
             if p.is_file() and not p.name.startswith(".in-use-")]
    paths += [root / "etc/containerd/conf.d/oci-gpu-hook.toml", root / "etc/containerd/config.toml",
              *sorted((root / "var/run/cdi").glob("*.json"))]
    return {str(p.relative_to(root)): (p.stat().st_ino, p.stat().st_mtime_ns, p.read_bytes()) for p in paths}


def test_uninstall_from_the_image_returns_the_node(running: Running) -> None:
    """The DaemonSet deleted, then its install container (of the version the node runs now) with
    ``install --uninstall`` (no --set, --host-root: it reads the manifest): every entry on the node is as it was
    before anything ran (content, mode, owner), but the directories the DaemonSet's volumes made (the kubelet's
    DirectoryOrCreate), the kubelet's own directory, and the copied environment of that version, whose pod ran last
    (remove it with the DaemonSet: docs/image.md).  Run last."""
    node = running.node
    running.delete()
    pod = _pod(running.version)
    (installer,) = (c for c in pod["initContainers"] if c["name"] == "install")
    command = [*installer["command"][:installer["command"].index("install") + 1], "--uninstall"]
    done = node.run({**installer, "command": command}, pod)
    assert done.returncode == 0, done.stdout + done.stderr
    volumes = {v["hostPath"]["path"].strip("/") for v in pod["volumes"]}
    made = {str(Path(v).parents[i]) for v in volumes for i in range(len(Path(v).parts) - 1)} | volumes

    def compared(tree: dict[str, tuple[object, ...]]) -> dict[str, tuple[object, ...]]:
        return {k: v for k, v in tree.items() if not (k in made and v[0] == stat.S_IFDIR)}

    last = f"{LAUNCHER_DIR.lstrip('/')}/env-{running.version}"  # the last environment and its lock stay (docs/image.md)
    after = compared(_tree(node.root, (last, f"{LAUNCHER_DIR.lstrip('/')}/.in-use-env-{running.version}",
                                       "var/lib/kubelet/")))
    assert node.pristine_tree is not None
    pristine = compared({k: v for k, v in node.pristine_tree.items() if not k.startswith("var/lib/kubelet/")})
    # what the stopped planner leaves in its runtime directory, and the by-path directories the GPU containers got
    # (a tmpfs on a node: gone at the next boot)
    left = {k for k in after.keys() - pristine.keys() if k.startswith((*PLANNER_LEFT, BY_PATH_LEFT))}
    planner_left = {k for k in left if not k.startswith(BY_PATH_LEFT)}
    assert planner_left <= {f"{d}" for d in PLANNER_LEFT} | {f"{PLANNER_LEFT[1]}/config.toml"}, left
    by_path = {k: after[k] for k in left - planner_left}
    assert by_path and all(kind == stat.S_IFDIR or (kind == stat.S_IFLNK and str(target).startswith("../"))
                           for kind, _mode, _uid, _gid, target in by_path.values()), by_path
    assert _differences(pristine, {k: v for k, v in after.items() if k not in left}) == []
