"""The operator side, off the per-container path: install, launchers, containerd, watch, device plugin."""
