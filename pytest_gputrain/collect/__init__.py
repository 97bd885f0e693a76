"""Collectors read the world and never judge; each degrades to "unknown, because ..."."""

from __future__ import annotations

import datetime
import time
from collections.abc import Mapping

from pytest_gputrain.collect import nvml
from pytest_gputrain.collect.environment_variables import read_environment
from pytest_gputrain.collect.host import read_host
from pytest_gputrain.collect.toolkit import read_toolkit
from pytest_gputrain.collect.topology import read_topology, topology_indices
from pytest_gputrain.collect.torch_build import read_torch, torch_device_uuids
from pytest_gputrain.facts import EnvironmentFacts


def collect_environment(with_torch: bool = True,
                        environ: Mapping[str, str] | None = None) -> EnvironmentFacts:
    """Read NVML, torch, the host, the relevant variables and nvcc. Never raises.

    ``environ``: the variables to report (default: ``os.environ`` now), e.g. as they were when
    the session began.
    """
    started = time.perf_counter()
    session = nvml.shared()
    system = nvml.read_system(session)
    own = nvml.own_process_ids()
    devices = [nvml.read_device(i, own, session) for i in range(system.device_count or 0)]
    torch_facts = read_torch() if with_torch else None
    facts = EnvironmentFacts(
        collected_at=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        nvml=system,
        devices=devices,
        host=read_host(),
        env=read_environment(environ),
        tools=read_toolkit(),
    )
    if torch_facts is not None:
        facts.torch = torch_facts
        uuids = {uuid: index for index, uuid in torch_device_uuids().items()}
        for device in devices:
            if device.uuid and device.uuid.removeprefix("GPU-") in uuids:
                device.torch_index = uuids[device.uuid.removeprefix("GPU-")]
    facts.topology = read_topology(topology_indices(devices), session)
    facts.collector_seconds = round(time.perf_counter() - started, 3)
    return facts
