"""``WarningWatch``: the Python warnings torch and the training frameworks raise while a test
trains, with where they came from and the test's line that led there.

torch warns about many faults it can see but will not stop for: ``torch.utils.checkpoint``
whose inputs do not require grad ("Gradients will be None"), a loss whose target broadcasts
against its input, ``lr_scheduler.step()`` before ``optimizer.step()``, DDP's gradient strides,
more DataLoader workers than CPUs. The test passes, and the warnings summary at the end of a
long pytest run is easy to miss; the diagnosis turns them into findings (GT150).

How: ``warnings._showwarnmsg`` is wrapped for the test's call. The interpreter calls it for every
warning that the filters let through (pytest's own catcher records them there too), so the
wrapper sees what the user would see in the summary, and changes nothing: it records, then calls
the original. Not seen: warnings the filters ignore, those ``-W error`` turns into exceptions
(the test fails on them), and warnings raised inside the test's own ``pytest.warns`` or
``warnings.catch_warnings(record=True)`` (the test expects them). Under Python's default action a
warning is shown once per place it is raised from, so a count is of places, not of calls.

A warning is kept when the code that raised it is torch's or a framework's (its first Python
frame), or, for a ``UserWarning``, the test's own line when that line does not call
``warnings.warn`` itself (a warning torch's C++ code raises shows its caller's frame), and its
category is not a deprecation
(``DeprecationWarning``, ``PendingDeprecationWarning``, ``FutureWarning``: they cost nothing
now). ``BENIGN`` lists the torch and framework warnings that name no fault (documented in
docs/run-diagnosis.md); they are counted apart.
"""

from __future__ import annotations

import os
import re
import sys
import warnings
from typing import TYPE_CHECKING, Any, Final

from pytest_gputrain.probe.frameworks import PACKAGES
from pytest_gputrain.probe.host_stacks import SiteFinder, call_line
from pytest_gputrain.probe.run_record import RaisedWarning, RunRecord
from pytest_gputrain.probe.wrapping import probe_wrapper

if TYPE_CHECKING:
    from types import FrameType

    from pytest_gputrain.probe.torch_hooks import Patches

MAX_WARNINGS: Final = 32  # distinct warnings kept per test
MESSAGE_CHARS: Final = 240
DEPRECATIONS: Final = frozenset({"DeprecationWarning", "PendingDeprecationWarning",
                                 "FutureWarning"})
# Where a warning must come from to be judged: torch, or a framework that drives training.
ORIGINS: Final = frozenset({"torch", *PACKAGES})
# torch and framework warnings that name no fault of the training (why, in the docs): a
# pattern searched in the message, or a category name.
BENIGN: Final = (
    # nn.TransformerEncoder's note that it takes its slower path for a norm-first layer
    re.compile(r"enable_nested_tensor is True, but self\.use_nested_tensor is False"),
    re.compile(r"nested tensors is in prototype stage"),
    re.compile(r"TypedStorage is deprecated"),  # a deprecation, raised as a UserWarning
    re.compile(r"Attempting to run cuBLAS, but there was no current CUDA context"),
    re.compile(r"The epoch parameter in `scheduler\.step\(\)` was not necessary"),
    # torch.profiler's own housekeeping (the test's or the probe's window)
    re.compile(r"Profiler clears events at the end of each cycle"),
    re.compile(r"^Checkpoint directory .* exists and is not empty"),
    # float(loss) on a tensor that requires grad (torch >= 2.10): the value is right
    re.compile(r"Converting a tensor with requires_grad=True to a scalar"),
)
BENIGN_CATEGORIES: Final = frozenset({
    # Lightning's "possible" warnings: suggestions about its settings (the logging interval,
    # loader workers: GT102 and GT113 judge those by their measured cost)
    "PossibleUserWarning",
})


class WarningWatch:
    """Records the warnings shown while the test's call runs."""

    def __init__(self, record: RunRecord, finder: SiteFinder | None = None) -> None:
        self.record = record
        self._finder = finder
        self._seen: dict[tuple[str, str, str, int], RaisedWarning] = {}
        self._impl: Any = None  # the catcher's sink when the test began (pytest's)

    def start(self, patches: Patches) -> None:
        show = vars(warnings).get("_showwarnmsg")
        if not callable(show) or getattr(show, "_gputrain_probe", False):
            return
        self._impl = vars(warnings).get("_showwarnmsg_impl")
        patches.set(warnings, "_showwarnmsg", self._wrap(show))

    def _wrap(self, original: Any) -> Any:
        def _showwarnmsg(msg: Any) -> Any:
            try:
                self._note(msg, sys._getframe(1))
            except Exception as exc:  # never let the probe change what the user sees
                self.record.errors.append(f"reading a warning: {type(exc).__name__}: {exc}")
            return original(msg)

        return probe_wrapper(_showwarnmsg, original)

    def _note(self, msg: Any, frame: FrameType | None) -> None:
        if vars(warnings).get("_showwarnmsg_impl") is not self._impl:
            return  # the test's own pytest.warns / catch_warnings(record=True) expects it
        category = getattr(msg, "category", None)
        name = getattr(category, "__name__", "Warning")
        if name in DEPRECATIONS or (isinstance(category, type) and issubclass(
                category, DeprecationWarning | PendingDeprecationWarning | FutureWarning)):
            return
        origin, caller = self._origin(frame, name)
        if origin is None:
            return
        text = str(getattr(msg, "message", "")).strip()
        first_line = text.splitlines()[0] if text else ""
        filename = str(getattr(msg, "filename", ""))
        lineno = int(getattr(msg, "lineno", 0) or 0)
        key = (name, first_line, filename, lineno)
        seen = self._seen.get(key)
        if seen is not None:
            seen.count += 1
            return
        readings = self.record.warnings
        if len(readings.raised) >= MAX_WARNINGS:
            readings.dropped += 1
            return
        benign = name in BENIGN_CATEGORIES or any(p.search(text) for p in BENIGN)
        entry = RaisedWarning(
            category=name, message=_cut(first_line), origin=origin,
            where=f"{_short(filename)}:{lineno}", caller=caller, benign=benign,
            step=len(self.record.steps.times), training=bool(
                self.record.forwards.calls or self.record.steps.times))
        self._seen[key] = entry
        readings.raised.append(entry)

    def _origin(self, frame: FrameType | None, category_name: str
                ) -> tuple[str | None, str | None]:
        """The package whose code raised the warning (torch or a framework; a UserWarning whose
        first frame is the test's own line that called into torch is torch's C++ code's), and
        the test's or the framework's line that led there, as `source` at file:line."""
        while frame is not None and _passed_over(frame.f_globals.get("__name__")):
            frame = frame.f_back
        if frame is None:
            return None, None
        module = frame.f_globals.get("__name__")
        top = module.partition(".")[0] if isinstance(module, str) else ""
        finder = self._finder or SiteFinder()
        self._finder = finder
        found = finder.site(frame)
        caller = call_line(found[0]) if found is not None else None
        if top in ORIGINS:
            return top, caller
        if found is not None and found[0] is frame and category_name == "UserWarning" and (
                not _warns_itself(frame)):
            return "torch", caller  # torch's C++ code warned: the frame is the caller's
        return None, None


def _passed_over(module: object) -> bool:
    """The warnings machinery, and the probe's own wrappers (a sync it counts may warn)."""
    return isinstance(module, str) and (module in ("warnings", "_py_warnings")
                                        or module.startswith("pytest_gputrain."))


def _warns_itself(frame: FrameType) -> bool:
    """The line calls warnings.warn itself: the test's own warning, not judged."""
    import linecache

    return "warn(" in linecache.getline(frame.f_code.co_filename, frame.f_lineno)


def _short(filename: str) -> str:
    """A warning's file from its package folder on (torch/utils/checkpoint.py)."""
    parts = filename.replace("\\", "/").split("/")
    for index, part in enumerate(parts):
        if part in ORIGINS:
            return "/".join(parts[index:])
    return os.path.basename(filename)


def _cut(text: str) -> str:
    return text if len(text) <= MESSAGE_CHARS else text[:MESSAGE_CHARS - 3] + "..."
