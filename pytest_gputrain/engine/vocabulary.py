"""The fact names each rule scope may use, so a typo in a rule file is caught at load time."""

from __future__ import annotations

from functools import cache

from pytest_gputrain import scopes
from pytest_gputrain.facts import EnvironmentFacts


def scope_names(scope: str) -> frozenset[str]:
    """The names a scope's namespace gives for an empty record (every fact unknown).

    Raises ``scopes.UnknownScopeError`` for a scope no one registered.
    """
    return _names(scopes.get(scope))


@cache
def _names(scope: scopes.Scope) -> frozenset[str]:
    return frozenset(scope.namespace(EnvironmentFacts(), scope.model(), {}))
