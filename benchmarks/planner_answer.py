"""The resident planner's own time for a 1-GPU rewrite, from its accept to its answer, as ``serve --verbose`` logs it.

Run as root from a development checkout (it uses the tests' helpers: native launchers on a private socket, the
seed host's sysfs, runtime /bin/true):

    .venv/bin/python benchmarks/planner_answer.py --runs 40

It starts ``serve --verbose`` through the native launcher (3 workers), runs ``--runs`` shim ``create``s asking for
``AMD_VISIBLE_DEVICES=1`` through the native front one after another (a pause between them, so that each finds a
warmed worker waiting), checks that the planner answered every one, and prints the median, p25 and p75 of the
logged accept-to-answer times, the front's wall time and how many inventories came from the planner's cache.
A number of the planner alone, not of a container start: ``startup.py`` times those."""

from __future__ import annotations

import argparse
import os
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.helpers import containerlib as cl
from tests.helpers import plannerlib
from tests.test_planner import bundle_with, make_install, python_runs, shim, spec_text

LINE = re.compile(r"planner: ok 0 \(([\d.]+) ms from accept to answer(?:; inventory (\d+) cached, (\d+) scanned)?")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=40)
    parser.add_argument("--pause", type=float, default=0.05, help="seconds between requests (default 0.05)")
    opts = parser.parse_args()
    if os.geteuid() != 0:
        print("planner_answer.py: run as root (the planner answers root's fronts only)", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="ogh-planner-answer-") as tmp:
        base = Path(tmp)
        install = make_install(base / "install")
        env = {**cl.hook_env(), "OCI_GPU_HOOK_CONFIG": str(install["config"])}
        launcher = str(install["native"] / "oci-gpu-hook")
        planner = plannerlib.Planner(Path(launcher), install["socket"], env, 3, argv=[launcher, "serve", "--verbose"])
        planner.start()
        walls = []
        try:
            time.sleep(1)  # every worker warmed up
            python_runs(install)
            for run in range(opts.runs):
                bundle = bundle_with(base, f"b{run}", spec_text(["AMD_VISIBLE_DEVICES=1"]))
                started = time.perf_counter()
                done = shim(install, "native", bundle)
                walls.append((time.perf_counter() - started) * 1000)
                if done.returncode != 0:
                    why = done.stderr.decode(errors="replace")
                    print(f"planner_answer.py: a create failed: {why}", file=sys.stderr)
                    return 1
                time.sleep(opts.pause)
            fell_back = python_runs(install)
        finally:
            planner.stop()
        found = LINE.findall(planner.log.read_text())
    if fell_back or len(found) != opts.runs:
        print(f"planner_answer.py: {fell_back} fell back to Python, {len(found)} answers logged", file=sys.stderr)
        return 1
    times = [float(ms) for ms, _cached, _scanned in found]
    cached = sum(int(c or 0) for _ms, c, _s in found)
    scanned = sum(int(s or 0) for _ms, _c, s in found)
    q, w = statistics.quantiles(times, n=4), statistics.quantiles(walls, n=4)
    print(f"accept to answer, ms: median {statistics.median(times):.2f}, p25 {q[0]:.2f}, p75 {q[2]:.2f}, "
          f"min {min(times):.2f} (n={len(times)})")
    print(f"the front's wall time, ms: median {statistics.median(walls):.2f}, p75 {w[2]:.2f}")
    load = Path("/proc/loadavg").read_text().strip()
    print(f"inventories: {cached} from the cache, {scanned} scanned; load {load}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
