"""A syslog socket of the test's own in place of the system journal's ``/dev/log``.

:class:`Listener` binds a datagram socket in the test's directory and collects what arrives;
:func:`with_dev_log` runs a command in a private mount namespace where ``/dev`` is an overlay of the host's
(its upper layer a tmpfs, /dev/pts and /dev/shm moved back in) with that socket bind-mounted on ``/dev/log``:
the hooks and shims the command starts write their journal lines to the test, and nothing is made on the
host's /dev (a file made on devtmpfs in any namespace is made on the host).
"""

from __future__ import annotations

import os
import shlex
import socket
import struct
from pathlib import Path
from typing import NamedTuple


class Sender(NamedTuple):
    pid: int
    uid: int
    gid: int


class Listener:
    """A bound AF_UNIX datagram socket at ``path``; :meth:`lines` takes what has arrived, without waiting.

    ``credentials``: the socket also takes each sender's credentials, as journald does (``SO_PASSCRED``): the
    kernel's, translated into this process's user namespace, so a line sent by root inside a rootless user
    namespace carries the real uid of that user; :meth:`received` gives them with each line.  ``mode``: the
    socket file's (0o666: any user may send, as to ``/dev/log``)."""

    def __init__(self, path: Path, *, credentials: bool = False, mode: int | None = None) -> None:
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        if credentials:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
        self.sock.bind(str(path))
        if mode is not None:
            os.chmod(path, mode)
        self.sock.setblocking(False)

    def lines(self) -> list[bytes]:
        return [data for data, _sender in self.received()]

    def received(self) -> list[tuple[bytes, Sender | None]]:
        """Each datagram that has arrived, with its sender (pid, uid, gid) where the socket takes credentials."""
        got: list[tuple[bytes, Sender | None]] = []
        space = socket.CMSG_SPACE(struct.calcsize("3i"))
        while True:
            try:
                data, ancillary, _flags, _address = self.sock.recvmsg(1 << 16, space)
            except BlockingIOError:
                return got
            sender = None
            for level, kind, payload in ancillary:
                if level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS:
                    sender = Sender(*struct.unpack("3i", payload[:struct.calcsize("3i")]))
            got.append((data, sender))

    def close(self) -> None:
        self.sock.close()
        os.unlink(self.path)


def dev_overlay_lines(scratch: Path, socket_path: Path | None = None) -> list[str]:
    """Shell lines (``sh -e``, in a private mount namespace) that put an overlay on ``/dev`` whose upper layer is a
    tmpfs mounted on ``scratch`` (an empty directory), /dev/pts and /dev/shm moved back in: nodes and files made in
    /dev after them stay in the namespace.  With ``socket_path``, that socket is bind-mounted on ``/dev/log``."""
    t = shlex.quote(str(scratch))
    lines = [f"mount -t tmpfs none {t}", f"mkdir {t}/pts {t}/shm {t}/up {t}/work",
             f"mount --rbind /dev/pts {t}/pts", f"mount --rbind /dev/shm {t}/shm",
             f"mount -t overlay overlay -o lowerdir=/dev,upperdir={t}/up,workdir={t}/work /dev",
             f"mount --move {t}/pts /dev/pts", f"mount --move {t}/shm /dev/shm"]
    if socket_path is not None:
        lines += ["rm -f /dev/log", "touch /dev/log", f"mount --bind {shlex.quote(str(socket_path))} /dev/log"]
    return lines


def with_dev_log(argv: list[str], socket_path: Path, scratch: Path) -> list[str]:
    """``argv`` run where ``/dev/log`` is ``socket_path`` (see the top); ``scratch``: an empty directory for the
    overlay's tmpfs."""
    script = "set -e; " + "; ".join(dev_overlay_lines(scratch, socket_path)) + f"; set +e; {shlex.join(argv)}"
    return ["unshare", "-m", "--propagation", "private", "sh", "-c", script]
