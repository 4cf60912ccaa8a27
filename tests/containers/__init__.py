"""Tests that start real containers (runc, crun, podman, containerd, Docker) on real kernel cgroups."""
