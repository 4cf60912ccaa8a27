"""``oci-gpu-hook watch``: keep the CDI specs current on GPU and partition uevents
(:mod:`oci_gpu_hook.cluster.watch`)."""

from __future__ import annotations

import math
import signal

from oci_gpu_hook.cliparse import parser as _parser
from oci_gpu_hook.cluster.watch import (
    DEFAULT_DEBOUNCE,
    DEFAULT_SUBSYSTEMS,
    KernelUevents,
    Watcher,
    resolve_targets,
    user_namespace_warning,
)
from oci_gpu_hook.config import Config
from oci_gpu_hook.errors import HookError


def parse_subsystems(text: str) -> tuple[str, ...]:
    names = tuple(dict.fromkeys(n.strip() for n in text.split(",") if n.strip()))
    if not names or any(not n.isprintable() or " " in n or "=" in n for n in names):
        raise HookError(f"--subsystems {text!r}: expected a comma-separated list of kernel subsystems "
                        f"(default: {','.join(DEFAULT_SUBSYSTEMS)})")
    return names


def parse_debounce(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value < 0 or value > 3600:
        raise HookError(f"--debounce {text!r}: expected seconds, 0 to 3600 (default {DEFAULT_DEBOUNCE:g})")
    return value


def run(args: list[str], config: Config) -> int:
    parser = _parser("watch", "Keep the CDI spec current: regenerate it when the kernel reports a GPU or "
                              "partition appearing, disappearing or changing (uevents).")
    parser.add_argument("--output", metavar="DIR|FILE", default=None,
                        help=f"a directory gets one <vendor>-<class>.json per kind; a file (.json or .yaml) holds "
                             f"one kind's spec (--kind, else the kind its name says, else the first backend); "
                             f"default: cdi_dir from the config ({config.cdi_dir})")
    parser.add_argument("--kind", choices=list(config.backends), help="keep only this kind's spec current")
    parser.add_argument("--debounce", metavar="SECONDS", default=str(DEFAULT_DEBOUNCE),
                        help="quiet period after an event before regenerating (default %(default)s)")
    parser.add_argument("--once", action="store_true", help="regenerate once and exit (no uevent socket)")
    parser.add_argument("--subsystems", metavar="LIST", default=",".join(DEFAULT_SUBSYSTEMS),
                        help="comma-separated uevent subsystems that trigger a regeneration; pci events count only "
                             "for GPUs' PCI functions (default %(default)s)")
    parser.add_argument("--dev", metavar="DIR", default="/dev",
                        help="the /dev whose missing /dev/char/MAJ:MIN links of the GPUs' nodes are made as they "
                             "appear, as udev would (runc under systemd needs them); 'none': make none "
                             "(default %(default)s)")
    opts = parser.parse_args(args)
    dev = None if opts.dev == "none" else opts.dev
    debounce = parse_debounce(opts.debounce)
    subsystems = parse_subsystems(opts.subsystems)
    targets = resolve_targets(opts.output, config, opts.kind)

    if opts.once:
        watcher = Watcher(config, targets, subsystems=subsystems, debounce=debounce, dev=dev)
        outcome = watcher.generate()  # a failure is the one error line and exit 1
        watcher.log(f"once: {outcome.text}")
        return 0

    source = KernelUevents()
    watcher = Watcher(config, targets, source, subsystems=subsystems, debounce=debounce, dev=dev)

    def on_signal(number: int, _frame: object) -> None:
        watcher.stop(signal.Signals(number).name)

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        source.start()
        return watcher.run(user_namespace_warning())
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        source.close()
