"""The cluster daemons: the device plugin, the DRA driver, the health scan, the metrics endpoint, the watch.

Long-running processes a node runs beside its containers, never on a container's start path.
"""
