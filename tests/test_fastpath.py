"""The native front (oci_gpu_hook/fastpath/front.c): whenever the Python path would grant a device, the front
reaches it; when it certainly would not, Python does not start.

The oracle is the Python launcher of the same install (``--no-native``): for every hostile input the front's
output and exit status must equal Python's.  A marker written by the front's Python launcher tells whether
Python ran.  The container tests run real runc containers through the shim and the prestart hook.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from oci_gpu_hook.fastpath import build as fastbuild
from oci_gpu_hook.install import launchers
from tests.helpers import containerlib as cl
from tests.helpers import imageenvs

pytestmark = pytest.mark.skipif(fastbuild.find_cc() is None, reason="no C compiler")

REQUEST = "AMD_VISIBLE_DEVICES=1"


def esc(text: str) -> str:
    """Every character as a JSON \\u escape."""
    return "".join(f"\\u{ord(c):04x}" for c in text)


def spec_text(env: list[str] | None = None, annotations: dict[str, str] | None = None) -> str:
    spec = {"ociVersion": "1.0.2", "process": {"args": ["/bin/true"], "env": ["PATH=/bin", *(env or [])]},
            "root": {"path": "rootfs"}}
    if annotations is not None:
        spec["annotations"] = annotations
    return json.dumps(spec)


def plain(env: list[str] | None = None, annotations: dict[str, str] | None = None) -> str:
    return spec_text(env, annotations)


# (name, config.json text) that the Python path grants; each is a request spelled so that a naive scan misses it
GRANTED = {
    "plain": plain([REQUEST]),
    "escaped-underscore": plain(["X"]).replace('"X"', '"AMD\\u005fVISIBLE_DEVICES=1"'),
    "split-by-escape": plain(["X"]).replace('"X"', '"\\u0041MD_VISIBLE_DEV\\u0049CES=1"'),
    "all-escaped": plain(["X"]).replace('"X"', '"' + esc(REQUEST) + '"'),
    "annotation-only": plain(annotations={"cdi.k8s.io/x": "amd.com/gpu=1"}),
    "annotation-escaped-slash": plain(annotations={"K": "amd.com/gpu=1"}).replace('"K"', '"cdi.k8s.io\\/x"'),
    "annotation-escaped-key": plain(annotations={"K": "amd.com/gpu=1"}).replace('"K"', '"' + esc("cdi.k8s.io/x") + '"'),
    "annotation-escaped-value": plain(annotations={"cdi.k8s.io/x": "V"}).replace('"V"',
                                                                                 f'"{esc("amd.com/gpu=1")}"'),
    "huge": plain([REQUEST], {"padding": "p" * (20 << 20)}),
    "cuda-image-and-amd": plain([*imageenvs.CUDA_BASE, REQUEST]),  # NVIDIA_VISIBLE_DEVICES=all: none here, noted
}
# Inputs the Python path does not grant (or refuses); the front may hand over or not, the result must agree
OTHER = {
    # repeated keys: the Python path refuses them (runc would merge the two); the front must hand over
    "duplicate-key-last-wins": '{"process": {"env": []}, "process": {"env": ["AMD_VISIBLE_DEVICES=1"]}}',

    "clean": plain(["FOO=1"]),
    "cuda-image": plain(imageenvs.CUDA_BASE),  # all of a kind the seed host lacks: nothing granted, noted
    "rocm-image": plain(imageenvs.ROCM),
    "lower-case-name": plain(["amd_visible_devices=1"]),
    "key-other-case": '{"Process": {"Env": ["AMD_VISIBLE_DEVICES=1"]}}',
    "duplicate-key-first": '{"process": {"env": ["AMD_VISIBLE_DEVICES=1"]}, "process": {"env": []}}',
    "request-none": plain(["AMD_VISIBLE_DEVICES=none"]),
    "unrelated-escape": plain(["A=\\u00e9"]).replace("\\\\u", "\\u"),
    "name-in-args": plain(["FOO=AMD_VISIBLE_DEVICES"]),
    "not-json": '{"process": ',
    "not-an-object": "[1, 2]",
    "nul": '{"a": "\x00"}',
    "bom": "\ufeff" + plain(),
    "trailing-garbage": plain() + " x",
    "deep": "[" * 5000 + "]" * 5000,
}


@pytest.fixture(scope="module")
def install(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return make_install(tmp_path_factory.mktemp("fastpath"))


def make_install(base: Path, request_env: str = 'intel = ["MY_INTEL_GPUS"]') -> dict[str, Path]:
    config = base / "config.toml"
    hook_path = base / "native" / "oci-gpu-hook"
    config.write_text(f'sysfs_root = "{cl.SEED_SYSFS}"\nhook_path = "{hook_path}"\n'
                      f'by_path_dir = "{base / "by-path"}"\n[request_env]\n{request_env}\n')
    defaults = {"OCI_GPU_HOOK_CONFIG": str(config)}
    launchers.write_launchers(str(base / "native"), defaults, native=True)
    launchers.write_launchers(str(base / "python"), defaults, native=False)
    marker = base / "python-ran"
    for name in ("oci-gpu-hook.py", "oci-gpu-runtime.py"):
        script = base / "native" / name
        first, rest = script.read_text().split("\n", 1)
        script.write_text(f"{first}\nopen({str(marker)!r}, 'a').write('ran\\n')\n{rest}")
    return {"base": base, "config": config, "native": base / "native", "python": base / "python", "marker": marker}


def ran_python(install: dict[str, Path]) -> bool:
    ran = install["marker"].exists()
    if ran:
        install["marker"].unlink()
    return ran


def precreate(directory: Path, text: bytes) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([str(directory / "oci-gpu-hook"), "precreate"], input=text, capture_output=True,
                          env=cl.hook_env(), timeout=120)


@pytest.mark.parametrize("name", sorted(GRANTED))
def test_precreate_reaches_python_for_every_request(install: dict[str, Path], name: str) -> None:
    text = GRANTED[name].encode()
    python = precreate(install["python"], text)
    assert python.returncode == 0, python.stderr
    assert b"/dev/dri/renderD129" in python.stdout  # the oracle grants
    ran_python(install)
    front = precreate(install["native"], text)
    assert ran_python(install)
    assert (front.returncode, front.stdout) == (python.returncode, python.stdout)


@pytest.mark.parametrize("name", sorted(OTHER))
def test_precreate_agrees_with_python(install: dict[str, Path], name: str) -> None:
    text = OTHER[name].encode()
    python = precreate(install["python"], text)
    ran_python(install)
    front = precreate(install["native"], text)
    fast = not ran_python(install)
    assert front.returncode == python.returncode
    assert front.stdout == python.stdout or (fast and front.stdout == text)
    if name == "clean":
        assert fast and front.stdout == text


def test_precreate_non_utf8_and_custom_names(install: dict[str, Path]) -> None:
    text = plain(["FOO=\udcff"]).encode("utf-8", "surrogateescape").replace(b"\\udcff", b"\xff")
    assert b"\xff" in text
    python, front = precreate(install["python"], text), precreate(install["native"], text)
    assert (front.returncode, front.stdout) == (python.returncode, python.stdout)
    custom = plain(["MY_INTEL_GPUS=0"]).encode()  # request_env of the config file, intel: names a GPU the host lacks
    python, front = precreate(install["python"], custom), precreate(install["native"], custom)
    assert python.returncode != 0 and b"intel" in python.stderr
    assert (front.returncode, front.stderr) == (python.returncode, python.stderr)


def test_precreate_beyond_the_size_limit(install: dict[str, Path]) -> None:
    """Over the front's 64 MiB: Python gets all of stdin, and the outcome is Python's."""
    text = plain([REQUEST], {"padding": "p" * (65 << 20)}).encode()
    front = precreate(install["native"], text)
    assert ran_python(install)
    assert front.returncode == 0 and b"renderD129" in front.stdout, front.stderr


def test_first_launcher_baked_after_a_config_write_is_fast(tmp_path: Path) -> None:
    """Baking reads the config file, which moves its access time (relatime): the stamp must not care, nor about
    any later read."""
    install = make_install(tmp_path)
    clean_spec = plain(["FOO=1"]).encode()
    for _ in range(2):
        assert precreate(install["native"], clean_spec).stdout == clean_spec
        assert not ran_python(install)
        bundle = tmp_path / "bundle"
        bundle.mkdir(exist_ok=True)
        (bundle / "config.json").write_bytes(clean_spec)
        fake = tmp_path / "fake-runc"
        fake.write_text("#!/bin/sh\necho fake\n")
        fake.chmod(0o755)
        done = subprocess.run([str(install["native"] / "oci-gpu-runtime"), "create", "--bundle", str(bundle), "c1"],
                              capture_output=True, text=True, env={**cl.hook_env(), "OCI_GPU_HOOK_RUNTIME": str(fake)},
                              timeout=60)
        assert (done.returncode, done.stdout) == (0, "fake\n"), done.stderr
        assert not ran_python(install)
        install["config"].read_bytes()  # another reader


def test_same_size_edit_with_the_times_put_back_goes_to_python(tmp_path: Path) -> None:
    """An edit that keeps the size, with atime and mtime put back as they were: the content tells."""
    install = make_install(tmp_path, 'amd = ["MY_GPUS_A"]')
    config = install["config"]
    before = config.stat()
    config.write_text(config.read_text().replace("MY_GPUS_A", "MY_GPUS_B"))
    os.utime(config, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert config.stat().st_size == before.st_size
    front = precreate(install["native"], plain(["MY_GPUS_B=1"]).encode())
    assert ran_python(install)
    assert front.returncode == 0 and b"renderD129" in front.stdout, front.stderr


COARSE = r"""
import json, os, subprocess, sys, time
from oci_gpu_hook.fastpath import build as fastbuild
from oci_gpu_hook.install import launchers
image, mount, base, sysfs = sys.argv[1:]
subprocess.run(["mount", "-o", "loop", image, mount], check=True)
config = os.path.join(mount, "config.toml")
defaults = {"OCI_GPU_HOOK_CONFIG": config}
for attempt in range(10):
    while time.time() % 1 > 0.3:  # start early in a second: the write, the bake and the edit fit in it
        time.sleep(0.02)
    with open(config, "w") as handle:
        handle.write(f'sysfs_root = "{sysfs}"\nhook_path = "/bin/true"\n[request_env]\namd = ["MY_GPUS_A"]\n')
    st = os.stat(config)
    headers = {name: fastbuild.front_header(name, base, defaults, False) for name in fastbuild.ROLES}
    with open(config, "r+") as handle:  # the same size, the same second
        text = handle.read()
        handle.seek(0)
        handle.write(text.replace("MY_GPUS_A", "MY_GPUS_B"))
    after = os.stat(config)
    keys = ("st_dev", "st_ino", "st_size", "st_mode", "st_uid", "st_mtime_ns", "st_ctime_ns")
    if all(getattr(st, k) == getattr(after, k) for k in keys):
        break
else:
    sys.exit("no edit within one second of the bake")
fastbuild.front_header = lambda name, *args: headers[name]
launchers.write_launchers(base, defaults, native=True, trust=False)
spec = json.dumps({"process": {"env": ["MY_GPUS_B=1"]}, "root": {"path": "r"}}).encode()
done = subprocess.run([os.path.join(base, "oci-gpu-hook"), "precreate"], input=spec, capture_output=True,
                      env={"PATH": os.environ["PATH"],
                           "OCI_GPU_HOOK_BY_PATH_DIR": os.environ["OCI_GPU_HOOK_BY_PATH_DIR"]})
print(json.dumps({"stat_equal": True, "ns": after.st_mtime_ns % 10**9, "status": done.returncode,
                  "stdout": done.stdout.decode(), "stderr": done.stderr.decode()}))
"""


@pytest.mark.root  # mounts a filesystem (in a private mount namespace)
def test_same_size_edit_in_the_same_second_on_whole_second_timestamps(tmp_path: Path) -> None:
    """ext4 with 128-byte inodes keeps whole-second times: an edit of the same size in the same second as the bake
    leaves every stat field as it was (checked), and the front still sees it and hands over (a grant, not the
    stale names' pass-through)."""
    cl.need("unshare", "mkfs.ext4", "mount")
    image, mount = tmp_path / "coarse.img", tmp_path / "mnt"
    mount.mkdir()
    with image.open("wb") as handle:
        handle.truncate(8 << 20)
    subprocess.run(["mkfs.ext4", "-q", "-F", "-I", "128", str(image)], check=True, capture_output=True)
    done = subprocess.run(["unshare", "-m", "--propagation", "private", sys.executable, "-c", COARSE, str(image),
                           str(mount), str(tmp_path / "bin"), str(cl.SEED_SYSFS)], capture_output=True, text=True,
                          cwd=cl.REPO, timeout=300)
    if done.returncode != 0 and "mount" in done.stderr and "loop" in done.stderr:
        pytest.skip(f"no loop mount here: {done.stderr.strip()[-200:]}")
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.splitlines()[-1])
    assert result["stat_equal"] and result["ns"] == 0  # whole seconds, and a stat stamp would have matched
    assert result["status"] == 0 and "renderD129" in result["stdout"], result


@pytest.mark.root  # makes files owned by another user
@pytest.mark.parametrize("how", ["file-o+w", "file-owner", "dir-g+w", "link-to-theirs"])
def test_config_made_untrusted_after_the_bake(tmp_path: Path, how: str) -> None:
    """The front checks the config as config.check_trusted does: a config made writable or handed to another user
    after the launchers were written is never acted upon by either launcher, alike: a container asking nothing
    passes untouched with one warning, one asking for a GPU is refused (the rule in oci_gpu_hook/config.py)."""
    etc = tmp_path / "etc"
    etc.mkdir()
    config = etc / "config.toml"
    fake = tmp_path / "fake-runc"
    fake.write_text('#!/bin/sh\necho "fake-runc $*"\n')
    fake.chmod(0o755)
    config.write_text(f'sysfs_root = "{cl.SEED_SYSFS}"\nruntime = "{fake}"\n')
    config.chmod(0o644)
    defaults = {"OCI_GPU_HOOK_CONFIG": str(config)}
    launchers.write_launchers(str(tmp_path / "native"), defaults, native=True)
    launchers.write_launchers(str(tmp_path / "python"), defaults, native=False)
    clean_spec = plain(["FOO=1"]).encode()
    assert precreate(tmp_path / "native", clean_spec).stdout == clean_spec
    if how == "file-o+w":
        config.chmod(0o646)
    elif how == "file-owner":
        os.chown(config, 65534, 65534)
    elif how == "dir-g+w":
        etc.chmod(0o775)
    else:
        theirs = tmp_path / "theirs"
        theirs.mkdir()
        (theirs / "config.toml").write_bytes(config.read_bytes())
        os.chown(theirs, 65534, 65534)
        config.unlink()
        config.symlink_to(theirs / "config.toml")
    native, python = precreate(tmp_path / "native", clean_spec), precreate(tmp_path / "python", clean_spec)
    assert (python.returncode, python.stdout) == (0, clean_spec) and b"warning: " in python.stderr
    assert b"not trusted" in python.stderr and b"asks for no GPU" in python.stderr
    assert (native.returncode, native.stdout, native.stderr) == (python.returncode, python.stdout, python.stderr)
    asking = plain([REQUEST]).encode()
    native, python = precreate(tmp_path / "native", asking), precreate(tmp_path / "python", asking)
    assert (python.returncode, python.stdout) == (1, b"") and b"error: " in python.stderr
    assert b"not trusted" in python.stderr
    assert (native.returncode, native.stdout, native.stderr) == (python.returncode, python.stdout, python.stderr)
    # a pass-through command still reaches the runtime the bytes name, through either launcher
    for kind in ("native", "python"):
        done = subprocess.run([str(tmp_path / kind / "oci-gpu-runtime"), "state", "c1"], capture_output=True,
                              text=True, env=cl.hook_env(), timeout=60)
        assert (done.returncode, done.stdout) == (0, "fake-runc state c1\n"), (kind, done.stderr)


@pytest.mark.root  # makes files owned by another user
@pytest.mark.parametrize("how", ["file-o+w", "file-owner", "dir-g+w", "link-to-theirs", "on-path-dir-o+w"])
def test_a_runtime_that_fails_the_code_rule_is_never_run(tmp_path: Path, how: str) -> None:
    """The runtime the shim execs runs with the shim's privilege (root's, for root's containers): it is code, so it
    passes the trust rule as the interpreter does, along its whole path, or it is not run: the native front hands
    over and Python refuses with one line naming it, for a pass-through command and a create alike, the same
    bytes from either launcher.  Found on PATH, the first match is the one checked (never one further on)."""
    etc = tmp_path / "etc"
    etc.mkdir()
    marker = tmp_path / "ran"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "fake-runc"
    fake.write_text(f'#!/bin/sh\necho ran >> {marker}\necho "fake-runc $*"\n')
    fake.chmod(0o755)
    config = etc / "config.toml"
    named = "fake-runc" if how == "on-path-dir-o+w" else str(fake)
    config.write_text(f'sysfs_root = "{cl.SEED_SYSFS}"\nruntime = "{named}"\n')
    config.chmod(0o644)
    defaults = {"OCI_GPU_HOOK_CONFIG": str(config)}
    launchers.write_launchers(str(tmp_path / "native"), defaults, native=True)
    launchers.write_launchers(str(tmp_path / "python"), defaults, native=False)
    later = tmp_path / "later"  # a trusted runtime of the same name further on PATH: never the stand-in
    later.mkdir()
    (later / "fake-runc").write_text(f"#!/bin/sh\necho later >> {marker}\n")
    (later / "fake-runc").chmod(0o755)
    env = {**cl.hook_env(), "PATH": f"{bin_dir}:{later}:/usr/bin:/bin"}
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    (bundle / "config.json").write_text(plain(["FOO=1"]))
    commands = (["state", "c1"], ["create", "--bundle", str(bundle), "c1"])
    for kind in ("native", "python"):  # trusted: run, by both launchers
        done = subprocess.run([str(tmp_path / kind / "oci-gpu-runtime"), "state", "c1"], capture_output=True,
                              text=True, env=env, timeout=60)
        assert (done.returncode, done.stdout) == (0, "fake-runc state c1\n"), (kind, done.stderr)
    marker.unlink()
    if how == "file-o+w":
        fake.chmod(0o757)
    elif how == "file-owner":
        os.chown(fake, 65534, 65534)
    elif how in ("dir-g+w", "on-path-dir-o+w"):
        bin_dir.chmod(0o775 if how == "dir-g+w" else 0o757)
    else:
        theirs = tmp_path / "theirs"
        theirs.mkdir()
        fake.rename(theirs / "fake-runc")
        os.chown(theirs, 65534, 65534)
        fake.symlink_to(theirs / "fake-runc")
    for argv in commands:
        native, python = (subprocess.run([str(tmp_path / kind / "oci-gpu-runtime"), *argv], capture_output=True,
                                         text=True, env=env, timeout=60) for kind in ("native", "python"))
        assert python.returncode == 1 and python.stdout == "", python
        assert python.stderr.startswith("oci-gpu-hook: error: refusing to run the runtime "), python.stderr
        assert python.stderr.count("\n") == 1 and str(fake) in python.stderr, python.stderr
        assert (native.returncode, native.stdout, native.stderr) == (python.returncode, python.stdout, python.stderr)
        assert not marker.exists(), argv


def test_changed_config_goes_to_python(tmp_path: Path) -> None:
    install = make_install(tmp_path)
    assert precreate(install["native"], plain(["FOO=1"]).encode()).returncode == 0
    assert not ran_python(install)
    config = install["config"]
    config.write_text(config.read_text().replace("MY_INTEL_GPUS", "OTHER_NAME"))
    assert precreate(install["native"], plain(["FOO=1"]).encode()).returncode == 0
    assert ran_python(install)


# ------------------------------------------------------------------ real containers


@pytest.fixture(scope="module")
def rootfs(install: dict[str, Path]) -> Path:
    cl.need("runc")
    return cl.make_rootfs(install["base"] / "rootfs")


def container_bundle(base: Path, rootfs: Path, text: str, name: str) -> Path:
    """A runc bundle that lists /dev/dri; its config.json is ``text``'s request grafted onto a runc spec."""
    bundle = cl.make_bundle(base / name, rootfs, [], ["/bin/sh", "-c", "ls /dev/dri 2>&1; echo done"])
    spec = json.loads((bundle / "config.json").read_text())
    request = json.loads(text)  # only to know where the request is; the escaped text is kept below
    body = json.dumps({k: v for k, v in spec.items() if k not in ("annotations",)})
    env = json.dumps(spec["process"]["env"])
    raw = text
    if "process" in request and "env" in request["process"]:
        marker = raw[raw.index('"env": [') + len('"env": ['):]
        extra = marker[:marker.index("]")]
        extra = extra.replace('"PATH=/bin"', "").strip(", ")
        if extra:
            body = body.replace(env, env[:-1] + ", " + extra + "]")
    if "annotations" in request:
        start = raw.index('"annotations": ') + len('"annotations": ')
        body = body[:-1] + ', "annotations": ' + raw[start:raw.index("}", start) + 1] + "}"
    (bundle / "config.json").write_text(body)
    json.loads(body)
    return bundle


CONTAINER_CASES = ["plain", "escaped-underscore", "split-by-escape", "all-escaped", "annotation-only",
                   "annotation-escaped-slash", "annotation-escaped-key"]


@pytest.mark.containers
@pytest.mark.parametrize("name", CONTAINER_CASES)
def test_shim_run_grants_in_a_real_container(install: dict[str, Path], rootfs: Path, name: str) -> None:
    bundle = container_bundle(install["base"], rootfs, GRANTED[name], f"shim-{name}")
    result = cl.run([str(install["native"] / "oci-gpu-runtime"), "run", "--bundle", str(bundle),
                     cl.container_id()], env=cl.hook_env())
    assert result.returncode == 0, result.stderr
    assert "renderD129" in result.stdout.split() and "done" in result.stdout


@pytest.mark.containers
@pytest.mark.parametrize("name", CONTAINER_CASES)
def test_prestart_grants_in_a_real_container(install: dict[str, Path], rootfs: Path, name: str) -> None:
    bundle = container_bundle(install["base"], rootfs, GRANTED[name], f"hook-{name}")
    cl.add_prestart(bundle, install["native"] / "oci-gpu-hook")
    result = cl.run(["runc", "run", "--bundle", str(bundle), cl.container_id()], env=cl.hook_env())
    assert result.returncode == 0, result.stderr
    assert "renderD129" in result.stdout.split() and "done" in result.stdout


@pytest.mark.containers
def test_symlinked_config_and_custom_names_in_real_containers(install: dict[str, Path], rootfs: Path) -> None:
    bundle = container_bundle(install["base"], rootfs, GRANTED["plain"], "symlinked")
    os.rename(bundle / "config.json", install["base"] / "elsewhere.json")
    (bundle / "config.json").symlink_to(install["base"] / "elsewhere.json")
    result = cl.run([str(install["native"] / "oci-gpu-runtime"), "run", "--bundle", str(bundle),
                     cl.container_id()], env=cl.hook_env())
    assert result.returncode == 0, result.stderr
    assert "renderD129" in result.stdout.split()
    # a custom request_env name (intel; this host has no intel GPU): the Python path is reached and refuses
    bundle = container_bundle(install["base"], rootfs, plain(["MY_INTEL_GPUS=0"]), "custom-name")
    result = cl.run([str(install["native"] / "oci-gpu-runtime"), "run", "--bundle", str(bundle),
                     cl.container_id()], env=cl.hook_env())
    assert result.returncode != 0 and "intel" in result.stderr


@pytest.mark.containers
def test_no_request_never_starts_python(install: dict[str, Path], rootfs: Path) -> None:
    bundle = container_bundle(install["base"], rootfs, plain(["FOO=1"]), "clean")
    cl.add_prestart(bundle, install["native"] / "oci-gpu-hook")
    ran_python(install)
    result = cl.run([str(install["native"] / "oci-gpu-runtime"), "run", "--bundle", str(bundle),
                     cl.container_id()], env=cl.hook_env())
    assert result.returncode == 0, result.stderr
    assert "renderD129" not in result.stdout and "done" in result.stdout
    assert not ran_python(install)
    missing = install["base"] / "no-bundle"
    missing.mkdir()
    result = cl.run([str(install["native"] / "oci-gpu-hook"), "prestart"], env=cl.hook_env(),
                    stdin=json.dumps({"id": "x", "pid": 1, "bundle": str(missing), "status": "created"}))
    assert result.returncode != 0 and ran_python(install)  # no config.json: Python reports it


@pytest.mark.containers
def test_custom_request_name_grants_in_real_containers(tmp_path: Path) -> None:
    cl.need("runc")
    install = make_install(tmp_path, 'amd = ["MY_GPUS"]')  # replaces AMD_VISIBLE_DEVICES for amd
    rootfs = cl.make_rootfs(tmp_path / "rootfs")
    for how in ("shim", "prestart"):
        bundle = container_bundle(tmp_path, rootfs, plain(["MY_GPUS=1"]), f"custom-{how}")
        if how == "shim":
            argv = [str(install["native"] / "oci-gpu-runtime"), "run", "--bundle", str(bundle), cl.container_id()]
        else:
            cl.add_prestart(bundle, install["native"] / "oci-gpu-hook")
            argv = ["runc", "run", "--bundle", str(bundle), cl.container_id()]
        ran_python(install)
        result = cl.run(argv, env=cl.hook_env())
        assert result.returncode == 0, result.stderr
        assert "renderD129" in result.stdout.split() and ran_python(install), how
