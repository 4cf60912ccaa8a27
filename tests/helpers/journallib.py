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
from pathlib import Path


class Listener:
    """A bound AF_UNIX datagram socket at ``path``; :meth:`lines` takes what has arrived, without waiting."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(str(path))
        self.sock.setblocking(False)

    def lines(self) -> list[bytes]:
        got = []
        while True:
            try:
                got.append(self.sock.recv(1 << 16))
            except BlockingIOError:
                return got

    def close(self) -> None:
        self.sock.close()
        os.unlink(self.path)


def with_dev_log(argv: list[str], socket_path: Path, scratch: Path) -> list[str]:
    """``argv`` run where ``/dev/log`` is ``socket_path`` (see the top); ``scratch``: an empty directory for the
    overlay's tmpfs."""
    t = shlex.quote(str(scratch))
    script = (f"set -e; mount -t tmpfs none {t}; mkdir {t}/pts {t}/shm {t}/up {t}/work; "
              f"mount --rbind /dev/pts {t}/pts; mount --rbind /dev/shm {t}/shm; "
              f"mount -t overlay overlay -o lowerdir=/dev,upperdir={t}/up,workdir={t}/work /dev; "
              f"mount --move {t}/pts /dev/pts; mount --move {t}/shm /dev/shm; "
              f"rm -f /dev/log; touch /dev/log; mount --bind {shlex.quote(str(socket_path))} /dev/log; set +e; "
              f"{shlex.join(argv)}")
    return ["unshare", "-m", "--propagation", "private", "sh", "-c", script]
