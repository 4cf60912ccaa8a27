"""Whether this node runs a kubelet, and what env requests mean here then (``validate``, ``inspect``).

Where a kubelet runs, pods reach the runtime, and a pod's env comes from its spec and its image: an env request
(``AMD_VISIBLE_DEVICES=all``, every CUDA image's ``NVIDIA_VISIBLE_DEVICES=all``) would give a pod every GPU of the
node, whatever the scheduler gave it.  ``install`` bakes ``allow_env_requests`` off wherever it writes what pods
reach (:func:`oci_gpu_hook.install.launchers.for_pods`); this module is how the operator commands see a node where that
did not happen (an explicit ``--set``, launchers written by hand, a kubelet added after install).

**The rule** (docs/security.md): a node runs a kubelet when, under ``root``, one of :data:`KUBELET_DIRS` is a
directory (the kubelet's ``--root-dir``, which it makes at its first start and which holds its pods' volumes and
the device plugins' sockets: ``/var/lib/kubelet``, k3s's and RKE2's too; MicroK8s's under its snap), or a process
of :data:`KUBELET_PROCESSES` runs (read from ``proc``: a kubelet with another root directory).
"""

from __future__ import annotations

import os

TYPE_CHECKING = False  # not typing's: see oci_gpu_hook/startpath.py

if TYPE_CHECKING:
    from oci_gpu_hook.config import Config

KUBELET_DIRS = ("/var/lib/kubelet", "/var/snap/microk8s/common/var/lib/kubelet")
# the comm (first 15 bytes of the executable's name) of a process that is a kubelet, or holds one (k3s, MicroK8s)
KUBELET_PROCESSES = ("kubelet", "kubelite", "k3s-server", "k3s-agent")


def kubelet_evidence(root: str = "/", proc: str = "/proc") -> str | None:
    """What says a kubelet runs on this node (the rule above), in words; None when nothing does."""
    for directory in KUBELET_DIRS:
        if os.path.isdir(os.path.join(root, directory.lstrip("/"))):
            return f"{directory} is there"
    try:
        pids = [p for p in os.listdir(proc) if p.isdigit()]
    except OSError:
        return None
    for pid in pids:
        try:
            with open(os.path.join(proc, pid, "comm"), "rb") as handle:
                comm = handle.read(64).decode("utf-8", "replace").strip()
        except OSError:
            continue  # gone meanwhile
        if comm in KUBELET_PROCESSES:
            return f"process {pid} is {comm}"
    return None


def launcher_config(directory: str) -> tuple[Config, str]:
    """The settings a container start through the launchers in ``directory`` gets (the config file and their baked
    defaults, :func:`oci_gpu_hook.install.launchers.baked_defaults`), and where they come from, in words; without
    launchers there, the config file's alone.  A HookError where they cannot be loaded."""
    from oci_gpu_hook.config import load_config
    from oci_gpu_hook.install.launchers import baked_defaults

    baked = baked_defaults(directory)
    if baked is None:
        return load_config({}), f"no launchers in {directory}: the config file's"
    return load_config(baked), f"the launchers in {directory}"


def env_requests_line(root: str = "/", proc: str = "/proc", directory: str | None = None) -> str | None:
    """The line ``validate`` (and ``inspect``) print about env requests on a node that runs a kubelet: a warning
    where they are on, ``ok`` where off; None where no kubelet runs (or the settings cannot be loaded: ``validate``
    says why)."""
    from oci_gpu_hook.errors import HookError
    from oci_gpu_hook.install.paths import LAUNCHER_DIR

    evidence = kubelet_evidence(root, proc)
    if evidence is None:
        return None
    try:
        config, whose = launcher_config(directory or LAUNCHER_DIR)
    except HookError:
        return None
    from oci_gpu_hook.config import FIELDS

    var = FIELDS["allow_env_requests"].env
    names = ", ".join(sorted({n for k in config.backends for n in config.request_env[k]}))
    if config.allow_env_requests:
        return (f"warning: env requests are on ({whose}) on a node that runs a kubelet ({evidence}): a pod whose image "
                f"or spec sets one of {names} (every CUDA image sets NVIDIA_VISIBLE_DEVICES=all) gets those GPUs, "
                f"whatever the scheduler gave it; bake them off: oci-gpu-hook install --set {var}=false "
                "(docs/security.md)")
    return (f"ok: env requests are off ({whose}) on this node, which runs a kubelet ({evidence}): only the "
            "orchestrator's cdi.k8s.io annotations and CDI names grant GPUs")
