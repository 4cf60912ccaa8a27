"""The ``/dev/char/MAJ:MIN`` links udev makes, for every device node this tool can grant, where they are missing.

Why: runc's systemd cgroup driver (containerd's ``SystemdCgroup = true``, ``runc --systemd-cgroup``, podman under
systemd) hands each device rule of a container to systemd as ``DeviceAllow=/dev/char/MAJ:MIN``, and leaves out
(``skipping device /dev/char/226:128 for systemd``) every rule for which neither ``/dev/char/MAJ:MIN`` nor
``/sys/dev/char/MAJ:MIN`` exists (runc 1.1 ``generateDeviceProperties``).  The container starts with its GPU all
the same (runc writes the cgroup itself), but the next ``systemctl daemon-reload`` makes systemd apply the unit's
own list, and the GPU is gone from a running container.  udev makes the links on an ordinary host; a node without
udev (a node that is itself a container, a minimal VM image, nodes made by hand, NVIDIA's nodes, which have no
``/sys/dev/char`` entry) has none.  NVIDIA's toolkit has ``nvidia-ctk system create-dev-char-symlinks`` for the
same reason.

What: for each char node of the inventory (every GPU's nodes, display nodes, the shared ones such as /dev/kfd or
/dev/nvidiactl) whose host node exists as a char device of exactly that number, a relative link as udev writes it
(``/dev/char/226:128 -> ../dri/renderD128``).  Anything already at the link's path (a link, right or wrong, or
any other entry) is never touched.  ``install`` makes them (and says which), ``watch`` makes them as GPUs appear.

What was made is recorded *before* it is made, in :data:`STATE` (one ``LINK TARGET`` line each; on /run, as the
links are on /dev: both are gone at a reboot), so that ``install --uninstall`` takes out exactly the links this
tool made, and only while they still point where it made them (a link udev or an operator replaced since stays).
Not the install manifest and its journal: those live on /var/lib and outlast a reboot, after which the links are
gone (and the ``watch`` unit makes them again, recording them afresh).
"""

from __future__ import annotations

import os
import stat

from oci_gpu_hook.errors import HookError

TYPE_CHECKING = False  # not typing's: see oci_gpu_hook/startpath.py

if TYPE_CHECKING:
    from collections.abc import Callable

    from oci_gpu_hook.config import Config
    from oci_gpu_hook.core.devices import Node
    from oci_gpu_hook.inventory import Inventory

# Its own directory: the watch unit may write there (its RuntimeDirectory), and /run/oci-gpu-hook is the planner
# unit's (mode 0700, removed when the planner stops).
STATE = "/run/oci-gpu-hook-dev-char/links"


def state_for(dev: str) -> str:
    """The record of the links made in ``dev``: :data:`STATE` under the same root (``P/dev`` -> ``P/run/...``)."""
    root = os.path.dirname(os.path.abspath(dev).rstrip("/"))
    return os.path.join(root, STATE.lstrip("/"))


def grantable_nodes(inventory: Inventory) -> list[Node]:
    """Every char node a container can be given on this host, once each (by number)."""
    found: dict[tuple[int, int], Node] = {}
    for device in inventory.all_devices:
        for node in device.all_nodes:
            found.setdefault((node.major, node.minor), node)
    for kind in inventory.kinds:
        for node in inventory.shared(kind):
            found.setdefault((node.major, node.minor), node)
    return [node for node in found.values() if node.type == "c"]


def wanted(inventory: Inventory, dev: str = "/dev") -> list[tuple[str, str]]:
    """(link, target) of each missing link whose host node is there with its number (``dev``: the /dev to work
    in, for ``install --prefix`` and the tests)."""
    links = []
    for node in grantable_nodes(inventory):
        if not node.path.startswith("/dev/"):
            continue
        host = os.path.join(dev, node.path[len("/dev/"):])
        try:
            st = os.stat(host)
        except OSError:
            continue  # no node there (the driver is not loaded, or this is not the node's host)
        if not stat.S_ISCHR(st.st_mode) or (os.major(st.st_rdev), os.minor(st.st_rdev)) != (node.major, node.minor):
            continue  # something else has that name: a link would name the wrong device
        link = os.path.join(dev, "char", f"{node.major}:{node.minor}")
        if os.path.lexists(link):
            continue
        links.append((link, os.path.relpath(host, os.path.dirname(link))))
    return links


def _read_state(state: str) -> list[tuple[str, str]]:
    try:
        with open(state, encoding="utf-8") as handle:
            lines = handle.read().splitlines()
    except FileNotFoundError:
        return []
    except OSError as err:
        raise HookError(f"cannot read {state}: {err.strerror}") from None
    return [(link, target) for link, _sep, target in (line.partition(" ") for line in lines) if target]


def _write_state(state: str, entries: list[tuple[str, str]]) -> None:
    from oci_gpu_hook.atomic import write_atomic

    if not entries:
        try:
            os.unlink(state)
        except FileNotFoundError:
            pass
        return
    os.makedirs(os.path.dirname(state), mode=0o755, exist_ok=True)
    write_atomic(state, "".join(f"{link} {target}\n" for link, target in entries).encode(), 0o644)


def make_links(inventory: Inventory, dev: str = "/dev", state: str = STATE, dry_run: bool = False) -> list[str]:
    """Make the missing links (:func:`wanted`); one line per link made (or, ``dry_run``, that would be)."""
    todo = wanted(inventory, dev)
    if not todo or dry_run:
        return [f"{link} -> {target} (would be made)" for link, target in todo]
    made = _read_state(state)
    _write_state(state, made + todo)  # recorded first: a run killed now leaves records of links not made
    done, lines = list(made), []
    try:
        os.makedirs(os.path.join(dev, "char"), mode=0o755, exist_ok=True)
        for link, target in todo:
            try:
                os.symlink(target, link)
            except FileExistsError:
                continue  # udev was quicker: its link stays, and is not ours to remove
            done.append((link, target))
            lines.append(f"{link} -> {target}")
    except OSError as err:
        raise HookError(f"cannot make the link {link}: {err.strerror}") from None
    finally:
        _write_state(state, done)
    return lines


def remove_links(dev: str = "/dev", state: str = STATE) -> list[str]:
    """Take out the links :func:`make_links` made that still point where it made them; one line each (and one per
    link left because it changed)."""
    lines = []
    for link, target in _read_state(state):
        if not link.startswith(os.path.join(dev, "char") + "/"):
            continue  # a record of another root
        try:
            current = os.readlink(link)
        except OSError:
            continue  # gone already, or never made (a run killed between record and link)
        if current != target:
            lines.append(f"kept: {link} (points to {current} now, not {target} as made)")
            continue
        try:
            os.unlink(link)
        except FileNotFoundError:
            continue
        except OSError as err:
            raise HookError(f"cannot remove the link {link}: {err.strerror}") from None
        lines.append(f"removed: {link} (made by install or watch)")
    _write_state(state, [])
    return lines


def install_lines(config: Config, disk: Callable[[str], str], dry_run: bool) -> list[str]:
    """What ``install`` says about the links (``disk``: where a real path lies under ``--prefix``)."""
    from oci_gpu_hook.inventory import scan_host

    try:
        made = make_links(scan_host(config), disk("/dev"), disk(STATE), dry_run)
    except HookError as err:
        return [f"note: /dev/char links not made: {err}"]
    return [f"dev-char: {line}" for line in made]


def uninstall_lines(disk: Callable[[str], str]) -> list[str]:
    """What ``install --uninstall`` says about the links it takes out."""
    try:
        return [f"dev-char: {line}" for line in remove_links(disk("/dev"), disk(STATE))]
    except HookError as err:
        return [f"note: /dev/char links: {err}"]
