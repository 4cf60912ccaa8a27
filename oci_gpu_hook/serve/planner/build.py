"""The package on disk, as the planner sees it: the hash of its files that a front and a planner must agree on
(:func:`build_id`, in the version line) and the watch that tells a running planner its files changed
(:class:`PackageWatch`, after which it refuses every request and exits)."""

from __future__ import annotations

import os
import sys


def build_id(package_dir: str | None = None) -> str:
    """A hash of the package's files (every .py and .c below it, by path and content) and of the interpreter's
    version: two installs agree on it exactly when they run the same code."""
    import hashlib

    root = package_dir or os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    digest = hashlib.sha256(sys.version.encode())
    found = []
    for directory, subdirs, files in os.walk(root):
        subdirs[:] = sorted(d for d in subdirs if d != "__pycache__")
        found.extend(os.path.join(directory, f) for f in files if f.endswith((".py", ".c")))
    for path in sorted(found):
        with open(path, "rb") as handle:
            data = handle.read()
        digest.update(os.path.relpath(path, root).encode() + b"\0" + str(len(data)).encode() + b"\0" + data)
    return digest.hexdigest()[:24]


class PackageWatch:
    """Whether any file of the package changed since the watch began: inotify on every file of it and every
    directory (but __pycache__, which Python itself writes), shared by the planner and its workers and never read,
    so that one change makes it readable for good.  A file written, truncated, renamed over or away, deleted, or
    its mode changed is seen (a rename over a file or its removal changes its link count); a file added beside the
    others is not, but no upgrade adds a module without changing one that imports it.  Where inotify cannot be
    had, a stamp of every file (inode, size, times) compared on each request."""

    FILE_MASK = 0x2 | 0x4 | 0x8 | 0x400 | 0x800  # IN_MODIFY, IN_ATTRIB, IN_CLOSE_WRITE, IN_DELETE_SELF, IN_MOVE_SELF
    DIR_MASK = 0x400 | 0x800

    def __init__(self, root: str | None = None) -> None:
        import ctypes

        self.root = root or os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        self.fd = -1
        self.stamp: list[tuple[str, tuple[int, ...]]] = []
        libc = ctypes.CDLL(None, use_errno=True)
        fd = libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
        ok = fd >= 0
        for directory, subdirs, files in os.walk(self.root):
            subdirs[:] = [d for d in subdirs if d != "__pycache__"]
            for path, mask in [(directory, self.DIR_MASK), *((os.path.join(directory, f), self.FILE_MASK)
                                                              for f in files)]:
                if ok and libc.inotify_add_watch(fd, os.fsencode(path), mask) < 0:
                    ok = False
        if ok:
            self.fd = fd
        else:
            if fd >= 0:
                os.close(fd)
            self.stamp = self._stamp()

    def _stamp(self) -> list[tuple[str, tuple[int, ...]]]:
        found = []
        for directory, subdirs, files in os.walk(self.root):
            subdirs[:] = sorted(d for d in subdirs if d != "__pycache__")
            for name in sorted([".", *files]):
                path = os.path.join(directory, name)
                try:
                    st = os.stat(path)
                    found.append((path, (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)))
                except OSError:
                    found.append((path, ()))
        return found

    def changed(self) -> bool:
        if self.fd < 0:
            return self._stamp() != self.stamp
        import select

        return bool(select.select([self.fd], [], [], 0)[0])
