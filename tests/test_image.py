"""image/: the container image's recipe (image/build.sh, image/stage-env.sh) and the manifests that name it.

The build itself (two mmdebstrap roots, minutes) is .ci/run's, before the suite; tests/containers/test_image.py
runs the DaemonSet's containers from the built images (OCI_GPU_HOOK_IMAGE, docs/image.md).  Here, without a build:
the scripts parse, the image reference and the environment's path follow the package version (its one definition,
``oci_gpu_hook.__version__``), the fronts the build prebuilds are the DaemonSet's, an install without a compiler
writes a prebuilt front exactly when its baked header is the one it was built for, and the DaemonSet's shell
commands (copy-environment, remove-old-environments, nri's wait for the runtime's socket) run as written.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml

from oci_gpu_hook import __version__
from oci_gpu_hook.errors import HookError
from oci_gpu_hook.fastpath import build as fastbuild
from oci_gpu_hook.install import launchers
from oci_gpu_hook.install.paths import LAUNCHER_DIR
from oci_gpu_hook.pins import PINS_NAME

REPO = Path(__file__).resolve().parent.parent
BUILD = REPO / "image" / "build.sh"
STAGE = REPO / "image" / "stage-env.sh"
CHECK = REPO / "image" / "check.sh"
EXAMPLES = REPO / "examples" / "kubernetes"
IMAGE = "localhost/oci-gpu-hook"


def _recipe() -> dict[str, str]:
    """What image/build.sh --print says it builds (no root, no build)."""
    done = subprocess.run(["bash", str(BUILD), "--print"], capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    return dict(line.split("=", 1) for line in done.stdout.splitlines())


def test_scripts_parse() -> None:
    for script in (BUILD, CHECK):
        assert subprocess.run(["bash", "-n", str(script)], capture_output=True, timeout=30).returncode == 0
    assert subprocess.run(["sh", "-n", str(STAGE)], capture_output=True, timeout=30).returncode == 0
    if shutil.which("shellcheck"):
        done = subprocess.run(["shellcheck", "-S", "warning", str(BUILD), str(CHECK), str(STAGE)], capture_output=True,
                              text=True, timeout=60)
        assert done.returncode == 0, done.stdout


def test_recipe_follows_the_package_version() -> None:
    recipe = _recipe()
    assert recipe["version"] == __version__
    assert recipe["ref"] == f"{IMAGE}:{__version__}"
    assert recipe["env"] == f"{LAUNCHER_DIR}/env-{__version__}"
    # the wheel's version is the package's (pyproject.toml repeats it for setuptools)
    assert tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"] == __version__


def _images(document: object) -> list[str]:
    """Every ``image:`` value in a manifest."""
    if isinstance(document, dict):
        found = [document["image"]] if isinstance(document.get("image"), str) else []
        return found + [i for value in document.values() for i in _images(value)]
    if isinstance(document, list):
        return [i for value in document for i in _images(value)]
    return []


def test_manifests_name_the_image_of_this_version() -> None:
    """Every manifest that runs oci-gpu-hook names the image build.sh makes, by the package version's tag."""
    ref = _recipe()["ref"]
    named = {}
    for path in sorted(EXAMPLES.glob("*.yaml")):
        for image in (i for d in yaml.safe_load_all(path.read_text()) for i in _images(d)):
            if "oci-gpu-hook" in image:
                named.setdefault(path.name, set()).add(image)
    assert "daemonset.yaml" in named
    for name, images in named.items():
        assert images == {ref}, f"{name} names {images}, not {ref} (image/build.sh)"
    text = (EXAMPLES / "daemonset.yaml").read_text()
    assert "placeholder" not in text and "registry.example" not in text
    # the copied environment's directory, where install runs from, is the version's
    envs = set(re.findall(r"/usr/local/libexec/oci-gpu-hook/env-([0-9][^/\s.]*(?:\.[0-9]+)*)", text))
    assert envs == {__version__}, envs


def test_prebuilt_fronts_are_the_daemonsets() -> None:
    """The build prebuilds the fronts of the DaemonSet's install command: its --set arguments, exactly."""
    pod = yaml.safe_load((EXAMPLES / "daemonset.yaml").read_text())["spec"]["template"]["spec"]
    (installer,) = (c for c in pod["initContainers"] if c["name"] == "install")
    command = installer["command"]
    sets = [command[i + 1] for i, word in enumerate(command) if word == "--set"]
    assert sets and _recipe()["set"].split() == sets
    assert command[0] == f"{_recipe()['env']}/bin/python3"


def _compiler() -> str:
    cc = fastbuild.find_cc()
    if cc is None:
        pytest.skip("no C compiler: the prebuilt fronts cannot be made here")
    return cc


def test_install_without_a_compiler_takes_the_prebuilt_front(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    _compiler()
    monkeypatch.setattr(fastbuild, "PREBUILT_DIR", str(tmp_path / "prebuilt"))
    items = ["OCI_GPU_HOOK_ALLOW_ENV_REQUESTS=false"]
    written = launchers.prebuild_fronts(items, [])
    assert len(written) == len(launchers.LAUNCHERS) and all(Path(p).read_bytes()[:4] == b"\x7fELF" for p in written)
    monkeypatch.setattr(fastbuild, "find_cc", lambda: None)
    defaults = launchers.launcher_defaults(items, "install")
    files = dict(launchers.launcher_files(LAUNCHER_DIR, defaults, native=None, trust=True))
    prebuilt = {Path(p).read_bytes() for p in written}
    for name, _module in launchers.LAUNCHERS:
        assert files[f"{LAUNCHER_DIR}/{name}"] in prebuilt  # the front, from the package, not compiled
        assert files[f"{LAUNCHER_DIR}/{name}.py"].startswith(b"#!")
    assert "no C compiler" not in capsys.readouterr().err
    # another install (another --set) has another header: no prebuilt front, the Python launchers with a note
    other = launchers.launcher_defaults(["OCI_GPU_HOOK_ALLOW_ENV_REQUESTS=true"], "install")
    files = dict(launchers.launcher_files(LAUNCHER_DIR, other, native=None, trust=True))
    pins = files.pop(f"{LAUNCHER_DIR}/{PINS_NAME}")  # beside every launcher: docs/security.md
    assert set(files) == {f"{LAUNCHER_DIR}/{name}" for name, _ in launchers.LAUNCHERS}
    assert all(data.startswith(b"#!") for data in files.values()) and not pins.startswith(b"#!")
    assert "no C compiler found" in capsys.readouterr().err
    with pytest.raises(HookError, match="no C compiler found"):
        launchers.launcher_files(LAUNCHER_DIR, other, native=True, trust=True)
    # a prebuilt front of another front.c (an upgrade's source) is not taken
    monkeypatch.setattr(fastbuild, "front_key", lambda header: "0" * 64)
    files = dict(launchers.launcher_files(LAUNCHER_DIR, defaults, native=None, trust=True))
    files.pop(f"{LAUNCHER_DIR}/{PINS_NAME}")
    assert all(data.startswith(b"#!") for data in files.values())


def _container(name: str) -> dict[str, object]:
    pod = yaml.safe_load((EXAMPLES / "daemonset.yaml").read_text())["spec"]["template"]["spec"]
    (found,) = (c for c in [*pod["initContainers"], *pod["containers"]] if c["name"] == name)
    return found  # type: ignore[no-any-return]


@pytest.mark.root("unshare")
def test_copy_environment_refuses_an_image_of_another_version(tmp_path: Path) -> None:
    """The DaemonSet's copy-environment command, run as written (a private mount namespace whose /opt/oci-gpu-hook
    is a tree made here as the image's environment, and whose launchers' directory is another): an image of this
    version is copied to env-VERSION; an image of another version (`kubectl set image` alone, seen on a real node
    as the trap it is: install and the planner would run the old env-VERSION the commands name, the device plugin
    the new image) stops the pod with one line, copying nothing, also where env-VERSION is there already."""
    command = _container("copy-environment")["command"]
    assert command[:2] == ["/bin/sh", "-c"]
    libexec = tmp_path / "libexec"
    libexec.mkdir()

    def run(image_version: str) -> subprocess.CompletedProcess[str]:
        image = tmp_path / f"image-{image_version}"
        package = image / "lib" / "python3.11" / "site-packages" / "oci_gpu_hook"
        package.mkdir(parents=True, exist_ok=True)
        (package / "__init__.py").write_text(f'"""doc"""\n\n__version__ = "{image_version}"\n')
        script = (f"mount -t tmpfs -o mode=755 tmpfs /usr/local && mkdir -p {LAUNCHER_DIR} && "
                  f"mount --bind {libexec} {LAUNCHER_DIR} && mount -t tmpfs -o mode=755 tmpfs /opt && "
                  f"mkdir /opt/oci-gpu-hook && mount --bind {image} /opt/oci-gpu-hook && exec sh -c \"$1\"")
        return subprocess.run(["unshare", "-m", "sh", "-c", script, "sh", command[2]], capture_output=True,
                              text=True, timeout=60, check=False)

    other = __version__ + ".1"
    done = run(other)
    assert done.returncode == 1 and done.stdout == "", done
    assert done.stderr == (f"copy-environment: this image does not hold oci-gpu-hook {__version__}, the version this "
                           f"DaemonSet's commands name (env-{__version__}): set every {__version__} in the DaemonSet "
                           "to the image's version, not only the images (docs/image.md, Upgrade)\n")
    assert os.listdir(libexec) == []
    done = run(__version__)
    assert done.returncode == 0, done.stderr
    assert os.listdir(libexec) == [f"env-{__version__}"]
    assert (libexec / f"env-{__version__}" / "lib" / "python3.11" / "site-packages" / "oci_gpu_hook"
            / "__init__.py").read_text().endswith(f'__version__ = "{__version__}"\n')
    done = run(other)  # env-VERSION there already: still refused
    assert done.returncode == 1 and "this image does not hold" in done.stderr, done
    assert os.listdir(libexec) == [f"env-{__version__}"]


@pytest.mark.root("flock", "unshare")
def test_remove_old_environments_takes_only_what_nothing_uses(tmp_path: Path) -> None:
    """The DaemonSet's remove-old-environments command, run as written (the manifest's, in a private mount namespace
    whose launchers' directory is a tree made here): of the environments of other versions it removes the one no
    launcher names, no process maps and no planner holds, keeps the one a launcher names, the one a running process
    maps a file of, the one whose lock (.in-use-env-VERSION, beside it) a planner holds (a shared flock, as the
    manifest's planner command takes it), its own, a half copy (.tmp) and a link; it clears what an interrupted run
    left (.removing-*).  The planner's command takes the shared lock of its own version."""
    planner = _container("planner")["command"]
    assert planner[:2] == ["/bin/sh", "-c"]
    assert f"{LAUNCHER_DIR}/.in-use-env-{__version__} && flock -s 9 &&" in planner[2]
    command = _container("remove-old-environments")["command"]
    assert command[:2] == ["/bin/sh", "-c"]
    tree = tmp_path / "libexec"
    for env in (f"env-{__version__}", "env-0.0.1", "env-0.0.2", "env-0.0.3", "env-0.0.4.tmp", ".removing-env-0.0.5"):
        (tree / env / "bin").mkdir(parents=True)
        (tree / env / "bin" / "python3").write_text("")
    (tree / "env-0.0.6").symlink_to(tree / "env-0.0.3")
    (tree / "env-0.0.7" / "bin").mkdir(parents=True)
    shutil.copy("/bin/sleep", tree / "env-0.0.7" / "bin" / "sleep")
    (tree / "oci-gpu-hook").write_bytes(b"\x7fELF\0" + f"{LAUNCHER_DIR}/env-0.0.1/bin/python3\0".encode())
    (tree / "oci-gpu-hook.py").write_text(f"#!{LAUNCHER_DIR}/env-{__version__}/bin/python3\n")
    script = (f"mount -t tmpfs -o mode=755 tmpfs /usr/local && mkdir -p {LAUNCHER_DIR} && "
              f"mount --bind {tree} {LAUNCHER_DIR} && "
              # a process runs from 0.0.7 (a Python launcher still running, say: it maps a file of it)
              f"{{ {LAUNCHER_DIR}/env-0.0.7/bin/sleep 600 & }} && sleeper=$! && "
              # this shell is a planner of 0.0.2: it holds that environment (the manifest's way: fd 9, shared)
              f"exec 9>>{LAUNCHER_DIR}/.in-use-env-0.0.2 && flock -s 9 && sh -c \"$1\" 9>&-; rc=$?; "
              "kill $sleeper; exit $rc")
    done = subprocess.run(["unshare", "-m", "sh", "-c", script, "sh", command[2]], capture_output=True, text=True,
                          timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    out = done.stdout
    # the environments' locks lie beside them, never in them (an environment's entries are pinned): the held one
    # stays, the removed one's goes with it
    assert sorted(os.listdir(tree)) == sorted([f"env-{__version__}", "env-0.0.1", "env-0.0.2", "env-0.0.4.tmp",
                                               "env-0.0.6", "env-0.0.7", "oci-gpu-hook", "oci-gpu-hook.py",
                                               ".in-use-env-0.0.2"]), out
    assert not (tree / "env-0.0.2" / ".in-use").exists()
    assert "removed env-0.0.3" in out and "kept env-0.0.2: a planner runs from it" in out, out
    assert "kept env-0.0.7: a process runs from it" in out, out


@pytest.mark.root("flock", "unshare")
def test_the_nri_container_waits_for_the_runtimes_socket(tmp_path: Path) -> None:
    """The nri container's command, run as written (a private mount namespace: the launchers' directory a tree made
    here whose launcher prints its arguments, /run a tmpfs of its own): without the NRI socket (containerd 1.6) it
    says so once and waits, holding its environment's lock; once the runtime's socket is there it runs the
    launcher's ``nri``."""
    from oci_gpu_hook.serve.nri import plugin

    script = _container("nri")["command"][2]
    tree = tmp_path / "libexec"
    (tree / f"env-{__version__}").mkdir(parents=True)
    launcher = tree / "oci-gpu-hook"
    launcher.write_text('#!/bin/sh\necho "launcher: $*"\n')
    launcher.chmod(0o755)
    fifo, out = tmp_path / "err", tmp_path / "out"
    os.mkfifo(fifo)
    lock = f"{LAUNCHER_DIR}/.in-use-env-{__version__}"
    make_socket = f"import socket; socket.socket(socket.AF_UNIX).bind({plugin.DEFAULT_SOCKET!r})"
    run = (f"mount -t tmpfs -o mode=755 tmpfs /usr/local && mkdir -p {LAUNCHER_DIR} && "
           f"mount --bind {tree} {LAUNCHER_DIR} && mount -t tmpfs -o mode=755 tmpfs /run && mkdir -p /run/nri && "
           f'{{ sh -c "$1" 2>{fifo} >{out} & }} && exec 3<{fifo} && read -r line <&3 && echo "$line" && '
           # waiting: its environment's lock is held (an exclusive one is refused)
           f"! flock -nx {lock} true && {sys.executable} -c \"$2\" && wait $!")
    done = subprocess.run(["unshare", "-m", "sh", "-c", run, "sh", script, make_socket], capture_output=True,
                          text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout == ("nri: no NRI socket at /var/run/nri/nri.sock (NRI of containerd 2.x or CRI-O): waiting "
                           "for one\n"), done.stdout
    assert out.read_text() == f"launcher: nri --socket {plugin.DEFAULT_SOCKET}\n"
