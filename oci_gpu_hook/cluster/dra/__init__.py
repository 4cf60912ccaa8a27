"""``oci-gpu-hook dra``: a Kubernetes DRA driver for the host's AMD, Intel and NVIDIA GPUs, partitions and MIG
devices, from one process under one driver name (docs/dra.md argues the name).

It publishes the node's devices (:mod:`.devices`) as ResourceSlices
(:mod:`.slices`, over :mod:`.kube`'s plain HTTPS), registers at the kubelet as
a DRA plugin, prepares each claim as a CDI spec of its own and reports device
health (:mod:`.server`, :mod:`.claims`).
Operator side only: it needs ``grpcio`` and ``protobuf`` (the ``device-plugin``
extra), which nothing on a container's start path imports.
"""

from __future__ import annotations

import json
import os
import re
import sys

from oci_gpu_hook.config import Config
from oci_gpu_hook.errors import HookError

TYPE_CHECKING = False  # not typing's: see oci_gpu_hook/startpath.py

if TYPE_CHECKING:
    from oci_gpu_hook.inventory import Inventory

DEFAULT_DRIVER = "gpu.oci-gpu-hook.io"
DNS_SUBDOMAIN = re.compile(r"^(?=.{1,63}$)[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


def command(args: list[str], config: Config) -> int:
    from oci_gpu_hook.cliparse import parser as _parser
    from oci_gpu_hook.cluster.daemon import seconds, serve, uevents
    from oci_gpu_hook.cluster.dra.slices import VERSIONS

    parser = _parser("dra", "A Kubernetes DRA driver: publish this node's GPUs, partitions and MIG devices as "
                            "ResourceSlices, register at the kubelet, prepare each claim as a CDI spec of its own.")
    parser.add_argument("--driver-name", default=DEFAULT_DRIVER, metavar="NAME",
                        help="the DRA driver name, a DNS subdomain (default %(default)s)")
    parser.add_argument("--node-name", default=None, metavar="NAME",
                        help="this node's name, also its pool's (default: $NODE_NAME, from the pod's spec.nodeName)")
    parser.add_argument("--kubelet-registry-dir", default="/var/lib/kubelet/plugins_registry", metavar="DIR",
                        help="where the kubelet looks for plugins (default %(default)s)")
    parser.add_argument("--kubelet-plugins-dir", default="/var/lib/kubelet/plugins", metavar="DIR",
                        help="where the DRA socket and the checkpoint go, in <DIR>/<driver> (default %(default)s)")
    parser.add_argument("--cdi-dir", default=config.cdi_dir, metavar="DIR",
                        help="where the claims' CDI specs go (default: cdi_dir, %(default)s)")
    parser.add_argument("--state-dir", default=None, metavar="DIR",
                        help="where the checkpoint and the health state (wedged GPUs, across a restart) go "
                             "(default: <kubelet plugins dir>/<driver>)")
    parser.add_argument("--rescan-interval", metavar="SECONDS", default="10",
                        help="how often the devices are read again and the slices checked (default %(default)s)")
    parser.add_argument("--no-uevents", action="store_true", help="do not listen for GPU uevents")
    parser.add_argument("--kube-api-server", metavar="URL", default=None,
                        help="https://HOST:PORT (default: from KUBERNETES_SERVICE_HOST/PORT)")
    parser.add_argument("--kube-token-file", metavar="FILE", default=None,
                        help="bearer token (default: the pod's service account token)")
    parser.add_argument("--kube-ca-file", metavar="FILE", default=None,
                        help="the API server's CA (default: the pod's service account ca.crt)")
    parser.add_argument("--resource-api-version", choices=VERSIONS, default=None,
                        help="resource.k8s.io version (default: the newest the API server offers)")
    parser.add_argument("--shared-counters", choices=("auto", "off"), default="auto",
                        help="auto: a split GPU is published whole and as its parts, with shared counters, where the "
                             "API server keeps them (Kubernetes 1.33+, DRAPartitionableDevices on), else as its parts "
                             "only; off: always as its parts only (for a scheduler without the gate) (default "
                             "%(default)s)")
    parser.add_argument("--metrics-address", metavar="HOST:PORT", default=None,
                        help="serve Prometheus metrics at http://HOST:PORT/metrics (:PORT: loopback, 127.0.0.1; "
                             "0.0.0.0:PORT or [::]:PORT: every address; needs prometheus_client; default: none)")
    parser.add_argument("--list", action="store_true",
                        help="print the devices as they would be published (JSON, the slices' devices, with their "
                             "counters unless --shared-counters off; what is left out on stderr); exit")
    opts = parser.parse_args(args)
    interval = seconds(opts.rescan_interval, "--rescan-interval", 0.1, 3600)
    driver = opts.driver_name
    if not DNS_SUBDOMAIN.match(driver):
        raise HookError(f"--driver-name {driver!r}: expected a DNS subdomain of at most 63 characters "
                        f"(e.g. {DEFAULT_DRIVER})")
    from oci_gpu_hook.inventory import scan_host

    def scan() -> Inventory:
        return scan_host(config, strict=False)

    if opts.list:
        from oci_gpu_hook.cluster.dra.devices import build, without_counters
        from oci_gpu_hook.cluster.dra.slices import device_object

        devices, notes = build(scan_host(config, strict=False))
        if opts.shared_counters == "off":
            devices = without_counters(devices)
        print(json.dumps([device_object(d, opts.resource_api_version or VERSIONS[0]) for d in devices], indent=1))
        for note in notes:  # stdout stays one JSON document
            print(f"oci-gpu-hook dra: {note}", file=sys.stderr)
        return 0
    node = opts.node_name or os.environ.get("NODE_NAME")
    if not node:
        raise HookError("dra: no node name: give --node-name, or set NODE_NAME (the DaemonSet passes spec.nodeName)")
    try:
        from oci_gpu_hook.cluster.dra import server
    except ImportError as err:
        raise HookError(f"dra needs grpcio and protobuf ({err}): pip install 'oci-gpu-hook[device-plugin]'") from None
    from oci_gpu_hook.appliers.cdi import make_dirs
    from oci_gpu_hook.cluster.dra.claims import Claims
    from oci_gpu_hook.cluster.dra.kube import Client, Credentials
    from oci_gpu_hook.cluster.dra.slices import Publisher

    make_dirs(opts.cdi_dir, "--cdi-dir")
    client = Client(Credentials.in_cluster(opts.kube_api_server, opts.kube_token_file, opts.kube_ca_file))
    publisher = Publisher(client, driver, node, server.log_line, opts.resource_api_version,
                          counters=opts.shared_counters == "auto")
    state_dir = opts.state_dir or os.path.join(opts.kubelet_plugins_dir, driver)

    def version() -> str:
        if publisher.version is None:
            from oci_gpu_hook.cluster.dra.slices import choose_version

            publisher.version = choose_version(client, opts.resource_api_version)
        return publisher.version

    def claims(plugin: server.Driver) -> Claims:
        return Claims(config, driver, node, opts.cdi_dir, state_dir, client, plugin.current, server.log_line,
                      version)

    from oci_gpu_hook.cluster.health import resident_monitor

    events = uevents(not opts.no_uevents, interval, server.log_line)
    plugin = server.Driver(driver, scan, publisher, claims, registry_dir=opts.kubelet_registry_dir,
                           plugins_dir=opts.kubelet_plugins_dir, rescan_interval=interval, events=events,
                           monitor=resident_monitor(config, state_dir, server.log_line))

    return serve(plugin, events, opts.metrics_address)
