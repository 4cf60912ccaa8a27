"""``oci-gpu-hook dry-run``: the config.json the spec-rewrite paths would produce; changes nothing but the
by-path directory that config.json mounts (:mod:`oci_gpu_hook.appliers.bypath`), and that only as root."""

from __future__ import annotations

import json
import os
import sys

from oci_gpu_hook.cliparse import parser as _parser
from oci_gpu_hook.oci_spec import ContainerSpec, config_file, load_document

TYPE_CHECKING = False  # not typing's: see oci_gpu_hook/startpath.py

if TYPE_CHECKING:
    from oci_gpu_hook.config import Config


def run(args: list[str], config: Config) -> int:
    parser = _parser("dry-run", "Print the config.json that the spec-rewrite paths would produce. Changes nothing but "
                     "the by-path directory it mounts (made under by_path_dir as the shim would, when run as "
                     "root).")
    parser.add_argument("--devices", metavar="SPEC", help="request these GPUs instead of the container's env")
    parser.add_argument("--diff", action="store_true", help="print a unified diff instead of the whole config")
    parser.add_argument("target", metavar="BUNDLE_DIR|CONFIG_FILE")
    opts = parser.parse_args(args)
    from oci_gpu_hook import schemas
    from oci_gpu_hook.appliers import ocispec
    from oci_gpu_hook.plan import plan_for_spec

    path = config_file(opts.target)
    original = load_document(path)
    schemas.validate(original, "oci-config.schema.json", path)
    spec = ContainerSpec(json.loads(json.dumps(original)))
    plan = plan_for_spec(spec, config, opts.devices)
    # the by-path directory and hooks as the shim would, or its refusal; a user other than root (whose output runc
    # could not run) gets the directory checked where it is there, never made (as validate)
    ocispec.apply(spec, plan, config, prepare=os.geteuid() == 0)
    rewritten = spec.raw
    schemas.validate(rewritten, "oci-config.schema.json", f"{path} (rewritten)")
    print(f"# {plan.summary()}", file=sys.stderr)
    new_text = json.dumps(rewritten, indent=2, allow_nan=False) + "\n"
    if opts.diff:
        import difflib

        old_text = json.dumps(original, indent=2, allow_nan=False) + "\n"
        sys.stdout.writelines(difflib.unified_diff(
            old_text.splitlines(keepends=True), new_text.splitlines(keepends=True),
            fromfile=f"{path} (as given)", tofile=f"{path} (rewritten)"))
    else:
        sys.stdout.write(new_text)
    return 0
