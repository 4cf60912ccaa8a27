"""Where install writes: the real paths (``--prefix`` puts each under a directory, never changes what files say)."""

from __future__ import annotations

import os

LAUNCHER_DIR = "/usr/local/libexec/oci-gpu-hook"
HOOK_STAGES = ("precreate", "prestart")
STATE_DIR = "/var/lib/oci-gpu-hook"
MANIFEST_PATH = f"{STATE_DIR}/install.json"
BACKUP_DIR = f"{STATE_DIR}/backup"
JOURNAL_DIR = f"{STATE_DIR}/journal.d"
JOURNAL_PATH = f"{JOURNAL_DIR}/journal.json"
STAGING = ".oci-gpu-hook-staging"  # a directory being created or removed as a whole, by one rename
SYSTEMD_UNIT = "/etc/systemd/system/oci-gpu-hook-watch.service"
PLANNER_UNIT = "/etc/systemd/system/oci-gpu-hook-planner.service"
NRI_UNIT = "/etc/systemd/system/oci-gpu-hook-nri.service"
INTEGRATIONS = ("podman", "docker", "containerd", "crio", "cdi", "systemd", "nri")
HOOK_LAUNCHER = f"{LAUNCHER_DIR}/oci-gpu-hook"
RUNTIME_LAUNCHER = f"{LAUNCHER_DIR}/oci-gpu-runtime"
# the directory that holds the package: a source checkout has hooks.d/ and examples/ there, a wheel does not
PACKAGE_PARENT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
