"""Rootless podman on a node where ``install`` ran: a normal user with subuid ranges runs
``podman run`` without ``--hooks-dir``, and podman runs the precreate hook install put in
/usr/share/containers/oci/hooks.d, which rootless podman reads like root's.

The node is tests/helpers/rootless.py: a private mount namespace with a user of its own, the wheel installed as an
operator installs it, the seed host (8 GPUs) as the fake sysfs, its device nodes as stand-in char nodes in the
namespace's /dev (rootless runc bind-mounts host nodes; it cannot mknod), and the journal's socket of the test's
own, which takes each sender's credentials.  The cases of the issue:

- a container that asks for nothing starts exactly as without the tool (compared with podman given an empty
  hooks directory: every mount, /dev entry and variable the same), decided by the native front alone (it starts
  so even where the user can run no Python of the venv);
- ``AMD_VISIBLE_DEVICES=1`` and CDI's ``--device amd.com/gpu=1`` give exactly GPU 1's card and render nodes and
  /dev/kfd (the probe: open to the driver, ENXIO; no other GPU node; nothing can be mknod'ed);
- a CUDA image's env on this AMD-only node starts as without the tool (as the product does for root);
- a config with a typo, written after install: a container that asks is refused (never started without its GPU)
  with one journal line that carries the user's uid (podman 4.3 drops a precreate hook's stderr: the journal is
  where the user looks) and says to run install again, which tells root the typo; one that asks for nothing
  starts untouched; a CDI device, which podman applies itself, is given as to root;
- a GPU node the user cannot open (mode 0600, root's): refused with one journal line naming it, never given; and
  one the user opens only through a group (udev's 0660 root:video): rootless runc drops supplementary groups, so
  the container could not open it either: refused the same way; one root's alone but for an ACL that gives the
  user rw (systemd-logind's uaccess): given;
- config or code the user owns serves the user's own rootless containers and is refused for root's (one trust
  rule, both sides); config or code root gave another user is refused for root's containers and by ``install``,
  and by the user's rootless hook too: there it reads as the overflow uid, as root's files do, but it is no longer
  the entry install pinned (docs/security.md);
- ``validate --rootless USER`` agrees with the user's podman on each of those node states, and ``inspect --pid``
  of a running rootless container names the nodes it holds;
- the planner (``serve``, root's, on its default socket) is not asked by a rootless front (nor reachable from the
  user's namespace), and root's podman still is served by it.
"""

from __future__ import annotations

import contextlib
import re
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from oci_gpu_hook.fastpath import build as fastbuild
from tests.helpers import containerlib as cl
from tests.helpers import imageenvs, rootless
from tests.helpers.rootless import OTHER, USER

pytestmark = pytest.mark.containers

TYPO = "mask_other_gpu = true\n"
TYPO_LINE = "unknown key 'mask_other_gpu' (did you mean 'mask_other_gpus'?)"
VIEW = ("/bin/sh", "/view.sh")


@pytest.fixture(scope="module")
def node() -> Iterator[rootless.Node]:
    with rootless.rootless_node() as made:
        yield made


@pytest.fixture
def fresh_journal(node: rootless.Node) -> rootless.Node:
    node.journal_lines()  # what earlier tests left
    return node


def started(node: rootless.Node, done: subprocess.CompletedProcess[str]) -> str:
    """The container's output; it started (podman says nothing of a precreate hook's refusal: the journal does)."""
    assert done.returncode == 0, (f"podman exited {done.returncode}: {done.stderr.strip()}; "
                                  f"the journal: {[text for text, _sender in node.journal_lines()]}")
    return done.stdout


def severity(text: str) -> int:
    """A syslog line's severity (3 error, 4 warning, 6 info), from its ``<PRI>``."""
    return int(text[1:text.index(">")]) % 8


def refused(node: rootless.Node, done: subprocess.CompletedProcess[str], *says: str) -> str:
    """The container did not start (the probe never ran) and exactly one error line came to the journal, sent as
    the user (its real uid and gid: the journal's _UID, what ``journalctl _UID=...`` shows it), saying each of
    ``says``; that line's text.  Other lines (a hand-over to Python, at info) may come, also as the user."""
    assert done.returncode != 0 and "done" not in done.stdout.splitlines(), (
        f"the container ran: {done.stdout[-2000:]}")
    lines = node.journal_lines()
    errors = [text for text, _sender in lines if severity(text) == 3]
    assert len(errors) == 1, f"journal lines: {lines}; podman said: {done.stderr.strip()}"
    assert all(sender is not None and (sender.uid, sender.gid) == (node.uid, node.gid) for _text, sender in lines), (
        lines, node.uid)
    text = errors[0]
    assert " oci-gpu-hook[" in text and "\n" not in text, text
    for part in says:
        assert part in text, f"{part!r} not in the journal line {text!r}"
    return text


def subordinate_ids(node: rootless.Node) -> list[str]:
    """The user's subordinate uid range as useradd gave it: [start, count]."""
    ranges = [line.split(":")[1:] for line in node.read("/etc/subuid").splitlines() if line.startswith(f"{USER}:")]
    assert len(ranges) == 1, ranges
    return ranges[0]


def test_install_put_the_hook_where_rootless_podman_reads(node: rootless.Node) -> None:
    assert f"checked: podman reads {rootless.HOOKS_DIR} (podman's built-in default) and runs {rootless.HOOK}" \
        in node.install_out, node.install_out
    # the user reads the hook file and the CDI spec where install wrote them (podman reads both as the user)
    done = node.as_user(["cat", rootless.HOOK_FILE, rootless.CDI_SPEC])
    assert done.returncode == 0 and rootless.HOOK in done.stdout and '"amd.com/gpu"' in done.stdout, done.stderr
    # the user's podman really is rootless: its user namespace maps root to the user, and the user's ranges
    done = node.as_user(["podman", "unshare", "cat", "/proc/self/uid_map"])
    assert done.returncode == 0, done.stderr
    assert [line.split() for line in done.stdout.splitlines()] == [["0", str(node.uid), "1"],
                                                                   ["1", *subordinate_ids(node)]]


def test_no_request_starts_untouched(fresh_journal: rootless.Node) -> None:
    node = fresh_journal
    without = started(node, node.podman(args=VIEW, hooks=False))
    assert started(node, node.podman(args=VIEW)) == without
    rootless.assert_isolated(started(node, node.podman()), [])
    assert node.journal_lines() == []


@pytest.fixture
def closed_venv(fresh_journal: rootless.Node) -> Iterator[rootless.Node]:
    """The venv closed to the user (0700): a rootless hook can run no Python."""
    if fastbuild.find_cc() is None:
        pytest.skip("no C compiler here: install wrote the Python launcher, which is Python")
    fresh_journal.must(["chmod", "0700", rootless.VENV])
    try:
        yield fresh_journal
    finally:
        fresh_journal.must(["chmod", "0755", rootless.VENV])
        fresh_journal.reinstall()


def test_no_request_is_decided_natively(closed_venv: rootless.Node) -> None:
    """The native front decides "nothing asked" itself, before any trust walk it does not need: with no Python the
    user could run, a container that asks for nothing still starts untouched; one that asks is refused."""
    node = closed_venv
    assert node.must(["head", "-c", "4", rootless.HOOK]) == "\x7fELF"  # the native front
    without = started(node, node.podman(args=VIEW, hooks=False))
    assert started(node, node.podman(args=VIEW)) == without
    assert node.journal_lines() == []
    refused(node, node.podman("-e", "AMD_VISIBLE_DEVICES=1"), f"{rootless.VENV}/bin/python3")


def test_env_request_gets_exactly_its_gpu(fresh_journal: rootless.Node) -> None:
    rootless.assert_isolated(started(fresh_journal, fresh_journal.podman("-e", "AMD_VISIBLE_DEVICES=1")), [1])


@pytest.fixture
def no_session(fresh_journal: rootless.Node) -> Iterator[rootless.Node]:
    """The user without ``/run/user/UID`` (no logind session: ``su``, a CI runner's service user without linger),
    podman's pause process of the session stopped first; both put back after."""
    node = fresh_journal
    assert rootless._stop_pause(node) == []
    node.must(["mv", node.runtime_dir, f"{node.runtime_dir}.away"])
    node.must(["install", "-d", "-m", "0700", "-o", str(node.uid), "-g", str(node.gid), f"{node.home}/tmp"])
    try:
        yield node
    finally:
        pause = node.as_root(["sh", "-c", f"cat {node.home}/tmp/podman-run-{node.uid}/libpod/tmp/pause.pid"])
        if pause.stdout.strip().isdigit():
            node.must(["kill", pause.stdout.strip()])
            assert rootless._wait_gone(int(pause.stdout.strip()))
        node.must(["mv", f"{node.runtime_dir}.away", node.runtime_dir])


@pytest.mark.parametrize("request_", [("-e", "AMD_VISIBLE_DEVICES=1"), ("--device", "amd.com/gpu=1")],
                         ids=["env", "cdi"])
def test_without_a_runtime_directory_the_gpu_comes_without_its_links(no_session: rootless.Node,
                                                                    request_: tuple[str, str]) -> None:
    """The by-path links are a convenience: a user with nowhere of its own to prepare them gets its GPU without them
    by env (one warning line in the journal, sent as the user, says why), and by CDI as before (its links hook makes
    them inside the container)."""
    node = no_session
    storage = [f"--root={node.home}/tmp/storage", f"--runroot={node.home}/tmp/run"]  # not the session's (its paths)
    done = node.as_user([*rootless.PODMAN, *storage, *cl.PODMAN_RUN, *request_, "--rootfs", node.rootfs, "/bin/sh",
                         "/probe.sh"], session=False)
    result = cl.ProbeResult.parse(started(node, done))
    nodes, _access = cl.expected([1])
    assert result.nodes == nodes and result.access == {}, result
    lines = node.journal_lines()
    if request_[0] == "-e":
        assert result.links == {}, result.links
        (text, sender), = lines
        assert severity(text) == 4 and sender is not None and sender.uid == node.uid, lines
        assert (f"rootless container: no /dev/dri/by-path links: there is no /run/user/{node.uid} (No such file or "
                "directory;") in text and "the container gets its GPUs without them" in text
    else:
        assert result.links == cl.expected_links([1]) and lines == []
    assert not Path(f"/tmp/podman-run-{node.uid}").exists()  # podman's runtime files stayed in the namespace


def test_cdi_request_gets_exactly_its_gpu(fresh_journal: rootless.Node) -> None:
    rootless.assert_isolated(started(fresh_journal, fresh_journal.podman("--device", "amd.com/gpu=1")), [1])


def test_cuda_image_env_on_an_amd_node_starts_as_without_the_tool(fresh_journal: rootless.Node) -> None:
    node = fresh_journal
    env = [option for variable in imageenvs.CUDA_BASE for option in ("-e", variable)]
    without = started(node, node.podman(*env, args=VIEW, hooks=False))
    assert started(node, node.podman(*env, args=VIEW)) == without
    rootless.assert_isolated(started(node, node.podman(*env)), [])


@pytest.fixture
def broken_config(fresh_journal: rootless.Node) -> Iterator[rootless.Node]:
    fresh_journal.set_config(rootless.CONFIG_TEXT + TYPO)
    try:
        yield fresh_journal
    finally:
        fresh_journal.set_config(rootless.CONFIG_TEXT)
        fresh_journal.reinstall()


def test_broken_config_refuses_a_request_with_a_line_the_user_sees(broken_config: rootless.Node) -> None:
    """All a rootless hook can know of a config changed after install is that it changed (root's files and other
    users' read alike in its namespace): refused with a line that says so and what to do; root, running install
    again, is told the typo, and root's own container too."""
    node = broken_config
    refused(node, node.podman("-e", "AMD_VISIBLE_DEVICES=1"), rootless.CONFIG, "changed after `oci-gpu-hook install`",
            "run install again")
    again = node.as_root(["oci-gpu-hook", "install", "--only", "podman,cdi"])
    assert again.returncode != 0 and TYPO_LINE in again.stderr, again
    node.journal_lines()  # whatever install sent
    root = node.root_podman("-e", "AMD_VISIBLE_DEVICES=1")
    assert root.returncode != 0 and "done" not in root.stdout.splitlines(), root.stdout
    errors = [text for text, _sender in node.journal_lines() if severity(text) == 3]
    assert len(errors) == 1 and TYPO_LINE in errors[0], errors


def test_broken_config_leaves_cdi_to_podman(broken_config: rootless.Node) -> None:
    """CDI is podman's to apply (from the spec install wrote, which the config's typo does not change): the hook sees
    no request of its own, and the container gets exactly its GPU, as root's does under the same config."""
    node = broken_config
    rootless.assert_isolated(started(node, node.podman("--device", "amd.com/gpu=1")), [1])
    root = node.root_podman("--device", "amd.com/gpu=1")
    assert root.returncode == 0, root.stderr
    cl.assert_isolated(root.stdout, [1])


def test_broken_config_leaves_a_container_that_asks_nothing_untouched(broken_config: rootless.Node) -> None:
    node = broken_config
    without = started(node, node.podman(args=VIEW, hooks=False))
    assert started(node, node.podman(args=VIEW)) == without
    lines = node.journal_lines()  # a warning that names the config's problem may come; no error
    assert [text for text, _sender in lines if severity(text) <= 3] == [], lines


@pytest.fixture
def closed_node(fresh_journal: rootless.Node) -> Iterator[rootless.Node]:
    """GPU 1's render node as root's alone (0600): the user cannot open it."""
    fresh_journal.node_mode("/dev/dri/renderD129", 0o600)
    try:
        yield fresh_journal
    finally:
        fresh_journal.node_mode("/dev/dri/renderD129", 0o666)


@pytest.mark.parametrize("request_", [("-e", "AMD_VISIBLE_DEVICES=1"), ("--device", "amd.com/gpu=1")],
                         ids=["env", "cdi"])
def test_a_node_the_user_cannot_open_is_refused_never_given(closed_node: rootless.Node,
                                                             request_: tuple[str, str]) -> None:
    node = closed_node
    assert node.as_user(["head", "-c1", "/dev/dri/renderD129"]).returncode != 0  # the user itself cannot
    # the line speaks of the host's ids, as the user and the operator know them (not the namespace's 0), and never
    # names a wrong owner: root's node reads as the overflow uid 65534 in the namespace, which podman's map (1..65536
    # onto the user's subordinate ids) also maps, to the user's subordinate id start + 65533
    text = refused(node, node.podman(*request_), "/dev/dri/renderD129", f"uid {node.uid} ")
    start = int(subordinate_ids(node)[0])
    assert f"owner {start + 65533}" not in text and ("owner 0" in text or "does not map" in text), text
    # another GPU, whose nodes the user can open, is still given
    rootless.assert_isolated(started(node, node.podman("-e", "AMD_VISIBLE_DEVICES=2")), [2])


@pytest.fixture
def group_node(fresh_journal: rootless.Node) -> Iterator[rootless.Node]:
    """GPU 1's card node as udev leaves it (0660 root:video) and the user in video: the user opens it, but rootless
    runc drops supplementary groups (podman's ``--group-add keep-groups`` is crun's), so a container cannot."""
    node = fresh_journal
    node.must(["sh", "-ec", f"usermod -aG video {USER}; chgrp video /dev/dri/card2; chmod 0660 /dev/dri/card2"])
    try:
        yield node
    finally:
        node.must(["sh", "-ec", f"gpasswd -d {USER} video >/dev/null; chgrp root /dev/dri/card2; "
                                "chmod 0666 /dev/dri/card2"])


@pytest.mark.parametrize("request_", [("-e", "AMD_VISIBLE_DEVICES=1"), ("--device", "amd.com/gpu=1")],
                         ids=["env", "cdi"])
def test_a_node_open_to_the_user_only_through_a_group_is_refused(group_node: rootless.Node,
                                                                 request_: tuple[str, str]) -> None:
    node = group_node
    opened = node.as_user(["head", "-c1", "/dev/dri/card2"])
    assert "No such device or address" in opened.stderr, opened.stderr  # the user itself: open, to the driver
    without = node.podman("--device", "/dev/dri/card2", hooks=False)  # what a rootless container gets of it
    assert "Permission denied" in cl.ProbeResult.parse(started(node, without)).nodes["/dev/dri/card2"]
    refused(node, node.podman(*request_), "/dev/dri/card2", f"uid {node.uid} ")


GPU1 = ["/dev/dri/card2", "/dev/dri/renderD129", "/dev/kfd"]


@pytest.fixture
def acl_node(fresh_journal: rootless.Node) -> Iterator[rootless.Node]:
    """GPU 1's nodes root's alone (0600) but for an ACL that gives the user rw, as systemd-logind's uaccess does."""
    setup, undo, _named = NODE_STATES["acl"]
    fresh_journal.must(["sh", "-ec", setup])
    try:
        yield fresh_journal
    finally:
        fresh_journal.must(["sh", "-ec", undo])


@pytest.mark.parametrize("request_", [("-e", "AMD_VISIBLE_DEVICES=1"), ("--device", "amd.com/gpu=1")],
                         ids=["env", "cdi"])
def test_a_node_the_user_may_open_by_an_acl_is_given(acl_node: rootless.Node, request_: tuple[str, str]) -> None:
    node = acl_node
    assert node.as_root(["stat", "-c", "%a %u", *GPU1]).stdout.split() == ["660", "0"] * 3  # the mask, root's
    rootless.assert_isolated(started(node, node.podman(*request_)), [1])
    assert node.journal_lines() == []


# How a GPU 1 node may stand on the host: (shell lines as root to set it, to undo it, the node the refusal names)
NODE_STATES = {
    "open": ("true", "true", None),
    "root-0600": ("chmod 0600 /dev/dri/renderD129", "chmod 0666 /dev/dri/renderD129", "/dev/dri/renderD129"),
    "group-only": (f"usermod -aG video {USER}; chgrp video /dev/dri/card2; chmod 0660 /dev/dri/card2",
                   f"gpasswd -d {USER} video >/dev/null; chgrp root /dev/dri/card2; chmod 0666 /dev/dri/card2",
                   "/dev/dri/card2"),
    "acl": (f"chmod 0600 {' '.join(GPU1)}; {rootless.acl_line(USER, GPU1)}",
            f"{rootless.acl_line('-', GPU1)}; chmod 0666 {' '.join(GPU1)}", None),
}


@pytest.mark.parametrize("state", list(NODE_STATES))
def test_validate_rootless_says_what_rootless_podman_does(fresh_journal: rootless.Node, state: str) -> None:
    """``validate --rootless USER`` (root's, on the node) on the same request: ok exactly where the user's podman
    starts the container, and the same node named where it refuses."""
    node = fresh_journal
    setup, undo, named = NODE_STATES[state]
    bundle = node.base / f"validate-{state}"
    if not bundle.exists():
        cl.make_bundle(bundle, node.base / "rootfs", ["AMD_VISIBLE_DEVICES=1"])
    node.must(["sh", "-ec", setup])
    try:
        checked = node.as_root(["oci-gpu-hook", "validate", "--rootless", USER, str(bundle)])
        ran = node.podman("-e", "AMD_VISIBLE_DEVICES=1")
    finally:
        node.must(["sh", "-ec", undo])
    if named is None:
        assert checked.returncode == 0, checked.stderr
        assert f"rootless as uid {node.uid}: every node is the host's and opens for that user" in checked.stdout
        rootless.assert_isolated(started(node, ran), [1])
    else:
        assert checked.returncode != 0 and named in checked.stderr, checked
        assert len(checked.stderr.splitlines()) == 1, checked.stderr
        refused(node, ran, named)


def test_inspect_pid_says_what_a_rootless_container_holds(fresh_journal: rootless.Node) -> None:
    node = fresh_journal
    done = node.podman("-d", "-e", "AMD_VISIBLE_DEVICES=1", args=("/bin/sleep", "300"))
    cid = started(node, done).strip()
    pid = ""
    try:
        pid = node.podman_other("inspect", "--format", "{{.State.Pid}}", cid).stdout.strip()
        assert pid.isdigit(), pid
        shown = node.as_root(["oci-gpu-hook", "inspect", "--pid", pid])
        assert shown.returncode == 0, shown.stderr
    finally:
        removed = node.podman_other("rm", "-f", "-t", "0", cid)
        if pid.isdigit():  # once, on a loaded machine, the sleep outlived its removal: never leave it to the node
            node.as_root(["sh", "-c", f"kill -9 {pid} 2>/dev/null; true"])
    assert removed.returncode == 0, removed.stderr
    lines = shown.stdout.splitlines()
    assert lines[0].startswith(f"rootless: process {pid} runs in a user namespace that maps its root to host uid "
                               f"{node.uid}:"), lines
    listed = [line.split()[0] for line in lines[1:] if line.startswith("  /dev/")]
    assert sorted(listed) == ["/dev/dri/card2", "/dev/dri/renderD129", "/dev/kfd"], lines


# What the user may own on the node, for its own containers: (the path, what root's refusal says of it)
USERS_OWN = {
    "config": (rootless.CONFIG, f"config file {rootless.CONFIG} is not trusted"),
    "venv": (rootless.VENV, f"refusing to run interpreter {rootless.VENV}/bin/python3"),
}


@pytest.mark.parametrize("owned", list(USERS_OWN))
def test_what_the_user_owns_serves_its_own_containers_never_roots(fresh_journal: rootless.Node, owned: str) -> None:
    """One trust rule, both sides, on the installed node: code or config that the user (or root) alone could change
    cannot raise the user's privilege, so the user's rootless container is served by it; root's container is
    refused with one line (a non-root user could have written what root would run or read); root's container that
    asks for nothing still starts."""
    node = fresh_journal
    path, says = USERS_OWN[owned]
    node.must(["chown", "-R", USER, path])
    try:
        rootless.assert_isolated(started(node, node.podman("-e", "AMD_VISIBLE_DEVICES=1")), [1])
        assert node.journal_lines() == []
        root = node.root_podman("-e", "AMD_VISIBLE_DEVICES=1")
        assert root.returncode != 0 and "done" not in root.stdout.splitlines(), root.stdout
        errors = [(text, sender) for text, sender in node.journal_lines() if severity(text) == 3]
        assert len(errors) == 1 and says in errors[0][0], errors
        assert errors[0][1] is not None and errors[0][1].uid == 0, errors
        root = node.root_podman()
        assert root.returncode == 0, root.stderr
        cl.assert_isolated(root.stdout, [])
    finally:
        node.must(["chown", "-R", "root", path])
        node.reinstall()


STEERED = f"/home/{USER}/steered"  # what another user's change makes the user's own hook write, were it obeyed
# Another user's change to what the user's hook runs or reads: (the path that user is given, a shell line run as
# that user; $INIT is the package's __init__.py)
STEERS = {
    "config": (rootless.CONFIG, f"printf 'log_file = \"{STEERED}\"\\n' >> {rootless.CONFIG}"),
    "config-directory": ("/etc/oci-gpu-hook", f"cp {rootless.CONFIG} /etc/oci-gpu-hook/new && "
                                              f"printf 'log_file = \"{STEERED}\"\\n' >> /etc/oci-gpu-hook/new && "
                                              f"mv /etc/oci-gpu-hook/new {rootless.CONFIG}"),
    "venv": (rootless.VENV, f"printf 'open(\"{STEERED}\", \"a\").close()\\n' >> \"$INIT\""),
}


@contextlib.contextmanager
def given_to_other(node: rootless.Node, owned: str) -> Iterator[str]:
    """Root gives the other user a path of the install (:data:`STEERS`), and that user changes it; yields the path.
    Everything is root's again, as before, afterwards."""
    path, change = STEERS[owned]
    init = node.must(["sh", "-c", f"echo {rootless.VENV}/lib/python3*/site-packages/oci_gpu_hook/__init__.py"]).strip()
    seen = node.as_user(["podman", "unshare", "stat", "-c", "%u", path, "/"]).stdout.split()
    assert seen == ["65534", "65534"], seen  # root's, as the user's namespace shows it
    saved = {real: node.read(real) for real in (rootless.CONFIG, init)}
    node.must(["chown", "-R" if owned == "venv" else "-h", OTHER, path])
    try:
        seen = node.as_user(["podman", "unshare", "stat", "-c", "%u", path]).stdout.split()
        assert seen == ["65534"], seen  # the other user's: no different in there
        node.must(["setpriv", "--reuid", OTHER, "--regid", OTHER, "--init-groups", "env", f"INIT={init}", "sh", "-ec",
                   change])
        yield path
    finally:
        for real, text in saved.items():
            node.write(real, text)
        node.must(["chown", "-R", "root:root", path, rootless.CONFIG])  # the config that user may have replaced too
        node.reinstall()
        node.must(["rm", "-f", STEERED])


@pytest.mark.parametrize("owned", list(STEERS))
def test_another_users_path_is_refused_for_root_and_by_install(fresh_journal: rootless.Node, owned: str) -> None:
    """Where root gave another user a path of the install, root's own containers that ask are refused with a line
    naming it, and ``install`` run again refuses, writing nothing (docs/security.md): what tells the operator."""
    node = fresh_journal
    with given_to_other(node, owned) as path:
        root = node.root_podman("-e", "AMD_VISIBLE_DEVICES=1")
        assert root.returncode != 0 and "done" not in root.stdout.splitlines(), root.stdout
        errors = [(text, sender) for text, sender in node.journal_lines() if severity(text) == 3]
        assert len(errors) == 1 and errors[0][1] is not None and errors[0][1].uid == 0, errors
        assert path in errors[0][0] or f"refusing to run interpreter {rootless.VENV}/" in errors[0][0], errors
        before = node.must(["sha256sum", rootless.HOOK, rootless.HOOK_FILE, rootless.CDI_SPEC])
        again = node.as_root(["oci-gpu-hook", "install", "--only", "podman,cdi"])
        assert again.returncode != 0 and path in again.stderr and len(again.stderr.splitlines()) == 1, again
        assert node.must(["sha256sum", rootless.HOOK, rootless.HOOK_FILE, rootless.CDI_SPEC]) == before


@pytest.mark.parametrize("owned", list(STEERS))
def test_what_another_user_owns_never_steers_a_users_containers(fresh_journal: rootless.Node, owned: str) -> None:
    """Inside the user's rootless namespace a file of another user reads as the overflow uid, as root's files do.
    That user changes what it owns (a log_file in the user's home; a line of code in the package): obeyed, the
    user's hook would write where that user chose, or run that user's code, as this user.  The chown root did and
    the change that user made moved the entry's change time (or its inode) away from what install pinned: refused
    with one line naming the path."""
    node = fresh_journal
    with given_to_other(node, owned) as path:
        ran = node.podman("-e", "AMD_VISIBLE_DEVICES=1")
        steered = node.as_root(["test", "-e", STEERED]).returncode == 0
        assert not steered, "the other user steered the user's hook"
        refused(node, ran, path, "changed after `oci-gpu-hook install`")
        checked = node.as_root(["oci-gpu-hook", "validate", "--rootless", USER])  # root's own rule says it first
        assert checked.returncode != 0 and path in checked.stderr, checked


# The racing swap: run as the other user, who was given one directory of the install by a non-recursive chown. It
# waits (inotify) for the hook to be running, then renames a tree of its own over what the hook has checked.
# "package": the first open in the package's directory (the hook importing it: its trust walks are done), then
# the environment's lib/ swapped for one whose package writes STEERED when any module of it is imported (before,
# the modules that a start imported after that moment came from it). "config": a loop that keeps renaming a
# config of its own over the file and back (a walk that saw root's file and a read that follows it may then see
# two files, nothing in between tells the hook).
SWAPPER = r"""
import ctypes, os, sys
kind, watched, a, b = sys.argv[1:5]
libc = ctypes.CDLL(None, use_errno=True)
fd = libc.inotify_init()
assert fd >= 0 and libc.inotify_add_watch(fd, watched.encode(), 0x20) >= 0  # IN_OPEN
print("armed", flush=True)
if kind == "package":
    os.read(fd, 4096)
    os.rename(a, a + ".orig")
    os.rename(b, a)
    print("swapped", flush=True)
else:
    while True:  # until the test kills it
        os.rename(a, a + ".orig")
        os.rename(b, a)
        os.rename(a, b)
        os.rename(a + ".orig", a)
"""
STEER_LINE = f"open({STEERED!r}, 'a').close()\n"
# The other user's own tree, made as that user: a copy of the package whose every module also writes STEERED, or
# a copy of the config with a log_file in the user's home
PREPARE = r"""
import os, shutil, sys
kind, source, copy, line = sys.argv[1:5]
if kind == "package":
    shutil.copytree(source, copy)
    for top, _dirs, files in os.walk(copy):
        for name in files:
            if name.endswith(".py"):
                with open(os.path.join(top, name), "a") as handle:
                    handle.write(line)
else:
    shutil.copy(source, copy)
    with open(copy, "a") as handle:
        handle.write(line)
"""


@contextlib.contextmanager
def racing(node: rootless.Node, kind: str) -> Iterator[str]:
    """Root gives the other user one directory of the install by a non-recursive chown (the environment's own, or
    the config's), the other user prepares a tree of its own in it and starts :data:`SWAPPER` there; yields the
    directory, with the swapper armed.  Everything is as before afterwards (and install run again)."""
    site = node.must(["sh", "-c", f"echo {rootless.VENV}/lib/python3*/site-packages"]).strip()
    version = site.split("/lib/", 1)[1].split("/", 1)[0]
    other = ["setpriv", "--reuid", OTHER, "--regid", OTHER, "--init-groups", "env", "-i", f"PATH={rootless.PATH}"]
    if kind == "package":
        directory, a, b = rootless.VENV, f"{rootless.VENV}/lib", f"{rootless.VENV}/lib.evil"
        watched = f"{site}/oci_gpu_hook"
        args = [f"{site}/oci_gpu_hook", f"{b}/{version}/site-packages/oci_gpu_hook", STEER_LINE]
    else:
        directory, a, b = "/etc/oci-gpu-hook", rootless.CONFIG, "/etc/oci-gpu-hook/evil.toml"
        watched = rootless.CONFIG
        args = [rootless.CONFIG, b, f'log_file = "{STEERED}"\n']
    node.must(["chown", OTHER, directory])  # not -R: every entry below it is root's still
    swapper = None
    try:
        node.must([*other, rootless.node_python(), "-c", PREPARE, kind, *args])
        swapper = subprocess.Popen(node.root.enter([*other, rootless.node_python(), "-c", SWAPPER, kind, watched, a,
                                                    b]), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert swapper.stdout is not None and swapper.stdout.readline() == "armed\n", swapper.stderr
        yield directory
    finally:
        if swapper is not None:
            swapper.kill()
            swapper.wait(timeout=60)
        restore = (f"if [ -e {a}.orig ]; then rm -rf {a} && mv {a}.orig {a}; fi; rm -rf {b} {a}.orig; "
                   f"chown root:root {directory}")
        node.must(["sh", "-c", restore])
        node.reinstall()
        node.must(["rm", "-f", STEERED])


@pytest.mark.parametrize("kind", ["package", "config"])
def test_a_swap_made_while_the_hook_runs_never_steers_it(fresh_journal: rootless.Node, kind: str) -> None:
    """The racing case: root gave the other user the environment's own directory or the config's, by a
    non-recursive chown (every entry below still root's, so still what install pinned), and that user renames a
    tree of its own over the install *while* the user's hook runs, timed by inotify.  Both directories are pinned
    (the chown moved their change time), so the hook refuses before it reads or imports anything from them, with
    one line naming the directory; the start path is imported right after the walk and the config read through
    the descriptor its walk checked, so no later read or import could have been swapped either."""
    node = fresh_journal
    with racing(node, kind) as directory:
        for _attempt in range(12 if kind == "config" else 1):  # the loop wins some: a dozen tries
            ran = node.podman("-e", "AMD_VISIBLE_DEVICES=1")
            steered = node.as_root(["test", "-e", STEERED]).returncode == 0
            assert not steered, "the other user's swap steered the user's hook"
            refused(node, ran, directory, "changed after `oci-gpu-hook install`")


@pytest.fixture
def edited_config(fresh_journal: rootless.Node) -> Iterator[rootless.Node]:
    """Root edits the config (a valid one, still root's) and does not run install again."""
    fresh_journal.set_config(rootless.CONFIG_TEXT + "# edited by root after install\n")
    try:
        yield fresh_journal
    finally:
        fresh_journal.set_config(rootless.CONFIG_TEXT)
        fresh_journal.reinstall()


def test_a_config_root_edits_serves_rootless_requests_after_install_again(edited_config: rootless.Node) -> None:
    """What a rootless hook cannot tell from another user's change (docs/security.md): refused with a line that says
    what to do, and ``validate --rootless`` says the same to root; after install, served again.  A container that
    asks for nothing starts meanwhile, and root's containers follow the edit at once."""
    node = edited_config
    refused(node, node.podman("-e", "AMD_VISIBLE_DEVICES=1"), rootless.CONFIG, "run install again")
    without = started(node, node.podman(args=VIEW, hooks=False))
    assert started(node, node.podman(args=VIEW)) == without
    root = node.root_podman("-e", "AMD_VISIBLE_DEVICES=1")
    assert root.returncode == 0, root.stderr
    cl.assert_isolated(root.stdout, [1])
    checked = node.as_root(["oci-gpu-hook", "validate", "--rootless", USER])
    assert checked.returncode != 0 and rootless.CONFIG in checked.stderr, checked
    assert "until install runs again" in checked.stderr and len(checked.stderr.splitlines()) == 1, checked.stderr
    node.reinstall()
    assert "every pinned entry is as install saw it" in node.must(["oci-gpu-hook", "validate", "--rootless", USER])
    rootless.assert_isolated(started(node, node.podman("-e", "AMD_VISIBLE_DEVICES=1")), [1])


SERVING = re.compile(r"planner: serving ")
REQUEST = re.compile(r"planner: (?!serving |stopping )")  # any line about a request (ok, refused, bad request, ...)


def _wait_for(log: Path, pattern: re.Pattern[str], process: subprocess.Popen[bytes], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not pattern.search(log.read_text(errors="replace") if log.exists() else ""):
        assert process.poll() is None, f"the planner exited {process.returncode}: {log.read_text()}"
        assert time.monotonic() < deadline, f"no {pattern.pattern!r} in {timeout} s: {log.read_text()}"
        time.sleep(0.02)


def test_the_planner_is_not_asked_by_a_rootless_front(fresh_journal: rootless.Node) -> None:
    node = fresh_journal
    log = node.base / "planner.log"
    planner = node.serve(log)
    try:
        _wait_for(log, SERVING, planner)
        rootless.assert_isolated(started(node, node.podman("-e", "AMD_VISIBLE_DEVICES=1")), [1])
        lines = log.read_text(errors="replace").splitlines()
        assert not [line for line in lines if REQUEST.search(line)], lines
        # nor could a rootless front ask: root's socket directory is closed to the user's namespace (its root is
        # the user)
        reach = node.as_user(["podman", "unshare", "/usr/bin/python3", "-c", "import socket; "
                              "socket.socket(socket.AF_UNIX).connect('/run/oci-gpu-hook/planner.sock')"])
        assert reach.returncode != 0 and "PermissionError" in reach.stderr, reach
        # the planner was there to be asked: root's podman, through the same hook, is served by it
        done = node.root_podman("-e", "AMD_VISIBLE_DEVICES=2")
        assert done.returncode == 0, done.stderr
        cl.assert_isolated(done.stdout, [2])
        _wait_for(log, re.compile(r"planner: ok "), planner)
    finally:
        node.stop_planners()
