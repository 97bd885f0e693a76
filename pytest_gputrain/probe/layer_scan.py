"""What a top-level module's layers say about its speed, read once when it is first called.

- convolutions with a bias right before a batch norm of their channels (GT125): the batch norm
  subtracts each channel's mean, so the bias is computed, stored and trained only to be
  cancelled;
- the memory format of the Conv2d weights and of the first input (GT126): channels_last lets
  cuDNN run its tensor-core convolutions without transposing the layout around each one;
- Linear and Embedding dimensions not divisible by 8 (GT127): tensor cores work on multiples of
  8 fp16/bf16 elements (16 bytes).

Registration order stands in for call order: ``nn.Sequential`` calls its children in the order
they were registered, and hand-written blocks register ``self.conv1`` right before ``self.bn1``
by convention. Nothing here runs on the hot path: one walk over the modules per top-level
module and test.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any

MAX_NAMES = 8
TENSOR_CORE_MULTIPLE = 8


@dataclass(slots=True)
class LayerScan:
    """One top-level module's layers, as ``scan_layers`` found them."""

    conv2d: int = 0
    conv_bias_pairs: int = 0
    conv_bias_names: list[str] = field(default_factory=list)
    # Majority layout of the Conv2d weights whose layout is unambiguous; None: none was.
    channels_last_weights: bool | None = None
    channels_last_input: bool | None = None
    linear_weights: int = 0  # weight elements of Linear and Embedding layers (tied ones once)
    misaligned_weights: int = 0
    misaligned: list[tuple[str, int]] = field(default_factory=list)  # (layer, weight elements)


def scan_layers(torch: Any, module: Any, args: Any) -> LayerScan:
    """The module's conv/batch-norm pairs, conv layouts and linear shapes; ``args`` are the
    positional arguments of its first call (the input's layout)."""
    nn = torch.nn
    scan = LayerScan()
    _conv_bias_pairs(nn, module, scan)
    _conv2d_layouts(torch, module, args, scan)
    _linear_shapes(nn, module, scan)
    return scan


def channels_last(torch: Any, tensor: Any) -> bool | None:
    """True/False for a 4-D tensor in channels_last/contiguous layout; None when it is neither
    or both (C == 1, or H == W == 1: both layouts describe the same memory)."""
    if getattr(tensor, "dim", lambda: 0)() != 4:
        return None
    last = bool(tensor.is_contiguous(memory_format=torch.channels_last))
    first = bool(tensor.is_contiguous())
    return last if last != first else None


def _conv_bias_pairs(nn: Any, module: Any, scan: LayerScan) -> None:
    conv_type = nn.modules.conv._ConvNd
    norm_type = nn.modules.batchnorm._BatchNorm
    for parent_name, parent in module.named_modules():
        children = list(parent.named_children())
        for (conv_name, conv), (norm_name, norm) in itertools.pairwise(children):
            if isinstance(conv, conv_type) and getattr(conv, "bias", None) is not None \
                    and isinstance(norm, norm_type) \
                    and getattr(norm, "num_features", None) == conv.out_channels:
                scan.conv_bias_pairs += 1
                if len(scan.conv_bias_names) < MAX_NAMES:
                    prefix = f"{parent_name}." if parent_name else ""
                    scan.conv_bias_names.append(
                        f"{prefix}{conv_name} {type(conv).__name__} -> "
                        f"{prefix}{norm_name} {type(norm).__name__}")


def _conv2d_layouts(torch: Any, module: Any, args: Any, scan: LayerScan) -> None:
    conv2d = torch.nn.Conv2d
    votes = {True: 0, False: 0}
    for sub in module.modules():
        if isinstance(sub, conv2d):
            scan.conv2d += 1
            layout = channels_last(torch, sub.weight)
            if layout is not None:
                votes[layout] += 1
    if votes[True] or votes[False]:
        scan.channels_last_weights = votes[True] >= votes[False]
    if scan.conv2d:
        first = args[0] if args else None
        if isinstance(first, torch.Tensor):
            scan.channels_last_input = channels_last(torch, first)


def _linear_shapes(nn: Any, module: Any, scan: LayerScan) -> None:
    """Linear layers by both dimensions; Embedding layers by their embedding dimension (the
    size every later matmul sees) and, when the weight is tied to an output Linear (an LM
    head), by the vocabulary too, through that Linear. A vocabulary used only for lookups (a
    recommender's table of users) feeds no matmul and is left alone."""
    layers: list[tuple[str, Any, tuple[int, ...], str]] = []
    linear_weights: set[int] = set()
    for name, sub in module.named_modules():
        label = name or type(sub).__name__
        if isinstance(sub, nn.Linear):
            layers.append((f"{label} Linear({sub.in_features}->{sub.out_features})",
                           sub.weight, (sub.in_features, sub.out_features), "linear"))
            linear_weights.add(id(sub.weight))
        elif isinstance(sub, nn.Embedding):
            layers.append((f"{label} Embedding({sub.num_embeddings}, {sub.embedding_dim})",
                           sub.weight, (sub.embedding_dim,), "embedding"))
    seen: set[int] = set()
    for label, weight, dims, kind in layers:
        if weight is None or id(weight) in seen:
            continue
        if kind == "embedding" and id(weight) in linear_weights:
            continue  # tied to a head: judged as that Linear
        seen.add(id(weight))
        try:
            elements = int(weight.numel())
        except Exception:  # a lazy module's uninitialized parameter
            continue
        scan.linear_weights += elements
        if any(int(d) % TENSOR_CORE_MULTIPLE for d in dims):
            scan.misaligned_weights += elements
            scan.misaligned.append((label, elements))
