"""What the ``history`` command says when the store cannot answer: shared by its listing
(``history``) and its changes and site (``history_changes``), which import it and not each
other."""

from __future__ import annotations

from pytest_gputrain.regression.store import Store


class HistoryError(Exception):
    """The arguments or the store cannot give what ``history`` was asked for; says why."""


def unknown_test(store: Store, nodeid: str, name: str | None) -> str:
    """Why a test has no history: no such test, or none under ``name``; with the tests the
    store holds."""
    known = store.nodeids()
    hint = f"; tests in the store: {', '.join(known[:8])}" if known else ""
    under = f" under the name {name!r}" if name is not None else ""
    return f"no saved result for {nodeid!r}{under} in {store.where}{hint}"
