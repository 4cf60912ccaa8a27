"""The by-path directory of a rewritten spec (oci_gpu_hook.appliers.bypath): made atomically, named by its content,
and anything on the way that root alone did not write is refused, never followed or used."""

from __future__ import annotations

import multiprocessing
import os
from pathlib import Path

import pytest

from oci_gpu_hook.appliers import bypath
from oci_gpu_hook.errors import HookError

LINKS = (("/dev/dri/by-path/pci-0000:23:00.0-render", "../renderD129"),
         ("/dev/dri/by-path/pci-0000:23:00.0-card", "../card2"))
OTHER = (("/dev/dri/by-path/pci-0000:43:00.0-card", "../card3"),)
NAMES = {"pci-0000:23:00.0-card": "../card2", "pci-0000:23:00.0-render": "../renderD129"}
NOBODY = 65534


def content(path: Path) -> dict[str, str]:
    return {entry.name: os.readlink(entry) for entry in path.iterdir()}


def test_made_with_exactly_the_links_named_by_their_content(tmp_path: Path) -> None:
    root = tmp_path / "run" / "by-path"
    made = Path(bypath.prepare(LINKS, str(root)))
    assert made.parent == root and made.name == bypath.digest(NAMES) and len(made.name) == 32
    assert content(made) == NAMES
    assert (made.stat().st_mode & 0o7777, made.stat().st_uid) == (0o755, os.geteuid())
    assert (root.stat().st_mode & 0o7777, (tmp_path / "run").stat().st_mode & 0o7777) == (0o755, 0o755)
    assert sorted(p.name for p in root.iterdir()) == [made.name]  # no temporary directory left
    assert bypath.prepare(LINKS[::-1], str(root)) == str(made)  # the set, not its order, names it
    other = bypath.prepare(OTHER, str(root))
    assert other != str(made) and content(Path(other)) == {"pci-0000:43:00.0-card": "../card3"}


def test_reuse_checks_and_touches_it(tmp_path: Path) -> None:
    made = Path(bypath.prepare(LINKS, str(tmp_path)))
    os.utime(made, (1, 1))
    assert bypath.prepare(LINKS, str(tmp_path)) == str(made)
    assert made.stat().st_mtime > 1  # the last time a container was given it


def test_check_only_writes_nothing(tmp_path: Path) -> None:
    root = tmp_path / "absent" / "by-path"
    path = bypath.prepare(LINKS, str(root), make=False)
    assert path == f"{root}/{bypath.digest(NAMES)}" and not (tmp_path / "absent").exists()
    made = bypath.prepare(LINKS, str(root))
    (Path(made) / "extra").symlink_to("../card9")
    with pytest.raises(HookError, match="not exactly"):
        bypath.prepare(LINKS, str(root), make=False)


def _planted(tmp_path: Path, how: str) -> tuple[Path, Path]:
    """A by_path_dir whose digest path for LINKS is ``how``; returns the root and what was planted."""
    root = tmp_path / "by-path"
    root.mkdir(mode=0o755)
    target = root / bypath.digest(NAMES)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o755)
    for name, link in NAMES.items():
        (elsewhere / name).symlink_to(link)
    if how == "symlink":  # to a directory with exactly the right content
        target.symlink_to(elsewhere)
    elif how == "not-root-dir":
        os.rename(elsewhere, target)
        os.chown(target, NOBODY, NOBODY)
    elif how == "not-root-link":
        os.rename(elsewhere, target)
        os.chown(target / "pci-0000:23:00.0-card", NOBODY, NOBODY, follow_symlinks=False)
    elif how == "writable":
        os.rename(elsewhere, target)
        target.chmod(0o777)
    elif how == "extra":
        os.rename(elsewhere, target)
        (target / "pci-0000:43:00.0-card").symlink_to("../card3")
    elif how == "wrong-target":
        os.rename(elsewhere, target)
        (target / "pci-0000:23:00.0-card").unlink()
        (target / "pci-0000:23:00.0-card").symlink_to("../card3")
    elif how == "a-file":
        target.write_text("")
    elif how == "a-file-entry":
        os.rename(elsewhere, target)
        (target / "pci-0000:23:00.0-card").unlink()
        (target / "pci-0000:23:00.0-card").write_text("")
    return root, target


@pytest.mark.root
@pytest.mark.parametrize(("how", "says"), [
    ("symlink", "is a symlink or not a directory"),
    ("not-root-dir", f"is owned by uid {NOBODY}"),
    ("not-root-link", f"is owned by uid {NOBODY}"),
    ("writable", "writable by group and others"),
    ("extra", "not exactly"),
    ("wrong-target", "points at '../card3', not '../card2'"),
    ("a-file", "is a symlink or not a directory"),
    ("a-file-entry", "is not a symlink"),
])
def test_a_planted_digest_path_is_refused_never_followed(tmp_path: Path, how: str, says: str) -> None:
    root, target = _planted(tmp_path, how)
    before = {p: (os.lstat(p).st_mode, os.lstat(p).st_uid) for p in [target, *target.rglob("*")]} \
        if target.is_dir() else {target: os.lstat(target).st_mode}
    with pytest.raises(HookError) as info:
        bypath.prepare(LINKS, str(root))
    line = str(info.value)
    assert "\n" not in line and says in line and "remove it" in line, line
    after = {p: (os.lstat(p).st_mode, os.lstat(p).st_uid) for p in [target, *target.rglob("*")]} \
        if target.is_dir() else {target: os.lstat(target).st_mode}
    assert after == before  # nothing changed, nothing touched through it


@pytest.mark.root
@pytest.mark.parametrize("how", ["symlink", "not-root", "writable", "a-file", "symlink-above"])
def test_a_hostile_by_path_dir_is_refused(tmp_path: Path, how: str) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    root = tmp_path / "by-path"
    if how == "symlink":
        root.symlink_to(elsewhere)
    elif how == "not-root":
        root.mkdir()
        os.chown(root, NOBODY, NOBODY)
    elif how == "writable":
        root.mkdir()
        root.chmod(0o777)  # no sticky bit
    elif how == "a-file":
        root.write_text("")
    else:
        (tmp_path / "up").symlink_to(elsewhere)
        root = tmp_path / "up" / "by-path"
    with pytest.raises(HookError) as info:
        bypath.prepare(LINKS, str(root))
    assert "\n" not in str(info.value) and "by-path links under" in str(info.value), info.value
    assert list(elsewhere.iterdir()) == []
    if how in ("not-root", "writable"):
        assert list(root.iterdir()) == []


def test_relative_or_dotted_by_path_dir_is_refused() -> None:
    for root in ("run/by-path", "/run/../tmp/by-path", "/run/./by-path"):
        with pytest.raises(HookError, match="absolute, normalized"):
            bypath.prepare(LINKS, root)


def test_only_by_path_links_are_made(tmp_path: Path) -> None:
    for links in ((("/dev/dri/by-path/../x", "../card1"),), (("/dev/dri/by-path/a", "/etc/passwd"),),
                  (("/dev/dri/by-path/a", "../card1"), ("/dev/dri/by-path/a", "../card2"))):
        with pytest.raises(HookError):
            bypath.prepare(links, str(tmp_path))
    assert list(tmp_path.iterdir()) == []


def _prepare_many(root: str, queue: multiprocessing.Queue) -> None:  # type: ignore[type-arg]
    queue.put([bypath.prepare(LINKS, root) for _ in range(20)])


def test_concurrent_creates_of_one_set_agree(tmp_path: Path) -> None:
    """Processes racing to make the same directory all get it, whole: one rename wins, the others check it."""
    queue: multiprocessing.Queue = multiprocessing.Queue()  # type: ignore[type-arg]
    workers = [multiprocessing.Process(target=_prepare_many, args=(str(tmp_path), queue)) for _ in range(6)]
    for worker in workers:
        worker.start()
    results = [queue.get(timeout=60) for _ in workers]
    for worker in workers:
        worker.join(timeout=60)
        assert worker.exitcode == 0
    assert {path for result in results for path in result} == {f"{tmp_path}/{bypath.digest(NAMES)}"}
    assert sorted(p.name for p in tmp_path.iterdir()) == [bypath.digest(NAMES)]
    assert content(tmp_path / bypath.digest(NAMES)) == NAMES
