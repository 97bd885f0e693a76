"""The rule scopes: what a rule of each scope judges, registered by whoever owns its facts.

A scope is one kind of record rules run on: the session's environment (``session``), one GPU
(``device``), one test's training run (``run``), ... Each is registered once, with

- its pydantic model (one record; constructible with no arguments: every fact unknown),
- how it builds the names a condition sees (its namespace) from a record and the environment,
- how its findings name the record (their subject),
- where its records come from: derived from the environment, or recorded by a feature and kept
  in the facts file under their own key (``runs``, ``failures``, ...).

The core registers ``session`` and ``device`` (facts.py); every other scope is registered by
the feature that records it, in a module the feature *declares* when it loads. Declared modules
are imported on the first look-up, so declaring costs nothing at pytest start-up. The engine
and the facts file know scopes through this registry only.

This module imports nothing of the package, so any layer may use it.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

# The session's ``facts.EnvironmentFacts``. Named, not imported: facts.py registers the scopes
# that read it, so the registry stays below the models it holds.
EnvironmentFacts = Any

# name -> (value, unit, why unknown)
Namespace = Mapping[str, tuple[Any, str | None, str | None]]
# The other records of the same recording, by scope name (a failure looks up its test's run).
Related = Mapping[str, Sequence[Any]]


class Records(Sequence[Any]):
    """The records of one scope in a recording, with look-ups by a field's value that cost
    one pass in all (an index built on first use), not one pass per look-up: a replay of
    20,000 failures each finding its run stays linear.

    ``items`` may be the records' raw JSON data with ``load`` turning one into its model: each
    is then loaded when it is looked at, so a recording need not be held as models all at once.
    """

    def __init__(self, items: Sequence[Any], load: Callable[[Any], Any] | None = None) -> None:
        self._items = items
        self._load = load
        self._indexes: dict[str, dict[Any, list[int]]] = {}

    def __len__(self) -> int:
        return len(self._items)

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        item = self._items[index]
        return item if self._load is None else self._load(item)

    def _field(self, item: Any, field: str) -> Any:
        return item.get(field) if isinstance(item, dict) else getattr(item, field)

    def where(self, field: str, value: Any) -> list[Any]:
        """The records whose ``field`` equals ``value``, in recording order."""
        index = self._indexes.get(field)
        if index is None:
            index = self._indexes[field] = {}
            for position, item in enumerate(self._items):
                index.setdefault(self._field(item, field), []).append(position)
        return [self[position] for position in index.get(value, [])]


def related_where(related: Related, scope: str, field: str, value: Any) -> list[Any]:
    """The records of ``scope`` in ``related`` whose ``field`` is ``value`` (a failure's run)."""
    records = related.get(scope, ())
    if isinstance(records, Records):
        return records.where(field, value)
    return [item for item in records if getattr(item, field) == value]


class UnknownScopeError(LookupError):
    """A rule, a facts file or a feature named a scope that no one registered."""


@dataclass(frozen=True)
class Scope:
    name: str
    model: type[Any]
    namespace: Callable[[EnvironmentFacts, Any, Related], Namespace]
    subject: Callable[[Any], str]
    # Exactly one of these: the facts-file key of recorded records, or how to derive the
    # records from the environment.
    records_key: str | None = None
    from_environment: Callable[[EnvironmentFacts], Sequence[Any]] | None = None

    def __post_init__(self) -> None:
        if (self.records_key is None) == (self.from_environment is None):
            raise ValueError(f"scope {self.name!r}: give either records_key (records a feature "
                             "adds) or from_environment (records derived from the environment)")

    @property
    def recorded(self) -> bool:
        return self.records_key is not None


_scopes: dict[str, Scope] = {}
_registered_by: dict[str, str] = {}
_declared: list[str] = []
_loaded: set[str] = set()


def declare(*modules: str) -> None:
    """Modules that register scopes when imported; imported on the first look-up."""
    for module in modules:
        if module not in _declared:
            _declared.append(module)


def _origin(scope: Scope) -> str:
    return f"{scope.model.__module__}.{scope.model.__qualname__}"


def register(scope: Scope) -> None:
    """Add a scope. A name is registered once; the same module registering it again (a module
    imported anew, as pytester's in-process runs do) replaces it."""
    known = _scopes.get(scope.name)
    if known is not None and _origin(known) != _origin(scope):
        raise ValueError(f"scope {scope.name!r} is already registered (model "
                         f"{_origin(known)})")
    if scope.records_key is not None:
        for other in _scopes.values():
            if other.name != scope.name and other.records_key == scope.records_key:
                raise ValueError(f"scope {scope.name!r}: records key {scope.records_key!r} is "
                                 f"already used by scope {other.name!r}")
    _scopes[scope.name] = scope
    # The module that registered it, for the order scopes are listed in.
    _registered_by[scope.name] = sys._getframe(1).f_globals.get("__name__", "")


def _load_declared() -> None:
    for module in _declared:
        if module not in _loaded:
            _loaded.add(module)
            importlib.import_module(module)


def _order(scope: Scope) -> int:
    # The core's scopes first, then in the order their modules were declared, whatever order
    # they happened to be imported in: reports and facts files list scopes the same way always.
    module = _registered_by.get(scope.name, "")
    return _declared.index(module) if module in _declared else -1


def registered() -> list[Scope]:
    """Every scope, in a stable order (the core's, then the features' as declared)."""
    _load_declared()
    return sorted(_scopes.values(), key=_order)


def names() -> list[str]:
    return [scope.name for scope in registered()]


def recorded() -> list[Scope]:
    """The scopes whose records features add (and the facts file keeps)."""
    return [scope for scope in registered() if scope.recorded]


def get(name: str) -> Scope:
    _load_declared()
    scope = _scopes.get(name)
    if scope is None:
        raise UnknownScopeError(f"unknown scope {name!r}; registered scopes: "
                                f"{', '.join(names()) or 'none'}")
    return scope
