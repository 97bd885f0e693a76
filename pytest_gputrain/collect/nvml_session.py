"""Every NVML call goes through here: the safe-call wrapper and the process-wide session.

NVML is initialised lazily, once per process, and every call is wrapped so that an error never
reaches pytest: NotSupported, NoPermission, a missing library or a GPU that fell off the bus all
become a ``Reading`` with no value and a reason. Module ``pynvml`` comes from nvidia-ml-py.

What is read lives next door: ``nvml`` (one GPU and the system, the door the rest of the
package uses), ``nvml_processes`` (who holds memory on a GPU), ``gpu_index`` (torch's cuda:N
to NVML's index).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Reading:
    """The outcome of one NVML call: a value, or why there is none."""

    value: Any = None
    error: str | None = None
    lost: bool = False

    @property
    def ok(self) -> bool:
        return self.error is None

    def map(self, convert: Callable[[Any], Any]) -> Reading:
        """This reading with its value converted; an unexpected value becomes a reason too."""
        if not self.ok:
            return self
        try:
            return Reading(value=convert(self.value))
        except Exception as exc:
            return Reading(error=f"unexpected value {self.value!r}: {exc}")


class Nvml:
    """A lazily initialised NVML session (one per process, see ``shared()``)."""

    def __init__(self, module: Any = None) -> None:
        """``module``: an initialised stand-in for ``pynvml`` (tests hand in a fake)."""
        self._lock = threading.Lock()
        self._initialised = module is not None
        self._module: Any = module
        self.reason: str | None = None

    @property
    def available(self) -> bool:
        self._ensure()
        return self._module is not None

    def _ensure(self) -> None:
        if self._initialised:
            return
        with self._lock:
            if self._initialised:
                return
            try:
                import pynvml
            except ImportError as exc:
                self.reason = f"the NVML bindings (nvidia-ml-py, module pynvml) are missing: {exc}"
            else:
                try:
                    pynvml.nvmlInit()
                except Exception as exc:  # NVMLError_LibraryNotFound, DriverNotLoaded, ...
                    self.reason = _describe_init_error(exc)
                else:
                    self._module = pynvml
            self._initialised = True

    def call(self, name: str, *args: Any) -> Reading:
        """Call ``pynvml.<name>(*args)``; never raises."""
        self._ensure()
        if self._module is None:
            return Reading(error=self.reason or "NVML not available")
        function: Callable[..., Any] | None = getattr(self._module, name, None)
        if function is None:
            return Reading(error=f"{name} is not in this nvidia-ml-py version")
        try:
            return Reading(value=function(*args))
        except Exception as exc:
            text = _error_text(exc)
            return Reading(error=text, lost="lost" in text.lower())

    def first(self, names: tuple[str, ...], *args: Any) -> Reading:
        """Try each name in turn (NVML renamed some calls); return the first that answers."""
        reading = Reading(error="no call tried")
        for name in names:
            reading = self.call(name, *args)
            if reading.ok or "not in this nvidia-ml-py" not in (reading.error or ""):
                return reading
        return reading

    def device_call(self, index: int, name: str, *args: Any) -> Reading:
        """``name(handle of GPU index, *args)``; a missing handle gives its reason."""
        handle = self.call("nvmlDeviceGetHandleByIndex", index)
        return self.call(name, handle.value, *args) if handle.ok else handle


def as_text(value: Any) -> str:
    """An NVML string: older nvidia-ml-py versions answer bytes."""
    return value.decode() if isinstance(value, bytes) else str(value)


def _error_text(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    return text.replace("NVML_ERROR_", "").strip()


def _describe_init_error(exc: BaseException) -> str:
    text = _error_text(exc)
    lowered = text.lower()
    if "library not found" in lowered or "libnvidia-ml" in lowered:
        return f"the NVIDIA driver is not installed (libnvidia-ml.so not found): {text}"
    if "driver not loaded" in lowered:
        return f"the NVIDIA kernel driver is not loaded: {text}"
    return f"NVML failed to initialise: {text}"


_shared: Nvml | None = None
_shared_lock = threading.Lock()


def shared() -> Nvml:
    """The process-wide NVML session."""
    global _shared
    with _shared_lock:
        if _shared is None:
            _shared = Nvml()
        return _shared
