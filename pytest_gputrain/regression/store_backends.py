"""Which backend serves a store location: a ``postgresql://`` URL or a SQLite file.

Kept apart from ``store`` (the interface both backends implement), so that the backends import
the interface and nothing imports back.
"""

from __future__ import annotations

from pathlib import Path

from pytest_gputrain.regression.store import Store
from pytest_gputrain.regression.store_location import Location, is_url


def inspect(location: Location) -> str:
    """"missing", "empty" (safe to initialise), "ours" or "older" (ours, of a schema that
    opening it upgrades); ``StoreError`` for anything else. Reads only."""
    if is_url(location):
        from pytest_gputrain.regression import store_postgres

        return store_postgres.inspect(str(location))
    from pytest_gputrain.regression import store_sqlite

    return store_sqlite.inspect(Path(location))


def check_creatable(location: Location) -> None:
    """``StoreError`` when a missing SQLite store could not be created where it is to be (its
    folder is a file, or cannot be written). A PostgreSQL server answers when it is opened."""
    if not is_url(location):
        from pytest_gputrain.regression import store_sqlite

        store_sqlite.check_creatable(Path(location))


def open_store(location: Location, *, create: bool = True) -> Store:
    """Open a store to write to it, creating and initialising it when missing or empty (and
    ``create``)."""
    if is_url(location):
        from pytest_gputrain.regression import store_postgres

        return store_postgres.PostgresStore.open(str(location), create=create)
    from pytest_gputrain.regression import store_sqlite

    return store_sqlite.SqliteStore.open(Path(location), create=create)


def open_for_reading(location: Location) -> Store:
    """Open an existing store to read it (``history``, ``compare``, a ``--gpu-compare`` that
    saves nothing): nothing is created, initialised or changed, a store on a read-only mount
    is read, one another process holds locked is waited for; ``StoreError`` for a missing or
    empty store."""
    if is_url(location):
        from pytest_gputrain.regression import store_postgres

        return store_postgres.PostgresStore.open_for_reading(str(location))
    from pytest_gputrain.regression import store_sqlite

    return store_sqlite.SqliteStore.open_for_reading(Path(location))
