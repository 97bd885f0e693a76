"""How the GPUs are linked: NVML common ancestor, P2P status and NVLink state per GPU pair.

Read once per session for the GPUs torch can use (all GPUs when torch's view is unknown). Every
call goes through the NVML wrapper: NotSupported (common in VMs and for NVLink state) leaves the
fact unknown with NVML's words as the reason; nothing here raises.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pytest_gputrain.collect.nvml_session import Nvml, Reading, shared
from pytest_gputrain.facts import DeviceFacts, GpuPairFacts, TopologyFacts

# nvmlGpuTopologyLevel_t
LEVELS: dict[int, str] = {0: "internal", 10: "single", 20: "multiple", 30: "hostbridge",
                          40: "node", 50: "system"}
# nvmlGpuP2PStatus_t
P2P_STATUS: dict[int, str] = {0: "ok", 1: "chipset_not_supported", 2: "gpu_not_supported",
                              3: "ioh_topology_not_supported", 4: "disabled_by_regkey",
                              5: "not_supported", 6: "unknown"}
# nvmlGpuP2PCapsIndex_t (pynvml's NVML_P2P_CAPS_INDEX_READ is a tuple by mistake: use numbers)
P2P_READ = 0
P2P_NVLINK = 2
NVLINK_MAX_LINKS = 18  # NVML_NVLINK_MAX_LINKS for Hopper; later GPUs answer InvalidArgument past it
OVER_SYSTEM = ("node", "system")


def topology_indices(devices: Sequence[DeviceFacts]) -> list[int]:
    """The NVML indices to examine: the GPUs torch sees, or every GPU if that is unknown."""
    visible = [d.index for d in devices if d.torch_index is not None]
    return sorted(visible) if visible else sorted(d.index for d in devices)


def _active_links(nvml: Nvml, handle: Any) -> int | None:
    active = 0
    for link in range(NVLINK_MAX_LINKS):
        reading = nvml.call("nvmlDeviceGetNvLinkState", handle, link)
        if not reading.ok:
            if link == 0:
                return None  # NotSupported: no NVLink, or NVML cannot tell (VMs)
            break
        active += 1 if reading.value else 0
    return active


def read_topology(indices: Sequence[int], nvml: Nvml | None = None) -> TopologyFacts:
    nvml = nvml or shared()
    facts = TopologyFacts(gpu_count=len(indices))
    fields = ("pair_count", "pairs", "nvlink_pair_count", "nvlink_active_links",
              "gpu_pairs_without_p2p", "gpu_pairs_over_system", "gpu_pairs_without_nvlink")
    if not nvml.available:
        for field in fields:
            facts.mark_unknown(field, nvml.reason or "NVML not available")
        return facts
    handles: dict[int, Any] = {}
    for index in indices:
        reading = nvml.call("nvmlDeviceGetHandleByIndex", index)
        if not reading.ok:
            for field in fields:
                facts.mark_unknown(field, f"GPU {index}: {reading.error}")
            return facts
        handles[index] = reading.value
    facts.nvlink_active_links = [_active_links(nvml, handles[i]) for i in indices]
    pairs = [_read_pair(nvml, a, b, handles[a], handles[b])
             for n, a in enumerate(indices) for b in indices[n + 1:]]
    facts.pairs = pairs
    facts.pair_count = len(pairs)
    _summarise(facts, pairs)
    return facts


def _read_pair(nvml: Nvml, a: int, b: int, handle_a: Any, handle_b: Any) -> GpuPairFacts:
    pair = GpuPairFacts(a=a, b=b)
    ancestor = nvml.call("nvmlDeviceGetTopologyCommonAncestor", handle_a, handle_b)
    _set(pair, "common_ancestor", ancestor, lambda v: LEVELS.get(int(v)))
    read = nvml.call("nvmlDeviceGetP2PStatus", handle_a, handle_b, P2P_READ)
    _set(pair, "p2p_read", read, lambda v: P2P_STATUS.get(int(v), "unknown"))
    nvlink = nvml.call("nvmlDeviceGetP2PStatus", handle_a, handle_b, P2P_NVLINK)
    _set(pair, "p2p_nvlink", nvlink, lambda v: int(v) == 0)
    return pair


def _set(pair: GpuPairFacts, field: str, reading: Reading, convert: Any) -> None:
    if reading.ok:
        try:
            value = convert(reading.value)
        except (TypeError, ValueError) as exc:
            pair.mark_unknown(field, f"unexpected value {reading.value!r}: {exc}")
            return
        if value is None:
            pair.mark_unknown(field, f"unknown NVML value {reading.value!r}")
        else:
            setattr(pair, field, value)
    else:
        pair.mark_unknown(field, reading.error or "unknown")


def _summarise(facts: TopologyFacts, pairs: list[GpuPairFacts]) -> None:
    def label(pair: GpuPairFacts) -> str:
        return f"{pair.a}-{pair.b}"

    if pairs and all(p.p2p_read is None for p in pairs):
        facts.mark_unknown("gpu_pairs_without_p2p", pairs[0].unknown.get("p2p_read", "unknown"))
    else:
        facts.gpu_pairs_without_p2p = [label(p) for p in pairs
                                       if p.p2p_read is not None and p.p2p_read != "ok"]
    if pairs and all(p.p2p_nvlink is None for p in pairs):
        reason = pairs[0].unknown.get("p2p_nvlink", "unknown")
        for field in ("nvlink_pair_count", "gpu_pairs_without_nvlink"):
            facts.mark_unknown(field, reason)
    else:
        facts.nvlink_pair_count = sum(1 for p in pairs if p.p2p_nvlink)
        facts.gpu_pairs_without_nvlink = [label(p) for p in pairs if p.p2p_nvlink is False]
    if pairs and all(p.common_ancestor is None for p in pairs):
        facts.mark_unknown("gpu_pairs_over_system",
                           pairs[0].unknown.get("common_ancestor", "unknown"))
    else:
        facts.gpu_pairs_over_system = [
            label(p) for p in pairs
            if p.common_ancestor in OVER_SYSTEM and p.p2p_nvlink is not True]
