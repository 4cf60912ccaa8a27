"""The planner's scan cache (:mod:`oci_gpu_hook.serve.planner.inventory`): against a fake host that changes under
it (GPUs leave, come back, are renumbered, change their device number or partition mode, a link is retargeted, a
file turns into a directory, a file is rewritten to the same size), every answer is the inventory a fresh scan
gives at that moment, and a replay after a change is a miss; an unchanged host is a hit.  A scan that makes a call
the cache cannot replay is never kept; the entries a worker sends reach the daemon.  The planner end to end over
a changing host (native front with its cache against the Python launcher) is in test_planner_oracle.py's
neighbour below: test_a_changing_host_through_the_planner."""

from __future__ import annotations

import builtins
import io
import os
import random
import re
import shutil
import socket
from pathlib import Path

import pytest

from oci_gpu_hook import inventory
from oci_gpu_hook.serve.planner import inventory as cache_module
from oci_gpu_hook.serve.planner.inventory import ScanCache
from tests.helpers import containerlib as cl
from tests.helpers import plannerlib


def canon(value: object) -> object:
    """A comparable form of an inventory: every slot of every object, recursively."""
    if isinstance(value, (list, tuple)):
        return [canon(v) for v in value]
    if isinstance(value, dict):
        return {k: canon(v) for k, v in value.items()}
    slots = [s for klass in type(value).__mro__ for s in getattr(klass, "__slots__", ())]
    if slots:
        return (type(value).__name__, {s: canon(getattr(value, s, None)) for s in slots})
    if hasattr(value, "__dict__"):
        return (type(value).__name__, canon(vars(value)))
    return value


def fresh(root: Path, kinds: list[str] | None = None, strict: bool = True) -> object:
    try:
        return canon(inventory.scan(str(root), kinds, strict=strict))
    except Exception as err:  # the cache must fail the same way
        return ("raised", type(err).__name__, str(err))


def cached(cache: ScanCache, root: Path, kinds: list[str] | None = None, strict: bool = True) -> object:
    try:
        return canon(cache.scan(str(root), kinds, strict=strict))
    except Exception as err:
        return ("raised", type(err).__name__, str(err))


@pytest.fixture
def host(tmp_path: Path) -> Path:
    root = tmp_path / "sys"
    shutil.copytree(cl.SEED_SYSFS, root, symlinks=True)
    return root


def drm(host: Path) -> Path:
    return host / "class" / "drm"


def remove_gpu(host: Path, card: int) -> None:
    for name in (f"card{card}", f"renderD{128 + card}"):
        (drm(host) / name).unlink()


def change_same_size(path: Path) -> None:
    """Rewrite ``path`` with other bytes of the same length (a stat of it may then say nothing new)."""
    data = path.read_bytes()
    digit = next(i for i, b in enumerate(data) if chr(b).isdigit())
    changed = bytes([data[digit] - 1 if data[digit] > ord("0") else data[digit] + 1])
    path.write_bytes(data[:digit] + changed + data[digit + 1:])


def test_an_unchanged_host_is_served_from_the_cache(host: Path) -> None:
    cache = ScanCache(inventory.scan)
    first = cached(cache, host, ["amd"])
    assert (cache.hits, cache.misses) == (0, 1)
    for _ in range(3):
        assert cached(cache, host, ["amd"]) == first == fresh(host, ["amd"])
    assert (cache.hits, cache.misses) == (3, 1)
    assert len(cache.fresh) == 1  # the one scan made here, for the daemon


def test_each_kind_of_request_has_its_own_entry(host: Path) -> None:
    cache = ScanCache(inventory.scan)
    for kinds in (["amd"], ["intel"], None, ["amd", "intel"]):
        assert cached(cache, host, kinds) == fresh(host, kinds)
    assert cache.misses == 4
    assert cached(cache, host, ["intel", "amd"]) == fresh(host, ["amd", "intel"])  # the order scan uses
    assert cached(cache, host, ["amd"], strict=False) == fresh(host, ["amd"], strict=False)
    assert (cache.hits, cache.misses) == (1, 5)


CHANGES = {
    "a GPU leaves": lambda h: remove_gpu(h, 3),
    "every GPU leaves": lambda h: shutil.rmtree(drm(h)),
    "a GPU comes back renumbered": lambda h: (remove_gpu(h, 0),
                                              os.symlink(os.readlink(drm(h) / "card1"), drm(h) / "card0")),
    "a device number changes, same size": lambda h: change_same_size((drm(h) / "card2").resolve() / "dev"),
    "a kfd node's gpu_id changes, same size": lambda h: change_same_size(
        h / "class" / "kfd" / "kfd" / "topology" / "nodes" / "2" / "gpu_id"),
    "a link is retargeted": lambda h: (os.unlink(drm(h) / "renderD130"),
                                       os.symlink(os.readlink(drm(h) / "renderD131"), drm(h) / "renderD130")),
    "a dev file becomes a directory": lambda h: (((drm(h) / "card4").resolve() / "dev").unlink(),
                                                ((drm(h) / "card4").resolve() / "dev").mkdir()),
    "a dev file goes (a device half removed)": lambda h: ((drm(h) / "card5").resolve() / "dev").unlink(),
    "a connector is added": lambda h: os.symlink(os.readlink(drm(h) / "card1-DP-1"), drm(h) / "card1-DP-2"),
}


@pytest.mark.parametrize("change", sorted(CHANGES))
def test_a_change_is_seen_at_the_next_request(host: Path, change: str) -> None:
    cache = ScanCache(inventory.scan)
    before = cached(cache, host, ["amd"])
    assert cached(cache, host, ["amd"]) == before and cache.hits == 1
    CHANGES[change](host)
    after = fresh(host, ["amd"])
    assert cached(cache, host, ["amd"]) == after
    assert cache.misses == 2  # the replay saw it
    if change != "a connector is added":
        assert after != before  # the change mattered, and the cache did not serve the old answer


def test_random_changes_always_agree_with_a_fresh_scan(host: Path) -> None:
    """Many changes in a row, some undone again (a GPU that returns): after each, the cache answers what a fresh
    scan answers, for each kind of request."""
    rng = random.Random(22)
    cache = ScanCache(inventory.scan)
    files = sorted(p for p in host.rglob("*") if p.is_file() and not p.is_symlink()
                   and any(chr(b).isdigit() for b in p.read_bytes()))
    links = sorted(p for p in drm(host).iterdir() if p.is_symlink())
    saved = {p: os.readlink(p) for p in links}
    for _step in range(60):
        what = rng.randrange(4)
        if what == 0:
            change_same_size(rng.choice(files))
        elif what == 1:
            link = rng.choice(links)
            if link.is_symlink():
                link.unlink()
            else:
                os.symlink(saved[link], link)  # it comes back
        elif what == 2:
            link = rng.choice([p for p in links if p.is_symlink()] or links)
            if link.is_symlink():
                link.unlink()
                os.symlink(saved[rng.choice(links)], link)
        for kinds in (["amd"], None):
            assert cached(cache, host, kinds) == fresh(host, kinds)
    assert cache.hits and cache.misses  # both paths were taken


def test_a_scan_it_cannot_replay_is_never_kept(host: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = inventory.scan

    def with_a_file_object(*args: object, **kwargs: object) -> inventory.Inventory:
        with open(drm(host) / "card0" / "dev") as handle:  # a Python file object: not traced
            handle.read()
        return real(*args, **kwargs)  # type: ignore[arg-type]

    cache = ScanCache(with_a_file_object)
    for _ in range(2):
        assert cached(cache, host, ["amd"]) == fresh(host, ["amd"])
    assert (cache.hits, cache.misses, cache.entries, cache.fresh) == (0, 2, {}, [])


def test_the_patched_calls_are_put_back(host: Path) -> None:
    names = (*cache_module.TRACED, *(n for n in cache_module.UNTRACEABLE if hasattr(os, n)))
    before = ({name: getattr(os, name) for name in names}, builtins.open)
    cache = ScanCache(inventory.scan)
    cache.scan(str(host), ["amd"])
    cache.scan(str(host), ["amd"])
    assert ({name: getattr(os, name) for name in names}, builtins.open) == before
    assert builtins.open is io.open


def test_a_failing_scan_is_not_kept_and_fails_the_same(host: Path) -> None:
    ((drm(host) / "card5").resolve() / "dev").unlink()  # strict: a device half there refuses
    cache = ScanCache(inventory.scan)
    assert cached(cache, host, ["amd"]) == fresh(host, ["amd"])
    assert cached(cache, host, ["amd"])[0] == "raised"  # type: ignore[index]
    assert cache.entries == {}


def test_a_workers_entry_reaches_the_daemon(host: Path) -> None:
    daemon_end, worker_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    with daemon_end, worker_end:
        worker = ScanCache(inventory.scan)
        worker.scan(str(host), ["amd"])
        worker.send_fresh(worker_end)
        worker_end.send(b"not an entry")  # dropped
        daemon = ScanCache(inventory.scan)
        assert daemon.take(daemon_end) == 1
        assert cached(daemon, host, ["amd"]) == fresh(host, ["amd"])
        assert (daemon.hits, daemon.misses) == (1, 0)
        remove_gpu(host, 1)
        assert cached(daemon, host, ["amd"]) == fresh(host, ["amd"]) and daemon.misses == 1


def test_the_first_answer_is_the_kept_object_then_copies(host: Path) -> None:
    cache = ScanCache(inventory.scan)
    cache.scan(str(host), ["amd"])
    kept = next(iter(cache.entries.values()))[1]
    first, second = cache.scan(str(host), ["amd"]), cache.scan(str(host), ["amd"])
    assert first is kept and second is not kept and canon(second) == canon(kept)


# --- end to end: the planner's workers over a changing host -------------------------------------------------

STEPS = (
    ("as it is", lambda h: None),
    ("GPU 1 leaves", lambda h: remove_gpu(h, 1)),
    ("GPU 1 comes back", lambda h: [os.symlink(t, drm(h) / n) for n, t in SAVED.items()
                                    if n in ("card1", "renderD129")]),
    ("GPU 3's render number changes, same size", lambda h: change_same_size((drm(h) / "renderD131").resolve() / "dev")),
    ("every GPU leaves", lambda h: [(drm(h) / n).unlink() for n in SAVED]),
    ("they come back", lambda h: [os.symlink(t, drm(h) / n) for n, t in SAVED.items()]),
)
SAVED: dict[str, str] = {}


def test_a_changing_host_through_the_planner(tmp_path: Path) -> None:
    """Native front and planner (with its cache, primed at start, inherited by the workers it forked before each
    change) against the Python launcher, after every change: the same exit, output and config.json."""
    from tests.conftest import need
    from tests.test_planner import bundle_with, make_install, python_runs, shim, spec_text

    need()
    install = make_install(tmp_path / "install")
    host = tmp_path / "sys"
    shutil.copytree(cl.SEED_SYSFS, host, symlinks=True)
    install["config"].write_text(install["config"].read_text().replace(str(cl.SEED_SYSFS), str(host)))
    SAVED.clear()
    SAVED.update({p.name: os.readlink(p) for p in drm(host).iterdir()
                  if p.name.startswith(("card", "renderD")) and "-" not in p.name})
    env = {**cl.hook_env(), "OCI_GPU_HOOK_CONFIG": str(install["config"])}
    launcher = str(install["native"] / "oci-gpu-hook")
    running = plannerlib.Planner(Path(launcher), install["socket"], env, 2, argv=[launcher, "serve", "--verbose"])
    running.start()
    try:
        python_runs(install)
        for step, (what, change) in enumerate(STEPS):
            change(host)
            for gpu in ("1", "3"):
                text = spec_text([f"AMD_VISIBLE_DEVICES={gpu}"])
                for round_ in range(3):  # more requests than spare workers: old forks and new ones
                    name = f"s{step}-g{gpu}-r{round_}"
                    native, python = bundle_with(tmp_path, name + "-n", text), bundle_with(tmp_path, name + "-p", text)
                    a, b = shim(install, "native", native), shim(install, "python", python)
                    assert (a.returncode, a.stdout, a.stderr) == (b.returncode, b.stdout, b.stderr), what
                    assert (native / "config.json").read_bytes() == (python / "config.json").read_bytes(), what
            assert python_runs(install) == 0, what  # the planner answered every native one
    finally:
        assert running.stop() == 0
    log = running.log.read_text()
    answered = re.findall(r"planner: ok \d+ \([\d.]+ ms from accept to answer; inventory (\d+) cached, (\d+) scanned",
                          log)
    assert len(answered) == len(STEPS) * 6, log
    assert answered[0] == ("1", "0")  # primed at start
    assert ("0", "1") in answered  # after a change, a worker forked before it scans afresh
