"""The one walk inside a container root (oci_gpu_hook/core/inroot.py), held to itself wherever it is done: the
pure-Python walk (forced), the kernel's ``openat2`` as inroot.kernel_open asks it, ``open_dir`` as the appliers
call it (the kernel first, the walk deciding), and the C front's two calls (front.c ``in_root``, ``dir_beneath``,
compiled with -DOGH_WALK_PROBE), case by case on one corpus of hostile layouts: absolute and relative escapes, a
symlinked parent, chains, loops, procfs magic links, a dangling link, a bind mount and a tmpfs at a component, a
file or a fifo where a directory is expected.  Each case states its answer (the rule as the module's docstring
writes it), so the ways cannot agree on a wrong one; where the kernel cannot do the rule (a magic link in FOLLOW
mode, more than 40 links, a directory to make) the case says what the kernel answers instead, and ``open_dir``
must still give the walk's.  Every way runs on a fresh copy of the layout, in a private mount namespace; the tree
left behind must be the same for every way that makes directories, and nothing outside the root may change."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from oci_gpu_hook.fastpath import build as fastbuild

pytestmark = pytest.mark.root("gcc", "unshare", "mount")  # mounts at components, procfs; a compiler for the front
REPO = Path(__file__).resolve().parent.parent
OUT = "{outside}"  # in a layout: the host path of a directory outside the root, as an image would name it


@dataclass(frozen=True)
class Case:
    name: str
    mode: str  # "follow" or "refuse"
    path: str
    want: str  # the rule's answer: "ok /REAL" or "error ERRNO-NAME"
    # ("dir"|"file"|"fifo", PATH) | ("link", PATH, TARGET) | ("mount", PATH, "tmpfs"|"proc"|"bind")
    layout: tuple[tuple[str, ...], ...] = ()
    make: bool = False
    kernel: str = ""  # what one openat2 call answers where it cannot do the rule ("" = want)


BASE = (("dir", "usr/lib"), ("dir", "etc"), ("file", "usr/lib/libx.so.1"), ("dir", "outside"))
CHAIN_45 = (*[("link", f"c{i}", f"c{i + 1}") for i in range(45)], ("link", "c45", "/usr/lib"))
CHAIN_300 = (*[("link", f"c{i}", f"c{i + 1}") for i in range(300)], ("link", "c300", "/usr/lib"))
PROC = (("dir", "proc"), ("mount", "proc", "proc"))
BIND = (("dir", "mnt"), ("mount", "mnt", "bind"))

CASES = [
    # FOLLOW: as runc resolves a mount destination
    Case("root", "follow", "/", "ok /"),
    Case("plain", "follow", "/usr/lib", "ok /usr/lib"),
    Case("absolute-link-to-etc", "follow", "/lib", "ok /etc", (("link", "lib", "/etc"),)),
    Case("absolute-link-to-the-host-path", "follow", "/lib", "error ENOENT", (("link", "lib", OUT),)),
    Case("absolute-link-to-the-host-path-made", "follow", "/lib/x", "ok " + OUT + "/x", (("link", "lib", OUT),),
         make=True, kernel="error ENOENT"),
    Case("relative-escape", "follow", "/up/usr/lib", "ok /usr/lib", (("link", "up", "../../../../../.."),)),
    Case("dotdot-in-the-path", "follow", "/usr/../../../../etc", "ok /etc"),
    Case("symlinked-parent", "follow", "/usr/lib64", "ok /outside", (("link", "usr/lib64", "../../../../outside"),)),
    Case("dotdot-after-a-link", "follow", "/l/../../../etc", "ok /etc", (("link", "l", "usr/lib"),)),
    Case("chain", "follow", "/a", "ok /usr/lib", (("link", "a", "b"), ("link", "b", "c"), ("link", "c", "/usr/lib"))),
    Case("self-loop", "follow", "/loop/x", "error ELOOP", (("link", "loop", "loop"),)),
    Case("two-link-loop", "follow", "/a", "error ELOOP", (("link", "a", "b"), ("link", "b", "a"))),
    Case("45-links", "follow", "/c0", "ok /usr/lib", CHAIN_45, kernel="error ELOOP"),
    Case("300-links", "follow", "/c0", "error ELOOP", CHAIN_300),
    Case("link-to-dot", "follow", "/dot/usr", "ok /usr", (("link", "dot", "."),)),
    Case("link-to-root", "follow", "/r", "ok /", (("link", "r", "/"),)),
    Case("link-with-a-trailing-slash", "follow", "/s/lib", "ok /usr/lib", (("link", "s", "usr/"),)),
    Case("dangling", "follow", "/opt/lib", "error ENOENT", (("link", "opt", "/nonexistent"),)),
    Case("dangling-made", "follow", "/opt/lib", "ok /nonexistent/lib", (("link", "opt", "/nonexistent"),), make=True,
         kernel="error ENOENT"),
    Case("missing", "follow", "/usr/local/lib", "error ENOENT"),
    Case("missing-made", "follow", "/usr/local/lib", "ok /usr/local/lib", make=True, kernel="error ENOENT"),
    Case("file-as-a-directory", "follow", "/usr/lib/libx.so.1/x", "error ENOTDIR"),
    Case("file-at-the-end", "follow", "/usr/lib/libx.so.1", "error ENOTDIR"),
    Case("fifo", "follow", "/fifo", "error ENOTDIR", (("fifo", "fifo"),)),
    Case("link-to-a-file", "follow", "/f", "error ENOTDIR", (("link", "f", "usr/lib/libx.so.1"),)),
    Case("magic-proc-self-root", "follow", "/proc/self/root/etc", "ok /etc", PROC, kernel="error ELOOP"),
    Case("magic-proc-pid-root-through-a-link", "follow", "/evil/etc", "ok /etc",
         (*PROC, ("link", "evil", "/proc/{sleeper}/root")),
         kernel="error ELOOP"),
    Case("magic-proc-self-cwd", "follow", "/proc/self/cwd/usr", "ok /usr", PROC, kernel="error ELOOP"),
    Case("proc-self-is-an-ordinary-link", "follow", "/proc/self/fd", "ok /proc/{pid}/fd", PROC),
    Case("bind-mount", "follow", "/mnt/sub", "ok /mnt/sub", BIND),
    Case("dotdot-out-of-a-bind-mount", "follow", "/mnt/sub/../../etc", "ok /etc", BIND),
    Case("absolute-link-in-a-bind-mount", "follow", "/mnt/esc/usr", "ok /usr", BIND),
    Case("tmpfs-at-a-component", "follow", "/t/in/lib", "ok /usr/lib",
         (("dir", "t"), ("mount", "t", "tmpfs"), ("link", "t/in", "/usr"))),
    # REFUSE: the live hook's /dev (always made where missing, as rootfs.make_nodes makes it)
    Case("dev-fresh", "refuse", "/dev/dri/by-path", "ok /dev/dri/by-path", make=True, kernel="error ENOENT"),
    Case("dev-present", "refuse", "/usr/lib", "ok /usr/lib", make=True),
    Case("dev-absolute-link-out", "refuse", "/dev/dri/by-path", "error ELOOP", (("link", "dev", OUT),), make=True),
    Case("dev-link-in", "refuse", "/dev/dri", "error ELOOP", (("dir", "realdev"), ("link", "dev", "realdev")),
         make=True),
    Case("dri-relative-escape", "refuse", "/dev/dri/by-path", "error ELOOP",
         (("dir", "dev"), ("link", "dev/dri", "../../outside")), make=True),
    Case("by-path-to-proc-self-root", "refuse", "/dev/dri/by-path", "error ELOOP",
         (("dir", "dev/dri"), ("link", "dev/dri/by-path", "/proc/self/root"), *PROC), make=True),
    Case("refuse-proc-self", "refuse", "/proc/self/fd", "error ELOOP", PROC, make=True),
    Case("dri-dangling", "refuse", "/dev/dri/by-path", "error ELOOP", (("dir", "dev"), ("link", "dev/dri", "/x")),
         make=True),
    Case("dri-a-file", "refuse", "/dev/dri/by-path", "error ENOTDIR", (("dir", "dev"), ("file", "dev/dri")), make=True),
    Case("dri-a-fifo", "refuse", "/dev/dri", "error ENOTDIR", (("dir", "dev"), ("fifo", "dev/dri")), make=True),
    Case("dev-a-tmpfs", "refuse", "/dev/dri/by-path", "ok /dev/dri/by-path",
         (("dir", "dev"), ("mount", "dev", "tmpfs")), make=True, kernel="error ENOENT"),
    Case("dev-a-bind-mount", "refuse", "/mnt/sub", "ok /mnt/sub", BIND, make=True),
    Case("dotdot-refused", "refuse", "/dev/../etc", "error EINVAL", make=True),
    Case("dot-refused", "refuse", "/dev/./dri", "error EINVAL", make=True),
]
WAYS = ("walk", "open_dir", "kernel", "c")


def _build(root: Path, outside: Path, layout: tuple[tuple[str, ...], ...], sleeper: int) -> None:
    for kind, path, *rest in (*BASE, *layout):
        where = root / path
        target = rest[0].replace(OUT, str(outside)).replace("{sleeper}", str(sleeper)) if rest else ""
        if kind == "dir":
            where.mkdir(parents=True, exist_ok=True)
        elif kind == "file":
            where.write_text("")
        elif kind == "fifo":
            os.mkfifo(where)
        elif kind == "link":
            where.symlink_to(target)
        elif target == "bind":
            subprocess.run(["mount", "--bind", str(outside / "tree"), str(where)], check=True)
        else:
            subprocess.run(["mount", "-t", target, target, str(where)], check=True)


def _tree(top: Path) -> dict[str, str]:
    """Every entry below ``top`` by its mode, not followed; a procfs mounted there is not entered."""
    found = {}
    for directory, subdirs, files in os.walk(top):
        for name in sorted([*subdirs, *files]):
            path = Path(directory) / name
            found[str(path.relative_to(top))] = oct(path.lstat().st_mode)
        subdirs[:] = [d for d in subdirs if not (Path(directory) / d / "self").is_symlink()]
    return found


def run_corpus(probe: str, base: str) -> None:
    """In a private mount namespace (``unshare -m``): every case through every way, on a fresh layout each; prints
    JSON {case: {way: {"got", "tree", "outside_changed"}}}."""
    from oci_gpu_hook.core import inroot

    os.chdir("/")  # /proc/self/cwd reads "/" for every way
    os.umask(0)
    names = {2: "ENOENT", 20: "ENOTDIR", 40: "ELOOP", 22: "EINVAL", 18: "EXDEV", 13: "EACCES"}
    result: dict[str, dict[str, object]] = {}
    sleeper = subprocess.Popen(["sleep", "600"])  # another process, whose /proc/PID/root an image may name
    for number, case in enumerate(CASES):
        result[case.name] = {}
        for way in WAYS:
            top = Path(base) / f"{number}-{way}"
            root, outside = top / "root", top / "outside"
            (outside / "tree" / "sub").mkdir(parents=True)
            (outside / "tree" / "esc").symlink_to("/")
            _build(root, outside, case.layout, sleeper.pid)
            before = _tree(outside)
            fd = os.open(root, os.O_PATH | os.O_DIRECTORY)
            try:
                if way == "c":
                    out = subprocess.run([probe, str(root), case.mode, case.path], capture_output=True, text=True,
                                         check=True, timeout=60).stdout.strip()
                    got = out if out.startswith("ok ") else f"error {names.get(int(out.split()[1]), out.split()[1])}"
                else:
                    mode = inroot.FOLLOW if case.mode == "follow" else inroot.REFUSE
                    try:
                        if way == "kernel":
                            opened = inroot.kernel_open(fd, case.path, mode)
                            real = inroot._real_path(fd, opened)
                        else:
                            opened, real = (inroot.walk(fd, case.path, mode, case.make) if way == "walk" else
                                            inroot.open_dir(fd, case.path, mode, case.make, kernel=True))
                        os.close(opened)
                        got = f"ok {real}"
                    except OSError as err:
                        got = f"error {names.get(err.errno or 0, err.errno)}"
                    except inroot.WalkError as err:
                        got = f"error {names.get(err.errno, err.errno)}"
            finally:
                os.close(fd)
            tree = {name.replace(str(top).lstrip("/"), "{top}"): what for name, what in _tree(root).items()}
            result[case.name][way] = {"got": got.replace(str(outside), OUT), "tree": tree,
                                      "outside_changed": _tree(outside) != before}
    sleeper.kill()
    sleeper.wait()
    print(json.dumps(result))


@pytest.fixture(scope="module")
def corpus() -> Iterator[dict[str, dict[str, dict[str, object]]]]:
    base = Path(tempfile.mkdtemp(prefix="oci-gpu-hook-inroot-", dir="/tmp"))
    try:
        header = base / "baked.h"
        header.write_text(fastbuild.front_header("oci-gpu-hook", str(base), {}, True))
        probe = base / "probe"
        subprocess.run(["gcc", "-std=gnu11", "-O2", "-Wall", "-Wno-unused-function", f'-DOGH_BAKED="{header}"',
                        "-DOGH_WALK_PROBE", "-o", str(probe), fastbuild.FRONT_SOURCE], check=True, timeout=120)
        code = (f"import sys; sys.path[:0] = [{str(REPO)!r}]; from tests.test_inroot import run_corpus; "
                f"run_corpus({str(probe)!r}, {str(base / 'layouts')!r})")
        done = subprocess.run(["unshare", "-m", "--propagation", "private", sys.executable, "-c", code],
                              capture_output=True, text=True, timeout=300, cwd="/")
        assert done.returncode == 0, done.stderr
        yield json.loads(done.stdout)
    finally:
        shutil.rmtree(base, ignore_errors=True)


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_every_way_gives_the_rules_answer(corpus: dict[str, dict[str, dict[str, object]]], case: Case) -> None:
    got = {way: str(corpus[case.name][way]["got"]) for way in WAYS}
    kernel = case.kernel or case.want
    want = {"walk": case.want, "open_dir": case.want, "kernel": kernel,
            # the C front makes the directories of REFUSE mode as the walk does; its FOLLOW call is one openat2
            "c": case.want if case.mode == "refuse" else kernel}
    if "{pid}" in case.want:  # /proc/self as each process reads it: only its shape is common
        got = {way: g if not g.startswith("ok /proc/") else "ok /proc/{pid}/" + g.rsplit("/", 1)[1]
               for way, g in got.items()}
    assert got == want
    assert not any(corpus[case.name][way]["outside_changed"] for way in WAYS), case.name
    if case.make:  # the ways that make directories leave the same tree
        makers = ["walk", "open_dir", *(["c"] if case.mode == "refuse" else [])]
        trees = {way: corpus[case.name][way]["tree"] for way in makers}
        assert all(tree == trees["walk"] for tree in trees.values()), trees


def test_the_corpus_reaches_every_kind_of_answer() -> None:
    """No way can pass by answering one thing: the cases' answers span success, each refusal and a hand-over."""
    answers = {c.want.split()[0] if c.want.startswith("ok") else c.want for c in CASES}
    assert answers == {"ok", "error ENOENT", "error ENOTDIR", "error ELOOP", "error EINVAL"}
    assert {c.mode for c in CASES if c.kernel} == {"follow", "refuse"}


def test_the_walk_leaves_no_descriptor_open(tmp_path: Path) -> None:
    """Every way out of the walk (an answer, each refusal, a directory made) closes what it opened but the answer."""
    from oci_gpu_hook.core import inroot

    root = tmp_path / "root"
    _build(root, tmp_path, (("link", "loop", "loop"), ("link", "lib", "/usr/lib"), ("fifo", "fifo")), os.getpid())
    fd = os.open(root, os.O_PATH | os.O_DIRECTORY)
    before = sorted(os.listdir("/proc/self/fd"))
    try:
        for mode, path, make in [("follow", "/lib", False), ("follow", "/loop/x", False), ("follow", "/fifo", False),
                                 ("follow", "/a/b/c", True), ("follow", "/missing/x", False),
                                 ("refuse", "/lib/x", True), ("refuse", "/d/e", True), ("refuse", "/d/../e", True),
                                 ("follow", "/usr/lib/libx.so.1/x", False)]:
            try:
                os.close(inroot.walk(fd, path, mode, make)[0])
            except inroot.WalkError:
                pass
        assert sorted(os.listdir("/proc/self/fd")) == before
    finally:
        os.close(fd)
