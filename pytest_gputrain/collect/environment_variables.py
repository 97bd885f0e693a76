"""The environment variables that change how GPU training behaves, and no others.

Reports are pasted into CI logs and issues, so only an allow-list is read: nothing else from the
environment can leak (tokens, passwords).
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from pytest_gputrain.facts import EnvFacts

RELEVANT = (
    "CUDA_VISIBLE_DEVICES",
    "CUDA_LAUNCH_BLOCKING",
    "PYTORCH_CUDA_ALLOC_CONF",
    "PYTORCH_ALLOC_CONF",
)
# NCCL_* is read by prefix, but a few NCCL variables may carry credentials or hosts' secrets.
_NCCL_DENY = ("NCCL_COMM_ID_PASSWORD",)


def read_environment(environ: Mapping[str, str] | None = None) -> EnvFacts:
    environ = os.environ if environ is None else environ
    variables = {name: environ[name] for name in RELEVANT if name in environ}
    nccl = {
        name: value
        for name, value in environ.items()
        if name.startswith("NCCL_") and name not in _NCCL_DENY and "PASS" not in name
        and "TOKEN" not in name and "SECRET" not in name
    }
    variables.update(nccl)
    return EnvFacts(
        variables=dict(sorted(variables.items())),
        cuda_visible_devices=environ.get("CUDA_VISIBLE_DEVICES"),
        cuda_launch_blocking=environ.get("CUDA_LAUNCH_BLOCKING", "").strip() not in ("", "0"),
        pytorch_cuda_alloc_conf=environ.get("PYTORCH_CUDA_ALLOC_CONF")
        or environ.get("PYTORCH_ALLOC_CONF"),
        nccl_variables=dict(sorted(nccl.items())),
    )
