"""No password of a PostgreSQL store is shown or written (``store_location.describe``, the one
redaction): not on the terminal, not in the "cannot connect" errors of ``history``, ``compare``
and ``pytest --gpu-store``, not in the history site. The redaction reads a URL as libpq does
(a raw ``#``, ``?`` or ``@`` is part of a password to libpq), and shows nothing of a URL libpq
cannot read. A property test draws user names and passwords from all printable characters,
makes each a role of a real PostgreSQL server that checks passwords (SCRAM), and checks every
URL form libpq accepts: it connects, and its redaction shows no password."""

from __future__ import annotations

import random
import urllib.parse
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from pytest_gputrain.cli import main as cli_main
from pytest_gputrain.regression import fingerprint
from pytest_gputrain.regression.store import ResultRecord
from pytest_gputrain.regression.store_backends import open_store
from pytest_gputrain.regression.store_location import describe

pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestAssertRewriteWarning")

SECRET = "Sekr1t#PW-88"
HIDDEN = "***"
NODE = "tests/test_step.py::test_train"
PRINT = {"device_type": "cuda", "gpu_name": "NVIDIA H200"}


def quoted(text: str) -> str:
    return urllib.parse.quote(text, safe="")


def socket_folder(server: Any) -> str:
    """The folder of the test server's socket (pgserver listens on nothing else)."""
    query = urllib.parse.parse_qs(urllib.parse.urlsplit(str(server.get_uri())).query)
    return query["host"][0]


# Roles that own something in the checked database, dropped after it.
OWNERS: list[str] = []


@pytest.fixture(scope="module")
def checked_database(postgres_server: Any) -> Iterator[str]:
    """A database of its own whose connections must give their role's password (SCRAM):
    pgserver trusts every local connection, so a line for this database alone goes first in
    its pg_hba.conf, and is taken out again at the end."""
    import psycopg

    name = f"gputrain_pw_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(postgres_server.get_uri(), autocommit=True) as connection:
        connection.execute(f"CREATE DATABASE {name}")
        hba = Path(str(connection.execute("SHOW hba_file").fetchone()[0]))  # type: ignore[index]
        rule = f"local {name} all scram-sha-256\n"
        original = hba.read_text()
        hba.write_text(rule + original)
        connection.execute("SELECT pg_reload_conf()")
    try:
        yield name
    finally:
        with psycopg.connect(postgres_server.get_uri(), autocommit=True) as connection:
            hba.write_text(hba.read_text().replace(rule, "", 1))
            connection.execute("SELECT pg_reload_conf()")
            connection.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        for owner in OWNERS:
            drop_role(postgres_server, owner)


def make_role(server: Any, user: str, password: str, owner_of: str | None = None) -> None:
    """A role that logs in with ``password``; with ``owner_of``, one that may create a schema
    in that database."""
    import psycopg
    from psycopg import sql

    with psycopg.connect(server.get_uri(), autocommit=True) as connection:
        connection.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(user)))
        connection.execute(sql.SQL("CREATE ROLE {} LOGIN PASSWORD {}").format(
            sql.Identifier(user), sql.Literal(password)))
        if owner_of is not None:
            connection.execute(sql.SQL("GRANT ALL ON DATABASE {} TO {}").format(
                sql.Identifier(owner_of), sql.Identifier(user)))


def drop_role(server: Any, user: str) -> None:
    import psycopg
    from psycopg import sql

    with psycopg.connect(server.get_uri(), autocommit=True) as connection:
        connection.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(user)))


def url_forms(user: str, password: str, database: str, folder: str) -> dict[str, str]:
    """One role's URL, written each way a user might: encoded, raw, in the query, with the
    password given as sslpassword too."""
    socket = f"host={quoted(folder)}"
    return {
        "encoded": f"postgresql://{quoted(user)}:{quoted(password)}@/{database}?{socket}",
        "raw": f"postgresql://{user}:{password}@/{database}?{socket}",
        "raw, postgres scheme": f"postgres://{user}:{password}@/{database}?{socket}",
        "in the query": f"postgresql:///{database}?{socket}&user={quoted(user)}"
                        f"&password={quoted(password)}",
        "sslpassword too": f"postgresql://{quoted(user)}:{quoted(password)}@/{database}?"
                           f"{socket}&sslpassword={quoted(password)}",
    }


# User names and passwords from every printable character (ASCII and beyond): no control
# character, surrogate, private-use or unassigned code point, no line separator.
PRINTABLE = st.characters(blacklist_categories=("Cc", "Cs", "Co", "Cn", "Zl", "Zp"))
ASCII_PRINTABLE = st.characters(min_codepoint=0x20, max_codepoint=0x7E)
NAMES = st.text(st.one_of(ASCII_PRINTABLE, PRINTABLE), min_size=1, max_size=12)
PASSWORDS = st.text(st.one_of(ASCII_PRINTABLE, ASCII_PRINTABLE, PRINTABLE), min_size=1,
                    max_size=20)


@settings(derandomize=True, database=None, deadline=None, max_examples=60,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(user=NAMES, password=PASSWORDS)
def test_no_url_libpq_reads_shows_its_password(
    postgres_server: Any, checked_database: str, user: str, password: str
) -> None:
    import psycopg
    from psycopg.conninfo import conninfo_to_dict

    assume(not user.lower().startswith("pg_") and user != "postgres")
    assume(len(user.encode()) < 64)  # PostgreSQL's longest name
    make_role(postgres_server, user, password)
    try:
        folder = socket_folder(postgres_server)
        placeholders = url_forms(user, "PLACEHOLDER", checked_database, folder)
        for form, url in url_forms(user, password, checked_database, folder).items():
            shown = describe(url)
            # What the rest of the URL shows anyway (a password of "h" is in "host") is no
            # leak; a password that the URL shows only through itself is.
            elsewhere = password in describe(placeholders[form]).replace("PLACEHOLDER", "")
            assert elsewhere or password not in shown, (form, url, shown)
            try:
                parameters = conninfo_to_dict(url)
            except psycopg.ProgrammingError:
                assert shown.endswith(f"://{HIDDEN}"), (form, url, shown)
                continue
            if parameters.get("user") == user and parameters.get("password") == password:
                # A URL libpq reads as meant: it connects, so the server took the password.
                with psycopg.connect(url, connect_timeout=10) as connection:
                    assert connection.execute("SELECT current_user").fetchone() == (user,)
            if shown.endswith(f"://{HIDDEN}"):
                continue
            # What is shown is itself a URL libpq reads: the same parameters, secrets hidden.
            assert conninfo_to_dict(shown) == {
                key: HIDDEN if key in ("password", "sslpassword") else value
                for key, value in parameters.items()}, (form, url, shown)
    finally:
        drop_role(postgres_server, user)


# -- the command, and every "cannot connect" -------------------------------------------


def test_the_history_site_and_terminal_show_no_password(
    postgres_server: Any, checked_database: str, tmp_path: Path,
    capsys: pytest.CaptureFixture[str]
) -> None:
    """``history --changes --html site --store 'postgresql://leak:Sekr1t#PW-88@/db?host=…'``
    printed the password and wrote it into site/index.html."""
    make_role(postgres_server, "leak", SECRET, owner_of=checked_database)
    try:
        url = (f"postgresql://leak:{SECRET}@/{checked_database}?host="
               f"{socket_folder(postgres_server)}")
        rng = random.Random(3)
        with open_store(url) as store:
            for index in range(16):
                value = 0.010 * (1.05 if index >= 10 else 1.0) * (1 + rng.gauss(0, 0.002))
                rounds = [value] * 10
                store.save_run("main", PRINT, fingerprint.fingerprint_hash(PRINT),
                               f"{index:040d}", [ResultRecord(
                                   NODE, PRINT, fingerprint.fingerprint_hash(PRINT), 10,
                                   {"step_time": rounds, "throttled": [False] * 10}, {})])
        code = cli_main(["history", "--changes", "--html", str(tmp_path / "site"),
                         "--store", url])
        out, err = capsys.readouterr()
        assert code == 0, err
        assert "leak:***@" in out
        written = "".join(p.read_text(encoding="utf-8")
                          for p in (tmp_path / "site").rglob("*.html"))
        assert "leak:***@" in written
        for text in (out, err, written):
            assert "Sekr1t" not in text and "PW-88" not in text
    finally:
        OWNERS.append("leak")  # it owns the store's schema: dropped with the database


# URLs to no server, each hiding a password a regex over the URL would show (issue 29).
UNREACHABLE = [
    f"postgresql://leak:{SECRET}@/db?host=/nonexistent-socket-folder",
    f"postgresql://leak:{SECRET}@127.0.0.1:1/db?connect_timeout=3",
    f"postgresql://leak:{SECRET}?x@127.0.0.1:1/db?connect_timeout=3",
    f"postgresql://leak:{SECRET}@x@127.0.0.1:1/db?connect_timeout=3",
    f"postgresql://leak:{SECRET}/x@127.0.0.1:1/db?connect_timeout=3",
    f"postgresql://127.0.0.1:1/db?connect_timeout=3&password={SECRET}",
    f"postgresql://leak@127.0.0.1:1/db?connect_timeout=3&sslpassword={SECRET}",
    f"postgresql://leak:{SECRET}%zz@127.0.0.1:1/db",
    f"postgresql://leak:{SECRET}@[::1/db",
]


@pytest.mark.parametrize("url", UNREACHABLE)
@pytest.mark.parametrize("command", [["history"], ["history", "--changes"],
                                     ["compare", "main", "pr"]])
def test_cannot_connect_errors_show_no_password(
    command: list[str], url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code = cli_main([*command, "--store", url])
    out, err = capsys.readouterr()
    assert code == 2
    assert "Sekr1t" not in out + err and "PW-88" not in out + err, err


@pytest.mark.parametrize("url", UNREACHABLE)
def test_pytest_gpu_store_errors_show_no_password(pytester: pytest.Pytester, url: str) -> None:
    pytester.makepyfile("def test_ok(): pass")
    result = pytester.runpytest("-p", "no:cacheprovider", f"--gpu-store={url}",
                                "--gpu-save=main")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    text = result.stdout.str() + result.stderr.str()
    assert "--gpu-store: " in text or "gpu_store: " in text  # the setting is named
    assert "Sekr1t" not in text and "PW-88" not in text, text
