"""The training habits' groups of ``RunFacts`` (``facts.py``): torch.compile
(``run.compile.*``), the main optimizer (``run.optimizer.*``: its implementation, host time,
zero_grad, learning rate and gradient clipping) and DistributedDataParallel (``run.ddp.*``).
Built by ``habit_facts_builder.py``.
"""

from __future__ import annotations

from pydantic import Field

from pytest_gputrain.facts import FactGroup, fact


class CompileFacts(FactGroup):
    """torch.compile during the test: dynamo's counters (``torch._dynamo.utils.counters``) read
    at the start, after the warm-up steps and at the end, and the compiles per step."""

    used: bool | None = fact(doc="a compiled module was called or dynamo compiled a frame")
    compiled_calls: int | None = fact(doc="top-level calls of compiled modules (OptimizedModule)")
    frames_compiled: int | None = fact(doc="frames dynamo tried to compile during the test")
    frames_after_warmup: int | None = fact(doc="of those, frames tried after the warm-up steps")
    frames_failed: int | None = fact(
        doc="frames that failed to compile and ran eagerly (frames total - ok)")
    compiles: int | None = fact(doc="compilations started during the test (dynamo callbacks)")
    steps_with_compile: int | None = fact(doc="optimizer steps after warm-up in which a "
                                              "compilation started")
    recompile_steps_percent: float | None = fact(
        "%", "steps_with_compile / optimizer steps after warm-up")
    recompile_limit_hits: int | None = fact(
        doc="frames that hit the recompile limit (recompile_limit, formerly cache_size_limit) "
            "and now run eagerly")
    recompile_reasons: list[str] = Field(
        default_factory=list, description="guard failures that caused recompiles (first line, "
                                          "at most 5 distinct)")
    unique_graphs: int | None = fact(doc="graphs compiled during the test")
    graph_breaks: int | None = fact(doc="graph breaks during the test")
    graph_break_reasons: list[str] = Field(
        default_factory=list, description="graph break reasons, most frequent first (first "
                                          "line, at most 5)")
    suppress_errors: bool | None = fact(
        doc="torch._dynamo.config.suppress_errors was on while the test trained")
    compile_time: float | None = fact("s", "time dynamo spent compiling frames")
    wraps_ddp: bool | None = fact(
        doc="a compiled module wraps DistributedDataParallel or FullyShardedDataParallel")
    wrapped_modules: list[str] = Field(
        default_factory=list, description="class names of the modules torch.compile wrapped")


class OptimizerFacts(FactGroup):
    """The main optimizer: its implementation, the host time of its step, and zero_grad."""

    name: str | None = fact(doc="class of the main optimizer")
    foreach: bool | None = fact(
        doc="foreach as configured (None: torch's default, multi-tensor on CUDA)")
    fused: bool | None = fact(doc="fused as configured")
    param_tensors: int | None = fact(doc="parameter tensors the optimizer updates")
    step_host_time: float | None = fact("s", "median host time of optimizer.step() (steady)")
    step_host_percent: float | None = fact("%", "step_host_time / run.step_time")
    zero_grad_calls: int = fact(doc="Optimizer.zero_grad / Module.zero_grad calls", default=0)
    zero_grad_to_zeros: int = fact(
        doc="of those, calls with set_to_none=False (gradients filled with zeros)", default=0)
    lr: float | None = fact(
        doc="the main optimizer's learning rate at its first step (the largest of its groups)")
    lr_last: float | None = fact(doc="the same when the test ended (a scheduler changes it)")
    clip_calls: int = fact(
        doc="gradient clipping calls: torch.nn.utils.clip_grad_norm_ / clip_grad_value_ (as "
            "Lightning's gradient_clip_val and the Hugging Face Trainer's max_grad_norm make)",
        default=0)
    clip_kinds: list[str] = Field(default_factory=list,
                                  description="how they clipped: norm, value")
    clip_limit: float | None = fact(doc="the last max_norm or clip_value given")


class DdpFacts(FactGroup):
    """DistributedDataParallel modules trained in the test (top-level forwards of a DDP
    module, and DDP's own logging data)."""

    used: bool | None = fact(doc="a DistributedDataParallel module ran a forward")
    world_size: int | None = fact(doc="processes in the DDP module's process group")
    forwards_per_step: float | None = fact(
        doc="median grad-mode DDP forwards per optimizer step (steady)")
    synced_forwards_per_step: float | None = fact(
        doc="median of those whose backward all-reduces (require_backward_grad_sync: not "
            "inside no_sync())")
    find_unused_parameters: bool | None = fact(doc="DDP(find_unused_parameters=True)")
    unused_parameter_size: int | None = fact(
        "bytes", "parameters DDP found unused in the last sampled iteration")
    logged_iteration: int | None = fact(doc="DDP iteration of the logging data read")
    comm_time: float | None = fact("s", "DDP's average backward communication time")
    comm_overlap_time: float | None = fact(
        "s", "DDP's average backward computation overlapped with communication")
