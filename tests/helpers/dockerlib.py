"""A real dockerd for the tests: its own data-root, exec-root, pidfile and socket, the busybox probe image, and
``docker run`` of the probe."""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

from tests.helpers import containerlib as cl

DOCKER = "/usr/bin/docker"  # Debian's client, the same version as dockerd
IMAGE = "ogh-busybox:test"
# The operator's daemon.json; its deprecated-key-path keeps dockerd 20.10 from writing /etc/docker/key.json.
OPERATOR_DAEMON_JSON = '{\n  "log-level": "warn",\n  "storage-driver": "vfs",\n  "deprecated-key-path": "KEY"\n}\n'
RUNTIME = "/usr/local/libexec/oci-gpu-hook/oci-gpu-runtime"


class Dockerd:
    """dockerd with its own data-root, exec-root, pidfile and socket under ``base``.  With ``prefix``: it reads
    PREFIX/etc/docker/daemon.json and runs with PREFIX/usr/local overlaid on /usr/local; with ``enter`` (a
    command prefix that enters a private root, tests/helpers/wheellib.py): it runs there and reads that root's
    /etc/docker/daemon.json, its default."""

    def __init__(self, base: Path, prefix: Path | None, enter: list[str] | None = None) -> None:
        self.base, self.prefix, self.enter = base, prefix, enter
        self.socket = base / "docker.sock"
        self.pidfile = base / "docker.pid"
        self.log = base / "dockerd.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        argv = ["dockerd", "--data-root", str(self.base / "data"), "--exec-root", str(self.base / "exec"),
                "--pidfile", str(self.pidfile), "-H", f"unix://{self.socket}",
                "--iptables=false", "--bridge=none", "--ip-masq=false"]
        if self.enter is not None:
            command = [*self.enter, *argv]
        else:
            assert self.prefix is not None
            upper, work = self.prefix / "usr" / "local", self.base / "ovl-work"
            work.mkdir()
            argv += ["--config-file", str(self.prefix / "etc/docker/daemon.json")]
            script = (f"mount -t overlay overlay -o lowerdir=/usr/local,upperdir={upper},workdir={work} /usr/local"
                      f" && exec {cl._quoted(argv)}")
            command = ["unshare", "-m", "sh", "-c", script]
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(command, stdout=log, stderr=log)
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"dockerd exited: {self.log.read_text()[-3000:]}")
            if self.docker("version").returncode == 0:
                return
            time.sleep(0.3)
        raise AssertionError(f"dockerd did not come up: {self.log.read_text()[-3000:]}")

    def docker(self, *args: str, timeout: int = 120) -> subprocess.CompletedProcess[str]:
        return cl.run([DOCKER, "-H", f"unix://{self.socket}", *args], env=cl.hook_env(), timeout=timeout)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()



def run(dockerd: Dockerd, *env: str, runtime: str | None = "oci-gpu",
        gpus: str | None = None) -> subprocess.CompletedProcess[str]:
    args = [arg for item in env for arg in ("-e", item)]
    if runtime is not None:
        args += ["--runtime", runtime]
    if gpus is not None:
        args += ["--gpus", gpus]
    return dockerd.docker("run", "--rm", "--network", "none", "--cap-add", "MKNOD",
                          "--tmpfs", "/tmp:rw,dev,exec", *args, IMAGE, "/bin/sh", "/probe.sh")
