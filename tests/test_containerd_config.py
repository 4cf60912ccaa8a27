"""The containerd drop-in text: the TOML writer, the CRI table it carries, the imports line."""

from __future__ import annotations

import tomllib
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from oci_gpu_hook.errors import HookError
from oci_gpu_hook.install import containerd

keys = st.text(min_size=1, max_size=12)
scalars = st.one_of(st.booleans(), st.integers(-(2**63), 2**63 - 1), st.text(max_size=20),
                    st.floats(allow_nan=False, allow_infinity=False))
tables = st.recursive(
    st.dictionaries(keys, st.one_of(scalars, st.lists(st.one_of(st.integers(), st.text(max_size=8)), max_size=3)),
                    max_size=4),
    lambda children: st.dictionaries(keys, st.one_of(scalars, children, st.lists(children, min_size=1,
                                                                                  max_size=2)), max_size=4),
    max_leaves=20,
)


@given(tables)
def test_to_toml_round_trips(table: dict[str, Any]) -> None:
    assert tomllib.loads(containerd.to_toml(table)) == table


def test_strings_outside_the_basic_plane_and_del() -> None:
    table = {"a": "emoji \U0001f600, DEL \x7f, tab \t, quote \" and backslash \\"}
    assert tomllib.loads(containerd.to_toml(table)) == table


def test_drop_in_carries_the_main_cri_table_and_adds_ours() -> None:
    main = tomllib.loads('version = 2\n[plugins."io.containerd.grpc.v1.cri"]\n  sandbox_image = "pause:3.9"\n'
                         '[plugins."io.containerd.grpc.v1.cri".containerd]\n  default_runtime_name = "crun"\n')
    cri = tomllib.loads(containerd.drop_in("/opt/bin/oci-gpu-runtime", main))["plugins"][containerd.CRI]
    assert cri["sandbox_image"] == "pause:3.9"
    runtimes = cri["containerd"]["runtimes"]
    assert set(runtimes) == {"crun", "oci-gpu"}  # the default runtime is kept alive, runc is not invented
    assert runtimes["oci-gpu"] == {"runtime_type": "io.containerd.runc.v2",
                                   "container_annotations": ["cdi.k8s.io/*"],
                                   "options": {"BinaryName": "/opt/bin/oci-gpu-runtime"}}
    assert "pod_annotations" not in runtimes["oci-gpu"]


@pytest.mark.parametrize("text", ["", "version = 1\n", '[plugins.cri]\n  sandbox_image = "x"\n'])
def test_a_version_1_config_is_refused(text: str) -> None:
    with pytest.raises(HookError, match="version 1 containerd config"):
        containerd.drop_in("/x", tomllib.loads(text))


def test_with_import() -> None:
    text = 'version = 2\nroot = "/var/lib/containerd"\n\n[grpc]\n  address = "/run/c.sock"\n'
    added = containerd.with_import(text)
    assert added is not None
    assert tomllib.loads(added)["imports"] == ["/etc/containerd/conf.d/*.toml"]
    assert added.index("imports") < added.index("[grpc]")
    assert containerd.with_import(added) is None
    other = containerd.with_import('version = 2\nimports = ["/etc/containerd/site.toml"]\n')
    assert other is not None
    assert tomllib.loads(other)["imports"] == ["/etc/containerd/site.toml", "/etc/containerd/conf.d/*.toml"]
