"""A resident planner for the tests: ``oci-gpu-hook serve`` on a private socket, started through a launcher as
``install``'s unit starts it, and a Python client that speaks the front's protocol."""

from __future__ import annotations

import os
import re
import signal
import socket
import struct
import subprocess
import threading
import time
from pathlib import Path

from oci_gpu_hook.serve import planner as planner_module

ANSWERED = re.compile(rb"planner: ok \d+ \(")  # serve --verbose: a request answered


class Planner:
    def __init__(self, launcher: Path, socket_path: Path, env: dict[str, str], workers: int = 4,
                 argv: list[str] | None = None) -> None:
        self.argv = argv or [str(launcher), "serve"]
        self.socket_path = socket_path
        self.env = env
        self.workers = workers
        self.process: subprocess.Popen[str] | None = None
        self.log = socket_path.parent.parent / f"planner-{os.getpid()}.log"

    def start(self, wait: bool = True) -> Planner:
        with open(self.log, "a") as log:
            self.process = subprocess.Popen([*self.argv, "--socket", str(self.socket_path), "--workers",
                                             str(self.workers)], env=self.env, stdout=log, stderr=log,
                                            start_new_session=True, text=True)
        if wait:
            self.wait_ready()
        return self

    def wait_ready(self, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        assert self.process is not None
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise AssertionError(f"the planner exited {self.process.returncode}: {self.log.read_text()}")
            if self.socket_path.exists():
                try:
                    with socket.socket(socket.AF_UNIX) as probe:
                        probe.connect(str(self.socket_path))
                    return
                except OSError:
                    pass
            time.sleep(0.02)
        raise AssertionError(f"the planner did not start: {self.log.read_text()}")

    def wait_answered(self, give_up: threading.Event, timeout: float = 120) -> bool:
        """Wait until the log says a request was answered (``serve --verbose`` writes one ``ok`` line for each);
        False where ``give_up`` is set first.  The planner exiting, or answering nothing in ``timeout`` seconds,
        is an error.  (A test that restarts the planner gives each one a log of its own: a worker of the last one,
        killed while it writes, never speaks for the new one.)"""
        deadline = time.monotonic() + timeout
        assert self.process is not None
        while not give_up.is_set():
            if ANSWERED.search(self.log.read_bytes()):
                return True
            if self.process.poll() is not None:
                raise AssertionError(f"the planner exited {self.process.returncode}: {self.log.read_text()}")
            if time.monotonic() > deadline:
                raise AssertionError(f"the planner answered nothing in {timeout} s: {self.log.read_text()[-4000:]}")
            time.sleep(0.01)
        return False

    def stop(self) -> int:
        if self.process is None:
            return 0
        if self.process.poll() is None:
            self.process.terminate()
        try:
            code = self.process.wait(timeout=60)
        finally:
            self.kill_group()
        self.process = None
        return code

    def kill_group(self) -> None:
        if self.process is not None:
            try:
                os.killpg(self.process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.process.wait()


def namespace_fds() -> list[int]:
    paths = ("/proc/self/ns/mnt", "/proc/self/ns/pid", "/proc/self/ns/cgroup", "/proc/self/ns/user")
    where = os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC
    return [*(os.open(p, os.O_RDONLY | os.O_CLOEXEC) for p in paths), os.open("/", where), os.open(".", where)]


def request_bytes(version: str, role: str, argv0: str, args: list[str], env: list[str], stdin: bytes | None,
                  baked_runtime: str = "") -> bytes:
    def field(data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + data

    body = b"".join(field(f.encode()) for f in (version, role, argv0, baked_runtime, str(os.getppid()), "18",
                                                 str(planner_module.securebits())))
    body += struct.pack(">I", len(args)) + b"".join(field(a.encode()) for a in args)
    body += struct.pack(">I", len(env)) + b"".join(field(e.encode()) for e in env)
    body += field(b"1" if stdin is not None else b"0") + field(stdin or b"")
    return planner_module.REQUEST_MAGIC + struct.pack(">I", len(body)) + body


def ask(socket_path: Path, data: bytes, fds: list[int] | None = None, timeout: float = 30, go: bool = True) -> bytes:
    """Send ``data`` (the descriptors with its first bytes), say GO when the planner is READY (``go``), and read until
    the planner closes: its answer (after STARTED), its refusal, or nothing."""
    with socket.socket(socket.AF_UNIX) as conn:
        conn.settimeout(timeout)
        conn.connect(str(socket_path))
        if fds:
            conn.sendmsg([data[:8]], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, struct.pack(f"{len(fds)}i", *fds))])
            conn.sendall(data[8:])
        else:
            conn.sendall(data)
        chunks = []
        try:
            first = conn.recv(len(planner_module.READY), socket.MSG_WAITALL)
            if first == planner_module.READY:
                if not go:
                    return first
                conn.sendall(planner_module.GO)
                started = conn.recv(len(planner_module.STARTED), socket.MSG_WAITALL)
                assert started == planner_module.STARTED, started
            else:
                chunks.append(first)
            conn.shutdown(socket.SHUT_WR)
            while chunk := conn.recv(1 << 16):
                chunks.append(chunk)
        except ConnectionResetError:  # it closed with our bytes unread: the kernel resets the connection
            pass
    return b"".join(chunks)
