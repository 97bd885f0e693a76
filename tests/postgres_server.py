"""A real PostgreSQL server for the store tests: the ``pgserver`` wheel (PostgreSQL 16 binaries
inside; a test dependency), started once per test process, one fresh database per test.

As root (as CI runs), pgserver runs the server as a system user ``pgserver`` it creates, and
opens the data folder's parent folders to it. The data folder therefore lives in its own
``/tmp/gputrain-pg-*`` folder, not under pytest's ``/tmp/pytest-of-<user>``, which pytest closes
again (mode 0700) whenever another pytest process starts.
"""

from __future__ import annotations

import shutil
import tempfile
import uuid
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

# Imported here, when conftest loads, not inside a test: pytester drops the modules first
# imported during a test that uses it, and psycopg's and psutil's compiled parts cannot be
# imported twice. Missing (the test extra not installed), the PostgreSQL tests fail, with the
# reason; they never skip, and the other tests still run.
try:
    import psycopg

    with warnings.catch_warnings():
        # platformdirs warns when XDG_RUNTIME_DIR is unset (CI, root) and falls back to /tmp.
        warnings.simplefilter("ignore")
        import pgserver
except ImportError as exc:
    MISSING: str | None = f"{exc}; install the test extra: pip install -e '.[test]'"
else:
    MISSING = None


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[Any]:
    if MISSING is not None:
        pytest.fail(f"the PostgreSQL store tests need pgserver and psycopg: {MISSING}")
    folder = Path(tempfile.mkdtemp(prefix="gputrain-pg-"))
    server = pgserver.get_server(folder / "data", cleanup_mode="delete")
    try:
        yield server
    finally:
        server.cleanup()
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def postgres_url(postgres_server: Any) -> Iterator[str]:
    """The URL of an empty database of its own on the test server."""
    name = f"gputrain_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(postgres_server.get_uri(), autocommit=True) as connection:
        connection.execute(f"CREATE DATABASE {name}")
    yield str(postgres_server.get_uri(name))
    with psycopg.connect(postgres_server.get_uri(), autocommit=True) as connection:
        connection.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
