"""Gradients nobody uses: parameters that get a gradient at every backward although no optimizer
updates them (a fine-tune that puts only the head in the optimizer and leaves the backbone's
``requires_grad`` on).

Read once, at a step boundary after the warm-up (the optimizer step post hook: the backward has
just filled ``.grad`` and the step has used it), over the parameters of the top-level modules
the test called (a model, or a backbone and a head called one after the other): for each,
whether it requires a gradient, whether ``.grad`` holds one, and whether an optimizer stepped so
far holds it. Only metadata is read (no CUDA call, no sync). Where the optimizers hold none of
these parameters at all, nothing is counted: they keep master copies (fp32 master weights) or
train other tensors. A frozen teacher or an EMA copy run under ``no_grad`` gets no gradient; one
run under grad mode, whose gradients nobody uses, is counted. When the test ends the parameters
found are checked again against every optimizer stepped by then (a second optimizer that steps
every few iterations, a progressive unfreeze that adds a parameter group): only those no
optimizer ever held count.

The gradient memory is exact (``grad.numel() * grad.element_size()`` of each). The backward time
is not measured per parameter; ``grad_facts`` estimates it from the share of the model's
parameters and the GPU's time per step.
"""

from __future__ import annotations

import weakref
from typing import Any

from pytest_gputrain.probe.module_readings import innermost
from pytest_gputrain.probe.run_record import RunRecord, UnusedGradient


def optimizer_parameters(record: RunRecord) -> set[int]:
    """The ids of the parameters every optimizer stepped so far holds (those still alive)."""
    held: set[int] = set()
    for ref in record.optimizers.refs:
        optimizer = ref()
        if optimizer is None:
            continue
        for group in getattr(optimizer, "param_groups", ()):
            held.update(id(param) for param in group.get("params", ()))
    return held


def read_gradients(record: RunRecord) -> None:
    """The parameters of the called modules, once: those that hold a gradient no optimizer
    uses (``record.grads``). A module the probe cannot read leaves them unknown, and the probe
    goes on (``run.probe_errors`` says why)."""
    try:
        _read(record)
    except Exception as exc:
        record.grads.unused.clear()
        record.grads.read_at = None
        record.errors.append(f"reading the parameters' gradients: {exc}")


def _read(record: RunRecord) -> None:
    readings = record.grads
    readings.read_at = len(record.steps.times)
    held = optimizer_parameters(record)
    # Every parameter of the called modules once, in the order the modules were first called,
    # named by its module's class where several modules were called (head.weight: Linear).
    named: list[tuple[str, Any]] = []
    seen: set[int] = set()
    states = [state for state in record.forwards.modules.values() if state.parameters]
    for state in states:
        module = state.ref()
        if module is None:
            continue
        prefix = f"{state.name}." if len(states) > 1 else ""
        for name, param in innermost(module).named_parameters():
            if id(param) not in seen:
                seen.add(id(param))
                named.append((prefix + name, param))
    trained = [i for i, (_, param) in enumerate(named) if id(param) in held]
    if not trained:
        return  # the optimizers hold none of them: fp32 master copies, or not these modules
    # A parameter before every trained one sits ahead of them in the forward (the backbone
    # before the head): freezing it saves its whole backward, the gradient of its input too;
    # one after a trained one still passes its input's gradient on.
    first_trained = trained[0]
    for index, (name, param) in enumerate(named):
        count = int(param.numel())
        readings.model_params += count
        if id(param) in held:
            readings.trained_params += count
            continue
        grad = param.grad
        if not param.requires_grad or grad is None:
            continue
        readings.unused.append(UnusedGradient(
            ref=weakref.ref(param), name=name, params=count,
            grad_bytes=int(grad.numel()) * int(grad.element_size()),
            ahead=index < first_trained))


def check_at_end(record: RunRecord) -> None:
    """Drop the parameters an optimizer took up after the reading; let go of the parameters."""
    readings = record.grads
    if readings.unused:
        held = optimizer_parameters(record)
        kept = []
        for entry in readings.unused:
            param = entry.ref()
            if param is not None and id(param) in held:
                readings.trained_params += entry.params
            else:
                kept.append(entry)
        readings.unused = kept
    for entry in readings.unused:
        entry.ref = None


def unused_by_module(entries: list[UnusedGradient]) -> dict[str, tuple[int, int]]:
    """(parameters, gradient bytes) by the module the parameters belong to: the first part of
    their names (``backbone`` of ``backbone.layer1.0.conv1.weight``; with several modules
    called, their class and its first part: ``Sequential.0``), largest first."""
    groups: dict[str, list[int]] = {}
    for entry in entries:
        parts = entry.name.split(".")
        head = ".".join(parts[:2]) if len(parts) > 2 and parts[0][:1].isupper() else parts[0]
        totals = groups.setdefault(head, [0, 0])
        totals[0] += entry.params
        totals[1] += entry.grad_bytes
    return {name: (params, size) for name, (params, size) in
            sorted(groups.items(), key=lambda item: -item[1][0])}


__all__ = ["check_at_end", "optimizer_parameters", "read_gradients", "unused_by_module"]
