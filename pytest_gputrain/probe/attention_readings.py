"""``AttentionWatch``: the calls of ``torch.nn.functional.scaled_dot_product_attention`` and
whether the ``attn_mask`` they were given is just the causal mask.

A boolean (or 0/-inf) lower-triangular mask passed as ``attn_mask`` computes the same result as
``is_causal=True``, but PyTorch's flash-attention kernel takes no arbitrary mask: the call runs on
a kernel that reads the mask and computes the blocks above the diagonal only to throw them away,
where ``is_causal=True`` skips them. The wrapper counts the calls (with a mask, with
``is_causal``) with a few attribute reads; for the first ``MAX_CHECKS`` masked calls it compares
the mask with the causal pattern on the mask's device, into a small tensor read once when the
test ends (no sync while the test trains), and notes the line that made the first masked call.
Nothing is done while torch.compile traces or a CUDA graph is captured.

Built into ``run.attention.*`` by ``attention_facts_builder.py``.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any, Final

from pytest_gputrain.probe.host_stacks import call_line
from pytest_gputrain.probe.run_record import AttentionReadings
from pytest_gputrain.probe.torch_hooks import is_tracing
from pytest_gputrain.probe.wrapping import probe_wrapper

if TYPE_CHECKING:
    from pytest_gputrain.probe.callbacks import ProbeCallbacks
    from pytest_gputrain.probe.torch_hooks import Patches

MAX_CHECKS: Final = 4  # masked calls whose mask is compared with the causal pattern
_MASK, _IS_CAUSAL = 3, 5  # positions of attn_mask and is_causal in the call


class AttentionWatch:
    """Counts the attention calls and checks the first masks against the causal pattern."""

    def __init__(self, torch: Any, probe: ProbeCallbacks) -> None:
        self.torch = torch
        self.probe = probe
        self.readings: AttentionReadings = probe.record.attention
        self._tracing = is_tracing(torch)
        capturing = getattr(getattr(torch, "cuda", None), "is_current_stream_capturing", None)
        self._capturing = capturing if callable(capturing) else (lambda: False)
        self._slots: Any = None  # int8 tensor: 1 where a checked mask was the causal one

    def start(self, patches: Patches) -> None:
        functional = getattr(getattr(self.torch, "nn", None), "functional", None)
        original = getattr(functional, "scaled_dot_product_attention", None)
        if callable(original) and not getattr(original, "_gputrain_probe", False):
            patches.set(functional, "scaled_dot_product_attention", self._wrap(original))

    def _wrap(self, original: Any) -> Any:
        def scaled_dot_product_attention(*args: Any, **kwargs: Any) -> Any:
            if not self.probe.disabled and not self._tracing():
                try:
                    self._note(args, kwargs)
                except Exception as exc:
                    self.probe.fail("scaled_dot_product_attention wrapper", exc)
            return original(*args, **kwargs)

        return probe_wrapper(scaled_dot_product_attention, original)

    def _note(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        readings = self.readings
        readings.calls += 1
        if args[_IS_CAUSAL] if len(args) > _IS_CAUSAL else kwargs.get("is_causal", False):
            readings.is_causal_calls += 1
        mask = args[_MASK] if len(args) > _MASK else kwargs.get("attn_mask")
        if mask is None:
            return
        readings.masked_calls += 1
        query = args[0] if args else kwargs["query"]
        key = args[1] if len(args) > 1 else kwargs["key"]
        length, keys = int(query.shape[-2]), int(key.shape[-2])
        readings.max_query_len = max(readings.max_query_len, length)
        if readings.site is None:
            readings.site = call_line(sys._getframe(2))
            readings.mask_dtype = str(mask.dtype).removeprefix("torch.")
        if len(readings.checks) < MAX_CHECKS and length > 1 and not (
                mask.is_cuda and self._capturing()):  # queue nothing into a CUDA graph
            self._check(mask, length, keys)

    def _check(self, mask: Any, length: int, keys: int) -> None:
        """Queue the comparison of ``mask`` with the causal pattern on its device."""
        torch = self.torch
        if self._slots is None:
            self._slots = torch.zeros(MAX_CHECKS, dtype=torch.int8, device=mask.device)
        elif self._slots.device != mask.device:
            return
        with torch.no_grad():
            allowed = mask if mask.dtype == torch.bool else mask == 0
            causal = torch.ones(length, keys, dtype=torch.bool, device=mask.device).tril()
            slot = len(self.readings.checks)
            self._slots[slot] = (allowed == causal).all()
        self.readings.checks.append((length, keys))

    def stop(self, cuda_ok: bool) -> None:
        """Read the checks back in one copy."""
        readings, slots, self._slots = self.readings, self._slots, None
        if slots is None or not readings.checks:
            return
        if slots.device.type != "cpu" and not cuda_ok:
            readings.unread = "the CUDA context was unusable when the test ended"
            return
        try:
            readings.causal = int(slots[:len(readings.checks)].sum().item())
        except Exception as exc:
            readings.unread = f"reading the mask checks: {type(exc).__name__}: {exc}"
