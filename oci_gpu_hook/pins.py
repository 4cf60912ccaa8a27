"""The install's pins, written: what a rootless hook may take on trust where root shows as the overflow uid.

Their reader is :mod:`oci_gpu_hook.trust` (:func:`~oci_gpu_hook.trust.load_pins`,
:func:`~oci_gpu_hook.trust.pin_problem`, and the native front's ``load_pins``); this module writes them, for
``launchers`` and ``install`` (:func:`oci_gpu_hook.install.launchers.install_pins` gathers what it needs).
"""

from __future__ import annotations

import os
import stat
import sys

from oci_gpu_hook import trust
from oci_gpu_hook.errors import HookError

PINS_NAME = "install.pins"  # beside the launchers: trust.pins_of, written by `launchers` and `install`


def pins_file_text(directory: str, config: str, paths: list[str], stdlib: list[str], venv: list[str]) -> str:
    """The pins file (:data:`PINS_NAME`) of launchers written into ``directory``: every entry of the install's own
    that their trust checks walk (the virtual environment and everything in it they meet, the site-packages holding
    the package, the config file and its directory unless that is sticky, as /tmp is, where any user may add a
    file), except ``directory`` and what lies above it, which the write itself changes (docs/security.md).  Nothing
    comes and goes in them: the DaemonSet's lock of an environment lies beside it, not in it.  Over
    :data:`oci_gpu_hook.trust.MAX_PINS` bytes, which no reader would take: a HookError, nothing written.

    ``config``: the config file's path; ``paths``: the code paths the launchers load from (those there);
    ``stdlib``, ``venv``: the standard library's directories and the environment's ``pyvenv.cfg`` (if any)."""
    prefix = os.path.dirname(os.path.dirname(sys.executable))
    roots = [*paths, config, *([prefix] if venv else [])]
    try:
        if not os.stat(os.path.dirname(config)).st_mode & stat.S_ISVTX:
            roots.append(os.path.dirname(config))
    except OSError:
        roots.append(os.path.dirname(config))  # pinned absent: its making changes what a rootless hook trusts
    walked = [sys.executable, *paths, *stdlib, *venv, config]
    text = trust.pins_text(trust.pins_of(walked, roots, [os.path.abspath(directory)]))
    size = len(text.encode("utf-8", "surrogateescape"))
    if size > trust.MAX_PINS:
        raise HookError(f"the pins of this install ({os.path.join(directory, PINS_NAME)}) would take {size} bytes, "
                        f"more than the {trust.MAX_PINS} a rootless hook reads (paths this long or this many "
                        "symlinks on the way to the environment or the config?); nothing is written")
    return text
