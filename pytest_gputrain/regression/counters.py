"""The gate's per-step counters: what each one is, its value in a session, how two sides compare
on it, and the cause of a change in words.

A benchmark's counting pass (``collect.step_counters``, run by ``benchmark.measure`` after the
timed rounds) stores its counts with the result (``ResultRecord.counters``). Two kinds:

- **exact** counters (``EXACT``): kernels, syncs, host<->device copies and bytes, allocator
  calls, ATen operators and Python bytecodes per step. The same code counts the same in every
  session, whatever the host is doing, so no statistics are needed: a count that rose is a
  regression on its own evidence (``decide_exact``), and the verdict names what rose ("+1 sync
  per step (Tensor.item() at train.py:42 ...)", "+64 kernels per step (aten::index ×64)",
  "+25.7 k Python bytecodes per step (in log_step (train.py:88) ×25679)").
- **host** counters (``STATISTICAL``): the host's CPU time and instructions per step. They move
  with the host (clock frequency, caches), less than the wall clock does, and are compared over
  sessions as the step time is (``stats.compare_sessions``), each session summarised by its
  fastest round.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pytest_gputrain.regression.options import COUNTER_METRICS, EXACT_COUNTERS, HOST_COUNTERS
from pytest_gputrain.regression.store import ResultRecord
from pytest_gputrain.units import format_bytes, format_duration

EXACT = EXACT_COUNTERS
STATISTICAL = HOST_COUNTERS
COUNTERS = COUNTER_METRICS
# (one, several) of what an exact counter counts, per step.
WORDS: dict[str, tuple[str, str]] = {
    "kernels": ("kernel", "kernels"), "syncs": ("sync", "syncs"),
    "h2d_copies": ("host-to-device copy", "host-to-device copies"),
    "h2d_bytes": ("byte copied host to device", "bytes copied host to device"),
    "d2h_copies": ("device-to-host copy", "device-to-host copies"),
    "d2h_bytes": ("byte copied device to host", "bytes copied device to host"),
    "allocs": ("allocation", "allocations"), "cuda_mallocs": ("cudaMalloc", "cudaMallocs"),
    "ops": ("ATen operator", "ATen operators"),
    "bytecodes": ("Python bytecode", "Python bytecodes"),
    "host_cpu": ("host CPU time", "host CPU time"), "instructions": ("instruction",
                                                                     "instructions"),
}
LABELS = {"kernels": "kernels", "syncs": "syncs", "h2d_copies": "H2D copies",
          "h2d_bytes": "H2D bytes", "d2h_copies": "D2H copies", "d2h_bytes": "D2H bytes",
          "allocs": "allocations", "cuda_mallocs": "cudaMalloc", "ops": "ATen ops",
          "bytecodes": "Python bytecodes",
          "host_cpu": "host CPU time", "instructions": "instructions"}
# The operators behind the usual synchronisations, as the user wrote them.
SYNC_CALLS = {"aten::_local_scalar_dense": "Tensor.item()", "aten::nonzero": "nonzero()",
              "aten::is_nonzero": "bool(tensor)", "aten::_to_copy": "Tensor.to()",
              "aten::copy_": "Tensor.copy_()", "aten::masked_select": "masked_select()",
              "aten::unique": "unique()", "": "Stream.synchronize()"}
COPY_CALLS = {"aten::_to_copy": "Tensor.to()", "aten::copy_": "Tensor.copy_()"}
DIFF_ROWS = 15  # histogram rows shown in an explanation
CAUSE_ITEMS = 3  # the largest differences named in a verdict


def counters_of(record: ResultRecord) -> Mapping[str, Any]:
    return record.counters or {}


def exact_value(record: ResultRecord, name: str) -> float | None:
    value = (counters_of(record).get("per_step") or {}).get(name)
    return float(value) if isinstance(value, int | float) else None


def rounds_of(record: ResultRecord, name: str) -> list[float]:
    """A host counter's values, one per round of the counting pass."""
    values = counters_of(record).get(name)
    return [float(v) for v in values] if isinstance(values, list) else []


def measured(record: ResultRecord, name: str) -> bool:
    if name in EXACT:
        return exact_value(record, name) is not None
    return bool(rounds_of(record, name))


def varies(record: ResultRecord, name: str) -> list[float] | None:
    """The lowest and highest count of the session's counted steps where they disagreed."""
    found = (counters_of(record).get("varies") or {}).get(name)
    return [float(v) for v in found] if isinstance(found, list) and len(found) == 2 else None


def bound_of(record: ResultRecord) -> str | None:
    """"launch", "gpu" or "host" (a CPU step), as the session's counting pass judged it."""
    found = (counters_of(record).get("bound") or {}).get("kind")
    return str(found) if found else None


def amount(name: str, value: float | None, *, signed: bool = False) -> str:
    """A counter's value in its unit: ``612``, ``1.0 MiB``, ``6.412 ms``, ``12.3 M``."""
    if value is None:
        return "–"
    sign = "+" if signed and value > 0 else ""
    if name.endswith("_bytes"):
        return sign + format_bytes(value)
    if name == "host_cpu":
        return sign + format_duration(value, precise=True)
    if name in ("instructions", "bytecodes"):
        for scale, suffix in ((1e9, " G"), (1e6, " M"), (1e3, " k")):
            if abs(value) >= scale:
                return f"{sign}{value / scale:.3g}{suffix}"
    text = f"{value:.0f}" if float(value).is_integer() else f"{value:.1f}"
    return sign + text


def per_step(name: str, difference: float) -> str:
    """``+1 sync per step``, ``+1.0 MiB copied host to device per step``."""
    if name.endswith("_bytes"):
        direction = "host to device" if name.startswith("h2d") else "device to host"
        return f"{amount(name, difference, signed=True)} copied {direction} per step"
    one, several = WORDS[name]
    word = one if abs(difference) == 1 else several
    return f"{amount(name, difference, signed=True)} {word} per step"


# -- the decision on an exact counter ------------------------------------------------------------


@dataclass(frozen=True)
class ExactDecision:
    verdict: str  # "regression", "improvement", "ok", "cannot_tell", "insufficient_data"
    baseline: float | None
    current: float | None
    change: float | None  # relative; None when the baseline counted 0
    exact: bool
    reason: str
    phrase: str = ""  # the change in words, where the reason begins with it ("+1 sync per step")


def _rose(before: float, after: float, threshold: float) -> bool:
    return after > before and (before == 0 or after > before * (1 + threshold))


def decide_exact(name: str, threshold: float, baseline: Sequence[ResultRecord],
                 current: Sequence[ResultRecord]) -> ExactDecision:
    """How the current sessions' count compares with the baseline's (see the module
    docstring). Exact when every session of each side counted the same, each over steps that
    agreed; then any change past the threshold decides. Otherwise a regression needs every
    current session above every baseline one (and the mirror image for an improvement), the
    same counts on both sides are "ok", so are overlapping counts whose medians are within the
    threshold, and anything else cannot tell."""
    before = [v for v in (exact_value(r, name) for r in baseline) if v is not None]
    after = [v for v in (exact_value(r, name) for r in current) if v is not None]
    if not before or not after:
        return ExactDecision("insufficient_data", None, None, None, False,
                             f"{len(before)} baseline and {len(after)} current session(s) "
                             f"counted {LABELS[name]}")
    unsteady = [r for r in (*baseline, *current) if varies(r, name)]
    exact = not unsteady and len(set(before)) == 1 and len(set(after)) == 1

    def span(records: Sequence[ResultRecord], values: list[float]) -> tuple[float, float]:
        """The lowest and highest count of a side, its sessions' unsteady steps included."""
        ranges = [varies(r, name) for r in records]
        return (min([*values, *(v[0] for v in ranges if v)]),
                max([*values, *(v[1] for v in ranges if v)]))

    low, high = span(baseline, before)
    current_low, current_high = span(current, after)
    base, cur = statistics.median(before), statistics.median(after)
    change = cur / base - 1 if base else None
    if _rose(high, current_low, threshold):
        verdict = "regression"
    elif _rose(current_high, low, threshold):
        verdict = "improvement"
    elif exact or (not unsteady and sorted(set(before)) == sorted(set(after))):
        verdict = "ok"
    elif abs(cur - base) <= threshold * base:
        # the counts overlap and the sides' medians agree: a step whose Python or kernels
        # follow its data (a random transform, a rejection sampler) counts a little differently
        # each time, and nothing says that the code changed
        verdict = "ok"
    else:
        verdict = "cannot_tell"
    if exact:
        how = (f"exact: every session of each side counted the same ({amount(name, base)} -> "
               f"{amount(name, cur)} per step)")
    else:
        spans = ", ".join(dict.fromkeys(f"{amount(name, v[0])}-{amount(name, v[1])}" for v in
                                        (varies(r, name) for r in unsteady) if v))
        how = (f"not exact here: the count varied between "
               f"{'steps of a session (' + spans + ')' if unsteady else 'sessions'}; baseline "
               f"{amount(name, low)}-{amount(name, high)}, current "
               f"{amount(name, current_low)}-{amount(name, current_high)} per step")
    limit = "any rise" if threshold == 0 else f"the {threshold * 100:g} % threshold"
    phrase = per_step(name, cur - base) if cur != base else ""
    if verdict == "regression":
        reason = f"{phrase}, past {limit}; {how}"
    elif verdict == "improvement":
        reason = f"{phrase}; {how}"
    elif verdict == "ok" and not exact and sorted(set(before)) != sorted(set(after)):
        reason = (f"the counts overlap, and the sides' medians are "
                  f"{'the same' if cur == base else phrase + ' apart, within ' + limit}; {how}")
    elif verdict == "ok":
        reason = ("the same per step; " if cur == base else f"{phrase}, within {limit}; ") + how
    else:
        reason = f"the counts overlap; {how}"
    return ExactDecision(verdict, base, cur, change, exact, reason, phrase)


def autotuned(baseline: Sequence[ResultRecord], current: Sequence[ResultRecord]) -> bool:
    """The kernels changed while the operators did not, in sessions with cuDNN autotuning on:
    the same operators ran kernels that each process picked by timing them, not other code."""
    tuned = any((r.summary.get("conditions") or {}).get("cudnn_benchmark")
                for r in (*baseline, *current))
    before, after = representative(baseline), representative(current)
    if not tuned or before is None or after is None:
        return False
    return (dict(counters_of(before).get("ops_by_name") or {})
            == dict(counters_of(after).get("ops_by_name") or {}))


# -- the cause in words --------------------------------------------------------------------------


def representative(records: Sequence[ResultRecord]) -> ResultRecord | None:
    """The newest session of a side that was counted (the exact counts of a side agree)."""
    counted = [r for r in records if r.counters]
    return counted[-1] if counted else None


def histogram_diff(before: Mapping[str, float], after: Mapping[str, float]
                   ) -> list[tuple[str, float, float]]:
    """(key, before, after) for every key whose count changed, the largest change first."""
    keys = set(before) | set(after)
    rows = [(key, float(before.get(key, 0)), float(after.get(key, 0))) for key in keys]
    changed = [row for row in rows if row[1] != row[2]]
    return sorted(changed, key=lambda row: (-abs(row[2] - row[1]), row[0]))


def _times(value: float) -> str:
    """How many more (`` ×64``; nothing for one more) or fewer (`` (3 fewer)``) per step."""
    count = f"{abs(value):.0f}" if float(value).is_integer() else f"{abs(value):.1f}"
    if value < 0:
        return f" ({count} fewer)"
    return "" if value == 1 else f" ×{count}"


def site_key(site: Mapping[str, Any]) -> str:
    """One call site of a sync or a copy, in words: ``Tensor.item() at train.py:42
    `loss.item()```, ``pageable Tensor.to() at train.py:40 `batch.to(device)` (1.0 MiB)``."""
    operator = str(site.get("op") or "")
    where = str(site.get("site") or "unknown")
    code = str(site.get("code") or "")
    at = f" at {where}" + (f" `{code}`" if code else "")
    if "direction" in site:
        call = COPY_CALLS.get(operator, operator)
        return (f"{site.get('memory') or ''} {call}{at} "
                f"({format_bytes(site.get('bytes') or 0)})").strip()
    return f"{SYNC_CALLS.get(operator, operator)}{at}"


def sites(record: ResultRecord, group: str, direction: str | None = None) -> dict[str, float]:
    """A session's sync or copy call sites in words (``site_key``), with their counts per
    step; ``direction`` keeps one way of copies."""
    found: dict[str, float] = {}
    for site in counters_of(record).get(group) or []:
        if not isinstance(site, dict):
            continue
        if direction is not None and site.get("direction") != direction:
            continue
        key = site_key(site)
        found[key] = found.get(key, 0.0) + float(site.get("count") or 0)
    return found


def _listed(rows: list[tuple[str, float, float]], limit: int = CAUSE_ITEMS) -> str:
    shown = [f"{key}{_times(after - before)}" for key, before, after in rows[:limit]]
    more = len(rows) - limit
    return ", ".join(shown) + (f" and {more} more" if more > 0 else "")


def cause(name: str, baseline: Sequence[ResultRecord], current: Sequence[ResultRecord]) -> str:
    """What is behind a change of counter ``name``, in words ("" when nothing says more than
    the count itself)."""
    before, after = representative(baseline), representative(current)
    if before is None or after is None:
        return ""
    ops = histogram_diff(counters_of(before).get("ops_by_name") or {},
                         counters_of(after).get("ops_by_name") or {})
    if name == "syncs":
        moved = histogram_diff(sites(before, "sync_sites"), sites(after, "sync_sites"))
        if moved:
            return _listed(moved)
        kinds = histogram_diff(counters_of(before).get("syncs_by_kind") or {},
                               counters_of(after).get("syncs_by_kind") or {})
        return _listed([(f"cuda{k.capitalize()}Synchronize" if k != "memcpy" else
                         "blocking cudaMemcpy", b, a) for k, b, a in kinds])
    if name.startswith(("h2d", "d2h")):
        direction = name[:3]
        moved = histogram_diff(sites(before, "copy_sites", direction),
                               sites(after, "copy_sites", direction))
        if moved:
            return _listed(moved)
        copies = histogram_diff(
            {k: v for k, v in ((counters_of(before).get("copies") or {}).get(direction)
                               or {}).items() if k in ("pageable", "pinned")},
            {k: v for k, v in ((counters_of(after).get("copies") or {}).get(direction)
                               or {}).items() if k in ("pageable", "pinned")})
        return _listed([(f"{key} memory", b, a) for key, b, a in copies])
    if name == "kernels":
        if ops:
            return _listed(ops)
        kernels = histogram_diff(counters_of(before).get("kernel_names") or {},
                                 counters_of(after).get("kernel_names") or {})
        return _listed(kernels)
    if name in ("allocs", "cuda_mallocs", "ops"):
        return _listed(ops)
    if name == "bytecodes":
        functions = histogram_diff(counters_of(before).get("bytecodes_by_function") or {},
                                   counters_of(after).get("bytecodes_by_function") or {})
        return f"in {_listed(functions)}" if functions else ""
    if name in STATISTICAL:
        counted = [n for n in EXACT if exact_value(before, n) is not None
                   and exact_value(before, n) != exact_value(after, n)]
        if not counted:
            return ("no exact counter changed: the host does more outside torch's operators "
                    "and the step's own Python (native code: data preparation, a library's own "
                    "work, another thread's)")
        return "with " + "; ".join(change_phrase(n, baseline, current) for n in counted)
    return ""


def change_phrase(name: str, baseline: Sequence[ResultRecord],
                  current: Sequence[ResultRecord]) -> str:
    """``+1 sync per step (Tensor.item() at train.py:42 `loss.item()`)``."""
    before, after = representative(baseline), representative(current)
    if before is None or after is None:
        return ""
    difference = (exact_value(after, name) or 0.0) - (exact_value(before, name) or 0.0)
    why = cause(name, baseline, current)
    return per_step(name, difference) + (f" ({why})" if why else "")


def changed(baseline: Sequence[ResultRecord], current: Sequence[ResultRecord]) -> list[str]:
    """Every exact counter whose count differs between the sides' newest counted sessions, as
    ``change_phrase`` words."""
    before, after = representative(baseline), representative(current)
    if before is None or after is None:
        return []
    return [change_phrase(name, baseline, current) for name in EXACT
            if exact_value(before, name) is not None and exact_value(after, name) is not None
            and exact_value(before, name) != exact_value(after, name)]
