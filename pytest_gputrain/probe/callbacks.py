"""``ProbeCallbacks``: what the probe's torch hooks call on it, and nothing else.

The hooks (``torch_hooks.py``, and the DataLoader wrapper in ``loader.py``) hold the probe
through this protocol. ``RunProbe`` satisfies it (mypy checks it in ``run.py``): some callbacks
are its own methods, the others the bound methods of its readers (``ModuleWatch``,
``CompileWatch``, ``CallReadings``, ``LossWatch``), so that a hook reaches the reader with no
call in between. The readers hold the probe through it too, to report a failure (``fail``) and
to see the probe disabled.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from pytest_gputrain.probe.run_record import RunRecord


class ProbeCallbacks(Protocol):
    # The hooks count syncs and zero_grad calls into it, and note the compile callback.
    record: RunRecord
    # Set by fail(): the hooks stay installed to the end of the test and do nothing more.
    disabled: bool

    @property
    def errors(self) -> list[str]:
        """Problems of the probe (``run.probe_errors``) that did not disable it."""
        ...

    def fail(self, where: str, exc: BaseException) -> None:
        """A hook raised: disable the probe for the rest of the test and say why."""
        ...

    def on_optimizer_pre_step(self, optimizer: Any, args: Any, kwargs: Any) -> None: ...

    def on_optimizer_step(self, optimizer: Any, args: Any, kwargs: Any) -> None: ...

    def on_global_forward(self, module: Any, args: Any) -> None: ...

    def on_backward_start(self) -> None: ...

    def on_backward_end(self) -> None: ...

    def on_loss(self, tensors: Any) -> None: ...

    def on_batch(self, iterator: Any, batch: Any, wait: float) -> None: ...

    def on_save(self, seconds: float, writer: str) -> None: ...

    def on_scale(self, scaler: Any) -> None: ...

    def on_unscale(self, scaler: Any) -> None: ...

    def on_clip(self, kind: str, limit: Any) -> None: ...

    def on_reset_peak(self, device: Any) -> None: ...

    def on_gradcheck(self) -> None: ...

    def on_empty_cache_start(self) -> dict[str, int] | None: ...

    def on_empty_cache_end(self, before: dict[str, int] | None) -> None: ...

    def on_dynamo_reset(self) -> None: ...

    def on_compile_start(self, *args: Any) -> None: ...
