"""The one trust rule, held to itself wherever it is written: oci_gpu_hook/trust.py (config, log, output files and
code), the copy every Python launcher carries (install/launchers.py rule_text) and the C front's walk (front.c
``trusted``), case by case on one corpus of real files, as root, as a plain user and as a rootless user namespace's
root, where the host's root shows as the overflow uid.  Each context's verdicts are also checked against the rule as
docs/security.md states it (the table below), so the three cannot agree on a wrong answer."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from oci_gpu_hook import trust
from oci_gpu_hook.fastpath import build as fastbuild
from oci_gpu_hook.install import codepaths, launchers

CALLER, OTHER = 1000, 1001  # the plain user every non-root context runs as, and a user who is nobody here
pytestmark = pytest.mark.root("gcc", "setpriv", "unshare")  # files of several owners; a compiler for the front


def _make(base: Path) -> dict[str, str]:
    """The corpus: name -> path to check."""
    def file(path: Path, owner: int = 0, mode: int = 0o644) -> Path:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("x")
        os.chown(path, owner, owner)
        path.chmod(mode)
        return path

    def directory(path: Path, owner: int = 0, mode: int = 0o755) -> Path:
        path.mkdir(parents=True, exist_ok=True)
        os.chown(path, owner, owner)
        path.chmod(mode)
        return path

    def link(path: Path, target: str, owner: int = 0) -> Path:
        path.symlink_to(target)
        os.chown(path, owner, owner, follow_symlinks=False)
        return path

    cases: dict[str, Path | str] = {}
    cases["root-file"] = file(base / "root" / "f")
    cases["caller-file"] = file(base / "root" / "caller-f", CALLER)
    cases["other-file"] = file(base / "root" / "other-f", OTHER)
    cases["file-g+w"] = file(base / "root" / "gw", 0, 0o664)
    cases["file-o+w"] = file(base / "root" / "ow", 0, 0o646)
    cases["caller-dir/root-file"] = file(directory(base / "callerdir", CALLER) / "f")
    cases["other-dir/root-file"] = file(directory(base / "otherdir", OTHER) / "f")
    cases["dir-g+w/file"] = file(directory(base / "gwdir", 0, 0o775) / "f")
    cases["dir-o+w/file"] = file(directory(base / "owdir", 0, 0o757) / "f")
    sticky = directory(base / "sticky", 0, 0o1777)
    cases["sticky/root-file"] = file(sticky / "root-f")
    cases["sticky/caller-file"] = file(sticky / "caller-f", CALLER)
    cases["sticky/other-file"] = file(sticky / "other-f", OTHER)
    cases["dev-null"] = os.devnull
    cases["link-to-root-file"] = link(base / "root" / "l1", "f")
    cases["link-owned-by-other"] = link(base / "root" / "l2", "f", OTHER)
    cases["symlinked-parent-to-other-dir"] = link(base / "root" / "l3", "../otherdir") / "f"
    cases["symlinked-parent-absolute"] = link(base / "root" / "l4", str(base / "root")) / "f"
    cases["dotdot-through-link"] = link(base / "root" / "l5", "../root/..") / "root" / "f"
    link(base / "root" / "loop-a", "loop-b")
    cases["link-loop"] = link(base / "root" / "loop-b", "loop-a")
    cases["missing"] = base / "root" / "absent"
    cases["missing-under-other-dir"] = base / "otherdir" / "absent"
    cases["under-a-file"] = base / "root" / "f" / "more"
    # the install's pins (trust.load_pins: "INODE CTIME_NS PATH"), which only a rootless context reads
    pins: dict[Path, tuple[int, int]] = {}

    def seen(path: Path) -> tuple[int, int]:
        st = os.lstat(path)
        return st.st_ino, st.st_ctime_ns

    cases["pinned-kept"] = file(base / "pinned" / "kept")
    pins[cases["pinned-kept"]] = seen(cases["pinned-kept"])
    cases["pinned-changed"] = file(base / "pinned" / "changed")
    pins[cases["pinned-changed"]] = (seen(cases["pinned-changed"])[0], seen(cases["pinned-changed"])[1] - 1)
    cases["pinned-replaced"] = file(base / "pinned" / "replaced")
    pins[cases["pinned-replaced"]] = (seen(cases["pinned-replaced"])[0] + 1, seen(cases["pinned-replaced"])[1])
    cases["pinned-dir-changed/root-file"] = file(directory(base / "pinned" / "dir") / "f")
    pins[base / "pinned" / "dir"] = (seen(base / "pinned" / "dir")[0], 1)
    cases["pinned-absent-now-present"] = file(base / "pinned" / "appeared")
    pins[cases["pinned-absent-now-present"]] = (0, 0)
    cases["pinned-present-now-absent"] = base / "pinned" / "gone"
    pins[cases["pinned-present-now-absent"]] = (123, 456)
    cases["pinned-absent-still-absent"] = base / "pinned" / "never"
    pins[cases["pinned-absent-still-absent"]] = (0, 0)
    cases["pinned-callers-changed"] = file(base / "pinned" / "callers", CALLER)
    pins[cases["pinned-callers-changed"]] = (1, 1)
    cases["pinned-others-changed"] = file(base / "pinned" / "others", OTHER)
    pins[cases["pinned-others-changed"]] = (1, 1)
    (base / "pins").write_text("".join(f"{ino} {ctime} {path}\n" for path, (ino, ctime) in pins.items()))
    return {name: str(path) for name, path in cases.items()}


# The rule as docs/security.md states it: which owners each context trusts (the host's uids), and what the
# code rule adds (a missing path, or a path through a non-directory, is refused).
TRUSTED_OWNERS = {"root": {0}, "user": {0, CALLER}, "rootless": {0, CALLER, OTHER}}  # rootless: unmapped uids
OWNED_BY = {"caller-file": CALLER, "other-file": OTHER, "caller-dir/root-file": CALLER,
            "other-dir/root-file": OTHER, "sticky/caller-file": CALLER, "sticky/other-file": OTHER,
            "link-owned-by-other": OTHER, "symlinked-parent-to-other-dir": OTHER, "missing-under-other-dir": OTHER}
WRITABLE = {"file-g+w", "file-o+w", "dir-g+w/file", "dir-o+w/file", "link-loop"}  # a loop: too many links
MISSING = {"missing", "missing-under-other-dir", "under-a-file", "pinned-present-now-absent",
           "pinned-absent-still-absent"}
OWNED_BY |= {"pinned-callers-changed": CALLER, "pinned-others-changed": OTHER}
# not what install pinned: refused where the host's root reads as the overflow uid (the rootless context) alone
UNPINNED = {"pinned-changed", "pinned-replaced", "pinned-dir-changed/root-file", "pinned-absent-now-present",
            "pinned-present-now-absent", "pinned-others-changed"}


def expected(context: str, case: str, kind: str) -> bool:
    if case in WRITABLE or (context == "rootless" and case in UNPINNED):
        return False
    if OWNED_BY.get(case, 0) not in TRUSTED_OWNERS[context]:
        return False
    return not (kind == "code" and case in MISSING)


PYTHON_SIDE = """
import json, os, sys
sys.path.insert(0, sys.argv[1])
import trust
launcher = {}
exec("import os, stat", launcher)  # what a launcher has imported before the rule (LAUNCHER, TRUST)
exec(compile(open(sys.argv[2]).read(), "launcher-rule", "exec"), launcher)
paths = json.loads(sys.argv[3])
trust.load_pins(sys.argv[4])
launcher["load_pins"](sys.argv[4])
out = {}
for name, path in paths.items():
    out[name] = {"config": trust.config_problem(path) is None, "code": trust.code_problem(path) is None,
                 "launcher": launcher["code_problem"](path) is None}
print(json.dumps({"cases": out, "identity": list(trust.identity()), "owners": list(trust.trusted_owners())}))
"""

CONTEXTS = {
    "root": [],
    "user": ["setpriv", f"--reuid={CALLER}", f"--regid={CALLER}", "--clear-groups"],
    "rootless": ["setpriv", f"--reuid={CALLER}", f"--regid={CALLER}", "--clear-groups", "unshare", "-U", "-r"],
}


@pytest.fixture(scope="module")
def corpus() -> Iterator[tuple[Path, dict[str, str], Path, Path]]:
    base = Path(tempfile.mkdtemp(prefix="oci-gpu-hook-trust-", dir="/tmp"))
    try:
        base.chmod(0o755)
        tools = base / "tools"
        tools.mkdir(mode=0o755)
        shutil.copy(trust.__file__, tools / "trust.py")
        (tools / "rule.py").write_text(launchers.rule_text())
        header = tools / "baked.h"
        header.write_text(fastbuild.front_header("oci-gpu-hook", str(tools), {}, True))
        probe = tools / "probe"
        subprocess.run(["gcc", "-std=gnu11", "-O2", "-Wall", "-Wno-unused-function", f'-DOGH_BAKED="{header}"',
                        "-DOGH_TRUST_PROBE", "-o", str(probe), fastbuild.FRONT_SOURCE], check=True, timeout=120)
        for path in tools.iterdir():
            path.chmod(0o755)
        yield base, _make(base / "corpus"), tools, probe
    finally:
        shutil.rmtree(base, ignore_errors=True)


def _python(context: str, tools: Path, paths: dict[str, str]) -> dict[str, object]:
    cmd = [*CONTEXTS[context], "/usr/bin/python3", "-I", "-S", "-c", PYTHON_SIDE, str(tools), str(tools / "rule.py"),
           json.dumps(paths), str(tools.parent / "corpus" / "pins")]
    done = subprocess.run(cmd, capture_output=True, text=True, cwd="/", timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def _c(context: str, probe: Path, paths: dict[str, str], kind: str) -> tuple[dict[str, bool], str]:
    args = ["pins", str(probe.parent.parent / "corpus" / "pins"), *(x for path in paths.values() for x in (kind, path))]
    done = subprocess.run([*CONTEXTS[context], str(probe), *args], capture_output=True, text=True, cwd="/",
                          timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    *verdicts, identity = done.stdout.splitlines()
    return {name: v == "trusted" for name, v in zip(paths, verdicts, strict=True)}, identity


@pytest.mark.parametrize("context", list(CONTEXTS))
def test_one_rule_in_python_in_the_launcher_and_in_c(corpus: tuple[Path, dict[str, str], Path, Path],
                                                     context: str) -> None:
    _base, paths, tools, probe = corpus
    python = _python(context, tools, paths)
    cases = python["cases"]
    assert isinstance(cases, dict)
    c_code, identity = _c(context, probe, paths, "code")
    c_config, _ = _c(context, probe, paths, "config")
    privileged, overflow = python["identity"]  # type: ignore[misc]
    assert identity == f"privileged={int(privileged)} overflow={-1 if overflow is None else overflow}"
    assert privileged == (context == "root")
    assert (overflow is not None) == (context == "rootless")
    wrong = []
    for name in paths:
        got = cases[name]
        for kind, c_verdict in (("config", c_config[name]), ("code", c_code[name])):
            want = expected(context, name, kind)
            seen = {"python": got[kind], "c": c_verdict}
            if kind == "code":
                seen["launcher"] = got["launcher"]
            if set(seen.values()) != {want}:
                wrong.append(f"{context} {kind} {name}: want {want}, got {seen}")
    assert not wrong, "\n".join(wrong)


def test_the_launcher_carries_the_rule_verbatim(tmp_path: Path) -> None:
    """Every Python launcher's trust check is trust.py's block itself, not a rewrite of it."""
    text = launchers.launcher_text("entry.cli", {}, trust=True)
    block = launchers.rule_text()
    assert block.startswith(launchers.RULE_BEGINS) and block.rstrip().endswith(launchers.RULE_ENDS)
    assert block in text
    assert "def code_problem(path: str) -> str | None:" in block
    source = Path(trust.__file__).read_text()
    assert source.count(launchers.RULE_BEGINS) == 1 and source.count(launchers.RULE_ENDS) == 1


def test_install_refuses_code_that_fails_the_rule(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """install says once what every container start would refuse (and what a rootless hook could not see)."""
    from oci_gpu_hook.errors import HookError
    from oci_gpu_hook.install import guard as run

    mine = tmp_path / "root-site-packages"
    mine.mkdir(mode=0o755)
    monkeypatch.setattr(codepaths, "code_paths", lambda: [str(mine)])
    run.untrusted_code()  # root's alone: nothing to say
    writable = tmp_path / "site-packages"
    writable.mkdir()
    writable.chmod(0o777)
    monkeypatch.setattr(codepaths, "code_paths", lambda: [str(mine), str(writable)])
    with pytest.raises(HookError) as err:
        run.untrusted_code()
    assert f"would run {writable}, which fails the trust rule: {writable} is writable by group and others" in str(
        err.value)


OVERSIZE_SIDE = """
import json, sys
sys.path.insert(0, sys.argv[1])
import trust
launcher = {}
exec("import os, stat", launcher)
exec(compile(open(sys.argv[2]).read(), "launcher-rule", "exec"), launcher)
trust.load_pins(sys.argv[3])
launcher["load_pins"](sys.argv[3])
print(json.dumps([trust.code_problem(sys.argv[4]), launcher["code_problem"](sys.argv[4])]))
"""


@pytest.mark.parametrize("size", ["at-the-limit", "one-byte-over"])
def test_a_pins_file_over_the_limit_is_read_not_at_all(corpus: tuple[Path, dict[str, str], Path, Path],
                                                       size: str) -> None:
    """A pins file of MAX_PINS bytes is read in full, by C and Python alike; one byte more and neither reads any of
    it (a part would leave entries unpinned, so trusted): every entry that reads as the overflow uid is refused,
    with the line that says why (install never writes such a file: test_install_refuses_pins_over_the_limit)."""
    base, paths, tools, probe = corpus
    target = paths["root-file"]
    st = os.lstat(target)
    line = f"{st.st_ino} {st.st_ctime_ns} {target}\n"
    filler = "0 0 /nonexistent/" + "x" * 200 + "\n"
    text = line
    while len(text) + len(filler) <= trust.MAX_PINS:
        text += filler
    text += "#" * (trust.MAX_PINS - len(text) - 1) + "\n"  # exactly the limit: a line the readers skip
    assert len(text) == trust.MAX_PINS
    if size == "one-byte-over":
        text += "\n"
    pins = base / f"pins-{size}"
    pins.write_text(text)
    pins.chmod(0o644)
    cmd = [*CONTEXTS["rootless"], "/usr/bin/python3", "-I", "-S", "-c", OVERSIZE_SIDE, str(tools),
           str(tools / "rule.py"), str(pins), target]
    done = subprocess.run(cmd, capture_output=True, text=True, cwd="/", timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    python, launcher = json.loads(done.stdout)
    c = subprocess.run([*CONTEXTS["rootless"], str(probe), "pins", str(pins), "code", target], capture_output=True,
                       text=True, cwd="/", timeout=60, check=False)
    assert c.returncode == 0, c.stderr
    if size == "at-the-limit":
        assert (python, launcher, c.stdout.splitlines()[0]) == (None, None, "trusted")
    else:
        assert python == launcher and "pins file of `oci-gpu-hook install` is larger than 65536 bytes" in python
        assert python.startswith("/ cannot be vouched for"), python  # the first entry met: refused from the root
        assert c.stdout.splitlines()[0] == "untrusted"
