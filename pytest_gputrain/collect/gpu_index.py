"""Which GPU is which: how many GPUs NVML sees, and the NVML index of torch's ``cuda:N``.

NVML numbers every GPU of the machine in PCI bus order; torch numbers the GPUs
``CUDA_VISIBLE_DEVICES`` leaves visible, in CUDA's order. Once torch has initialised CUDA a
device's UUID settles the question; before, the variable is read as the CUDA driver reads it.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Sequence

from pytest_gputrain.collect.nvml_session import Nvml, Reading, as_text, shared


def read_device_count(nvml: Nvml | None = None) -> Reading:
    """How many GPUs NVML sees (an ``int``), whatever ``CUDA_VISIBLE_DEVICES`` says."""
    return (nvml or shared()).call("nvmlDeviceGetCount").map(int)


def _bare_uuid(text: str) -> str:
    """A GPU UUID lower case without ``GPU-``: NVML says ``GPU-<hex>``, torch ``<hex>``."""
    text = text.strip().lower()
    return text[len("gpu-"):] if text.startswith("gpu-") else text


def _is_uuid_entry(entry: str) -> bool:
    return entry.upper().startswith("GPU-")


def _index_entry(entry: str, count: int) -> int | None:
    # CUDA reads an index like strtoul: its leading digits ("1gpu2" is 1).
    digits = re.match(r"\d+", entry)
    if digits is None:
        return None
    index = int(digits.group())
    return index if index < count else None


def _uuid_entry(entry: str, uuids: Sequence[str | None]) -> int | None:
    # A UUID entry may be any prefix that names exactly one GPU.
    if not _is_uuid_entry(entry):
        return None
    wanted = _bare_uuid(entry)
    if not wanted:
        return None
    matches = [index for index, uuid in enumerate(uuids)
               if uuid is not None and _bare_uuid(uuid).startswith(wanted)]
    return matches[0] if len(matches) == 1 else None


def visible_nvml_indices(visible: str | None, uuids: Sequence[str | None]) -> list[int]:
    """The NVML indices of cuda:0, cuda:1, ... under ``CUDA_VISIBLE_DEVICES=visible``.

    ``uuids`` holds every GPU's UUID in NVML order (None where NVML cannot read one). The variable
    is read as the CUDA driver reads it (and torch's ``_parse_visible_devices`` models it): unset
    shows every GPU; otherwise a list of indices, or of ``GPU-`` UUIDs where a unique prefix will
    do. The first entry that names no GPU (garbage, a negative or too large index, a ``MIG-``
    instance, an unknown or ambiguous UUID) hides itself and every entry after it, and a GPU
    named twice hides them all. Indices are taken in NVML (PCI bus) order, which is CUDA's order
    when ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` or the GPUs are all one model.
    """
    count = len(uuids)
    if visible is None:
        return list(range(count))
    entries = [entry.strip() for entry in visible.split(",")]
    by_uuid = _is_uuid_entry(entries[0])
    indices: list[int] = []
    for entry in entries:
        index = _uuid_entry(entry, uuids) if by_uuid else _index_entry(entry, count)
        if index is None:
            break
        if index in indices:
            return []
        indices.append(index)
    return indices


def _device_uuids(nvml: Nvml) -> list[str | None] | None:
    """Every GPU's UUID in NVML order (None for one NVML cannot read); None without NVML."""
    count = read_device_count(nvml)
    if not count.ok:
        return None
    uuids: list[str | None] = []
    for index in range(count.value):
        uuid = nvml.device_call(index, "nvmlDeviceGetUUID").map(as_text)
        uuids.append(uuid.value if uuid.ok else None)
    return uuids


def _torch_device_uuid(cuda_index: int) -> str | None:
    """torch's UUID for cuda:N, only where CUDA is initialised already (no new context)."""
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    try:
        if not torch.cuda.is_initialized():
            return None
        return str(torch.cuda.get_device_properties(cuda_index).uuid) or None
    except Exception:  # a torch without .uuid, an index torch does not know, a broken context
        return None


def index_for_cuda_device(cuda_index: int, nvml: Nvml | None = None) -> int | None:
    """NVML index of torch's ``cuda:<cuda_index>``; None when NVML knows no such GPU.

    Once torch has initialised CUDA, the device's UUID settles it; before (or for a MIG
    instance, whose UUID no NVML GPU has), ``CUDA_VISIBLE_DEVICES`` does, read by
    ``visible_nvml_indices``. Creates no CUDA context and never raises.
    """
    nvml = nvml or shared()
    uuids = _device_uuids(nvml)
    if uuids is None or cuda_index < 0:
        return None
    torch_uuid = _torch_device_uuid(cuda_index)
    if torch_uuid is not None:
        wanted = _bare_uuid(torch_uuid)
        for index, uuid in enumerate(uuids):
            if uuid is not None and _bare_uuid(uuid) == wanted:
                return index
    visible = visible_nvml_indices(os.environ.get("CUDA_VISIBLE_DEVICES"), uuids)
    return visible[cuda_index] if cuda_index < len(visible) else None
