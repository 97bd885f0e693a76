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
_SECRET_WORDS = ("PASS", "TOKEN", "SECRET")


def matching_variables(environ: Mapping[str, str], prefixes: tuple[str, ...]) -> dict[str, str]:
    """Variables with these prefixes, sorted, leaving out any that look like credentials."""
    return {
        name: value
        for name, value in sorted(environ.items())
        if name.startswith(prefixes) and name not in _NCCL_DENY
        and not any(word in name for word in _SECRET_WORDS)
    }


def read_environment(environ: Mapping[str, str] | None = None) -> EnvFacts:
    environ = os.environ if environ is None else environ
    variables = {name: environ[name] for name in RELEVANT if name in environ}
    nccl = matching_variables(environ, ("NCCL_",))
    variables.update(nccl)
    return EnvFacts(
        variables=dict(sorted(variables.items())),
        cuda_visible_devices=environ.get("CUDA_VISIBLE_DEVICES"),
        cuda_launch_blocking=environ.get("CUDA_LAUNCH_BLOCKING", "").strip() not in ("", "0"),
        pytorch_cuda_alloc_conf=environ.get("PYTORCH_CUDA_ALLOC_CONF")
        or environ.get("PYTORCH_ALLOC_CONF"),
        nccl_variables=dict(sorted(nccl.items())),
    )
