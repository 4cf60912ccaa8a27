"""GetPreferredAllocation: which of the available devices a multi-device request should get.

Preference, strongest first: the partitions of one GPU; then devices that share
both an XGMI hive and a NUMA node; then one NUMA node; then one hive.  The first
of these groupings that can hold the whole request (the must-include devices
and the rest) decides, and among the groups that can, the smallest one is
taken (best fit: bigger free groups stay whole for bigger requests).  When no
group can hold it, devices are taken group by group, preferring groups close
to what is already chosen and then the largest ones, so the request spans as
few GPUs, hives and NUMA nodes as it can.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

from oci_gpu_hook.cluster.deviceplugin.devices import PluginDevice

Key = Callable[[PluginDevice], object]


def _parent(device: PluginDevice) -> object:
    return ("gpu", device.parent)


def _hive_numa(device: PluginDevice) -> object:
    return None if device.hive is None or device.numa is None else ("hive-numa", device.hive, device.numa)


def _numa(device: PluginDevice) -> object:
    return None if device.numa is None else ("numa", device.numa)


def _hive(device: PluginDevice) -> object:
    return None if device.hive is None else ("hive", device.hive)


LEVELS: tuple[Key, ...] = (_parent, _hive_numa, _numa, _hive)  # finest first


def _order(device: PluginDevice) -> tuple[str, int]:
    return device.parent, device.partition or 0


def _best_fit(pool: Sequence[PluginDevice], chosen: Sequence[PluginDevice], need: int,
              key: Key) -> list[PluginDevice] | None:
    """The smallest group of ``pool`` (by ``key``) that holds ``need`` devices and shares the chosen
    devices' key; None when there is none (or the chosen devices already differ in it)."""
    chosen_keys = {key(d) for d in chosen}
    if None in chosen_keys or len(chosen_keys) > 1:
        return None
    groups: dict[object, list[PluginDevice]] = {}
    for device in pool:
        group = key(device)
        if group is not None and (not chosen_keys or group in chosen_keys):
            groups.setdefault(group, []).append(device)
    fitting = [members for members in groups.values() if len(members) >= need]
    if not fitting:
        return None
    return min(fitting, key=lambda members: (len(members), _order(min(members, key=_order))))


def _spread(pool: Sequence[PluginDevice], chosen: Sequence[PluginDevice], need: int) -> list[PluginDevice]:
    """Take ``need`` devices GPU by GPU: GPUs near the chosen ones first (same GPU, hive, NUMA node),
    then the GPUs with the most free devices; the last GPU is the smallest one that completes it."""
    by_parent: dict[str, list[PluginDevice]] = {}
    for device in sorted(pool, key=_order):
        by_parent.setdefault(device.parent, []).append(device)
    taken: list[PluginDevice] = []
    picked = list(chosen)
    while len(taken) < need and by_parent:
        remaining = need - len(taken)

        def closeness(parent: str, picked: list[PluginDevice] = picked) -> tuple[int, int, int]:
            first = by_parent[parent][0]
            return (0 if any(d.parent == parent for d in picked) else 1,
                    0 if first.numa is not None and any(d.numa == first.numa for d in picked) else 1,
                    0 if first.hive is not None and any(d.hive == first.hive for d in picked) else 1)

        best = min(closeness(p) for p in by_parent)
        near = [p for p in by_parent if closeness(p) == best]
        completing = [p for p in near if len(by_parent[p]) >= remaining]
        if completing:
            parent = min(completing, key=lambda p: (len(by_parent[p]), p))
        else:
            parent = min(near, key=lambda p: (-len(by_parent[p]), p))
        batch = by_parent.pop(parent)[:remaining]
        taken.extend(batch)
        picked.extend(batch)
    return taken


def _pick(pool: Sequence[PluginDevice], chosen: Sequence[PluginDevice], need: int,
          levels: Sequence[Key]) -> list[PluginDevice]:
    if need <= 0:
        return []
    for depth, key in enumerate(levels):
        group = _best_fit(pool, chosen, need, key)
        if group is not None:
            if depth == 0:
                return sorted(group, key=_order)[:need]
            return _pick(group, chosen, need, levels[:depth])
    return _spread(pool, chosen, need)


def preferred(devices: Iterable[PluginDevice], available: Sequence[str], must_include: Sequence[str],
              size: int) -> list[str]:
    """The IDs to allocate: every must-include ID first, then the best ``size - len(must_include)`` of
    the other available IDs.  IDs this plugin does not know are taken last, in the order given."""
    known = {d.id: d for d in devices}
    result = list(dict.fromkeys(must_include))
    chosen = [known[i] for i in result if i in known]
    pool = [known[i] for i in dict.fromkeys(available) if i in known and i not in result]
    picks = _pick(pool, chosen, min(size - len(result), len(pool)), LEVELS)
    result.extend(d.id for d in picks)
    result.extend(i for i in dict.fromkeys(available) if i not in known and i not in result)
    return result[:max(size, len(must_include))]
