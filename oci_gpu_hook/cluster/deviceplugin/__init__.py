"""``oci-gpu-hook device-plugin``: a kubelet device plugin for the host's AMD GPUs and compute partitions and
NVIDIA GPUs and MIG devices, from one process (one endpoint per resource).

Operator side only: it needs ``grpcio`` and ``protobuf`` (the ``device-plugin``
extra), which nothing on a container's start path imports.
"""

from __future__ import annotations

TYPE_CHECKING = False  # not typing's: see oci_gpu_hook/startpath.py

if TYPE_CHECKING:
    from oci_gpu_hook.config import Config

# The health state's directory under the kubelet's device-plugins directory: a starting kubelet removes files there
# (its plugins' sockets; older kubelets every file but their checkpoint), never a directory; and the DaemonSet
# mounts that directory already.
STATE_SUBDIR = "oci-gpu-hook"


def _managed_dir(directory: str) -> None:
    """A CDI directory the plugin is to write: created when missing; one that cannot be, or that is not
    trusted, is the one error line at start (as for ``watch``)."""
    import os

    from oci_gpu_hook.appliers.cdi import check_output_dir
    from oci_gpu_hook.errors import HookError

    try:
        os.makedirs(directory, exist_ok=True)
    except OSError as err:
        raise HookError(f"--cdi-dir {directory}: cannot create it: {err.strerror}") from None
    if not os.access(directory, os.W_OK | os.X_OK):
        raise HookError(f"--cdi-dir {directory}: cannot write into it")
    check_output_dir(os.path.abspath(directory))


def command(args: list[str], config: Config) -> int:
    from oci_gpu_hook.cliparse import parser as _parser
    from oci_gpu_hook.cluster.daemon import seconds, serve, uevents
    from oci_gpu_hook.cluster.deviceplugin.devices import STRATEGIES
    from oci_gpu_hook.errors import HookError

    parser = _parser("device-plugin", "Advertise the host's AMD GPUs and compute partitions and NVIDIA GPUs and "
                                      "MIG devices to the kubelet (device plugin API v1beta1); Allocate answers "
                                      "with stable CDI names.")
    parser.add_argument("--kubelet-dir", metavar="DIR", default="/var/lib/kubelet/device-plugins",
                        help="the kubelet's device-plugins directory, with kubelet.sock (default %(default)s)")
    parser.add_argument("--resource-strategy", choices=STRATEGIES, default="single",
                        help="single: everything is amd.com/gpu, nvidia.com/gpu (MIG devices only when every "
                             "NVIDIA GPU has MIG devices of one profile); mixed: partitions as "
                             "amd.com/<compute>_<memory> (amd.com/cpx_nps1), MIG devices as nvidia.com/mig-<profile> "
                             "(nvidia.com/mig-1g.10gb), whole GPUs as amd.com/gpu, nvidia.com/gpu "
                             "(default %(default)s)")
    parser.add_argument("--rescan-interval", metavar="SECONDS", default="10",
                        help="how often GPUs are read again for health (default %(default)s)")
    parser.add_argument("--device-specs", action="store_true",
                        help="also answer Allocate with the device nodes (for nodes with neither CDI nor the shim)")
    parser.add_argument("--no-uevents", action="store_true",
                        help="do not listen for GPU uevents (drm, kfd, a GPU's pci; rescan only every "
                             "--rescan-interval)")
    parser.add_argument("--cdi-dir", metavar="DIR", action="append", default=None,
                        help="a CDI spec directory the plugin manages (repeatable): it keeps amd.com-gpu.json and "
                             "nvidia.com-gpu.json there current after every scan and checks them before each "
                             "Allocate, rewriting a stale one, "
                             f"so a runtime resolves each name it hands out to that device (default: cdi_dir, "
                             f"{config.cdi_dir})")
    parser.add_argument("--no-cdi-specs", action="store_true",
                        help="manage no CDI spec (then something else, e.g. `oci-gpu-hook watch`, must keep the "
                             "runtime's specs current)")
    parser.add_argument("--state-dir", metavar="DIR", default=None,
                        help=f"where the health state goes (wedged GPUs, across a restart of the plugin; default: "
                             f"<kubelet dir>/{STATE_SUBDIR}, a directory, which a starting kubelet leaves in place)")
    parser.add_argument("--metrics-address", metavar="HOST:PORT", default=None,
                        help="serve Prometheus metrics at http://HOST:PORT/metrics (:PORT: loopback, 127.0.0.1; "
                             "0.0.0.0:PORT or [::]:PORT: every address; needs prometheus_client; default: none)")
    parser.add_argument("--list", action="store_true",
                        help="print the devices as they would be advertised, with their health; exit")
    opts = parser.parse_args(args)
    interval = seconds(opts.rescan_interval, "--rescan-interval", 0.1, 3600)
    if opts.no_cdi_specs and opts.cdi_dir:
        from oci_gpu_hook.cliparse import UsageError

        raise UsageError("device-plugin: --cdi-dir and --no-cdi-specs exclude each other")
    kinds = tuple(config.backends)
    if opts.list:  # the inventory only: no gRPC needed
        from oci_gpu_hook.cluster.deviceplugin.devices import plan, scan_served

        inventory = scan_served(config.sysfs_root, proc_root=config.proc_root, driver_root=config.driver_root,
                                kinds=kinds)
        from oci_gpu_hook.cluster.health import GOOD, one_sample

        devices, notes = plan(inventory, opts.resource_strategy)
        verdicts = one_sample(config, inventory)
        for device in devices:
            numa = "-" if device.numa is None else str(device.numa)
            print(f"{device.resource}  {device.id}  {device.qualified}  numa {numa}  "
                  f"hive {device.hive if device.hive is not None else '-'}  "
                  f"{verdicts.get(device.parent, GOOD).status_line}")
        for note in notes:
            print(f"# {note}")
        return 0
    try:
        from oci_gpu_hook.cluster.deviceplugin import server
    except ImportError as err:
        raise HookError(f"device-plugin needs grpcio and protobuf ({err}): "
                        "pip install 'oci-gpu-hook[device-plugin]'") from None

    specs = None
    if not opts.no_cdi_specs:
        from oci_gpu_hook.cluster.deviceplugin.specs import SpecKeeper

        directories = opts.cdi_dir or [config.cdi_dir]
        for directory in directories:
            _managed_dir(directory)
        specs = SpecKeeper(config, directories, server.log_line)
    import os

    from oci_gpu_hook.cluster.health import resident_monitor

    state_dir = opts.state_dir or os.path.join(opts.kubelet_dir, STATE_SUBDIR)
    tracker = server.Tracker(config.sysfs_root, opts.resource_strategy, specs=specs, proc_root=config.proc_root,
                             driver_root=config.driver_root, kinds=kinds,
                             monitor=resident_monitor(config, state_dir, server.log_line))
    events = uevents(not opts.no_uevents, interval, server.log_line)
    manager = server.Manager(opts.kubelet_dir, tracker, device_specs=opts.device_specs, rescan_interval=interval,
                             events=events)

    return serve(manager, events, opts.metrics_address)
