"""What the run probe reads of a top-level module once, when it is first called, and of the
DistributedDataParallel modules and optimizers it meets: plain reads with no probe state.

- Mode layers: layers whose behaviour depends on ``module.training`` (dropout with p > 0, batch
  norm and other norms that track running statistics, RNN dropout, attention dropout).
- Wrappers: DistributedDataParallel, DataParallel and torch.compile's OptimizedModule; the
  wrapped module's ``training`` flag is the one ``model.eval()`` sets.
- DDP's own logging data (``DistributedDataParallel._get_ddp_logging_data()``): whether
  ``find_unused_parameters`` is on and how many bytes of parameters it found unused.
- The optimizer's configured implementation (``foreach`` / ``fused`` in its defaults).

Classes are recognised by name where importing them would pull in torch.distributed.
"""

from __future__ import annotations

from typing import Any

DDP_NAMES = ("DistributedDataParallel",)
SHARDED_NAMES = ("FullyShardedDataParallel", "FSDPModule")
COMPILED_NAME = "OptimizedModule"
MAX_WRAPPERS = 4  # wrappers unwrapped around one model (compile(DDP(model)) is two)


def wrapped_module(module: Any) -> Any:
    """The module a DDP, DataParallel or compiled wrapper holds, else None."""
    name = type(module).__name__
    if name == COMPILED_NAME:
        return getattr(module, "_orig_mod", None)
    if name in DDP_NAMES or name == "DataParallel":
        return getattr(module, "module", None)
    return None


def innermost(module: Any) -> Any:
    for _ in range(MAX_WRAPPERS):
        inner = wrapped_module(module)
        if inner is None:
            break
        module = inner
    return module


def ddp_module(module: Any) -> Any:
    """The DistributedDataParallel module among ``module`` and the wrappers inside it."""
    for _ in range(MAX_WRAPPERS):
        if type(module).__name__ in DDP_NAMES:
            return module
        module = wrapped_module(module)
        if module is None:
            break
    return None


def mode_layers(torch: Any, module: Any) -> tuple[int, Any]:
    """(layers that act differently in train and eval mode, the first batch norm among them)."""
    nn = torch.nn
    dropout = nn.modules.dropout._DropoutNd
    norm = getattr(nn.modules.batchnorm, "_NormBase", nn.modules.batchnorm._BatchNorm)
    rnn = nn.RNNBase
    attention = nn.MultiheadAttention
    count = 0
    first_norm = None
    for sub in module.modules():
        if isinstance(sub, dropout):
            active = float(getattr(sub, "p", 0.0)) > 0.0
        elif isinstance(sub, norm):
            active = bool(getattr(sub, "track_running_stats", False))
            if active and first_norm is None:
                first_norm = sub
        elif isinstance(sub, rnn):
            active = float(getattr(sub, "dropout", 0.0)) > 0.0 and sub.num_layers > 1
        elif isinstance(sub, attention):
            active = float(getattr(sub, "dropout", 0.0)) > 0.0
        else:
            continue
        count += int(active)
    return count, first_norm


def compiled_wrapper_target(module: Any) -> str | None:
    """The class torch.compile wrapped, for an OptimizedModule; else None."""
    if type(module).__name__ != COMPILED_NAME:
        return None
    inner = getattr(module, "_orig_mod", None)
    return type(inner).__name__ if inner is not None else None


def wraps_data_parallel(class_name: str | None) -> bool:
    return class_name in DDP_NAMES or class_name in SHARDED_NAMES


def ddp_world_size(ddp: Any) -> int | None:
    group = getattr(ddp, "process_group", None)
    try:
        return int(group.size()) if group is not None else None
    except Exception:
        return None


def ddp_logging(ddp: Any) -> dict[str, Any]:
    """The DDP logging data the facts use; {} where this torch has none."""
    reader = getattr(ddp, "_get_ddp_logging_data", None)
    if reader is None:
        return {}
    data = reader()
    keys = ("find_unused_parameters", "unused_parameter_size", "iteration", "world_size",
            "avg_backward_comm_time", "avg_backward_compute_comm_overlap_time")
    return {key: data[key] for key in keys if key in data}


def optimizer_setup(optimizer: Any) -> tuple[bool | None, bool | None, int]:
    """(foreach, fused) as configured (None: torch's default) and the parameter tensors."""
    defaults = getattr(optimizer, "defaults", None) or {}
    foreach = defaults.get("foreach")
    fused = defaults.get("fused")
    tensors = sum(len(group.get("params", ())) for group in optimizer.param_groups)
    return (bool(foreach) if foreach is not None else None,
            bool(fused) if fused is not None else None, tensors)
