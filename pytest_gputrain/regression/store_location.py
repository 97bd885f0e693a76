"""Where the benchmark store is: one rule for ``pytest`` (``--gpu-store`` / ini ``gpu_store``)
and for ``python -m pytest_gputrain history`` and ``compare`` alike; and how a location is shown.

- a ``postgresql://`` (or ``postgres://``) URL is the store as it is, once libpq can read it;
- anything else is an SQLite file: ``~`` expanded, a relative path relative to the folder the
  value came from (``options.read_with_base``: the current directory for a command-line value,
  the ini file's folder for an ini value); a folder, or a value ending in a slash, gets
  ``benchmarks.sqlite`` inside;
- with no value, ``.gputrain/benchmarks.sqlite`` in the rootdir.

:func:`describe` is the one form a location takes wherever it is shown or written (terminal,
errors, the history site, reports): a URL as libpq reads it (psycopg's
``conninfo_to_dict``, which calls libpq's own parser), less every parameter libpq itself marks
as secret or not to be shown (``password``, ``sslpassword``, ...). A regex over the URL would
read it differently from libpq: libpq takes a raw ``#``, ``?`` or ``@`` into a password. Where
libpq cannot read the URL (or psycopg is not installed), nothing after the scheme is shown.

Light (no sqlite3; psycopg only to show or check a URL): the regression settings read it where
an option is set.
"""

from __future__ import annotations

import functools
import os
import re
import urllib.parse
from pathlib import Path
from typing import Any

from pytest_gputrain.options import resolve_path
from pytest_gputrain.regression.options import DEFAULT_NAME, DEFAULT_STORE

URL_SCHEMES = ("postgresql://", "postgres://")
URL_EXAMPLE = "postgresql://ci@db.example.com:5432/benchmarks"
HIDDEN = "***"
# What a URL that libpq cannot read says instead of itself: any part of it may be a password.
UNREADABLE_URL = ("is not a valid PostgreSQL URL: libpq cannot read it as meant (not shown: it "
                  "may hold a password). Percent-encode a reserved character in the user name "
                  "or password (@ as %40, / as %2F, : as %3A, # as %23), or give the password "
                  f"in PGPASSWORD or ~/.pgpass; e.g. {URL_EXAMPLE}")

Location = Path | str  # a SQLite file, or a PostgreSQL URL (str)

# libpq's options whose values it never shows ("*": a password; "D": a debugging option, such
# as the SCRAM keys), for a libpq that cannot be asked (its answer is used where it can be).
_SECRET_OPTIONS = frozenset({"password", "sslpassword", "oauth_client_secret",
                             "scram_client_key", "scram_server_key"})
# Parameters shown in the URL's own places (user@host:port/dbname), the rest in its query.
_PLACED = ("user", "password", "host", "port", "dbname")
_PORTS = re.compile(r"[0-9]*(?:,[0-9]*)*")


class UnreadableUrl(ValueError):
    """libpq cannot read the URL (or psycopg, which asks it, is missing)."""


def is_url(location: object) -> bool:
    return isinstance(location, str) and location.lower().startswith(URL_SCHEMES)


def resolve_store(value: object, base: Path, rootpath: Path) -> Location:
    """The store ``value`` names, relative to ``base`` (``parse_location``); with no value,
    ``.gputrain/benchmarks.sqlite`` in the rootdir."""
    text = str(value or "").strip()
    return parse_location(text, base) if text else rootpath / DEFAULT_STORE


def parse_location(text: str, base: Path) -> Location:
    """The store ``text`` names (see the module's rules); ``ValueError`` saying why, showing
    nothing of a URL that libpq cannot read, when it is neither a usable URL nor a path."""
    text = text.strip()
    if is_url(text):
        try:
            libpq_parameters(text)
        except UnreadableUrl as exc:
            raise ValueError(f"{describe(text)} {exc}") from None
        except ImportError:
            pass  # opening it says that psycopg is needed
        return text
    try:
        if b"\x00" in os.fsencode(text):
            raise ValueError(f"{text!r} is not a path: it holds a NUL character")
    except UnicodeEncodeError:  # a surrogate that stands for no byte
        raise ValueError(f"{text!r} is not a path: it holds characters that are not "
                         "text") from None
    if "://" in text:
        raise ValueError(f"{text.split('://')[0]!r}:// is not a store this version knows; give "
                         f"a file path or a postgresql:// URL, e.g. {URL_EXAMPLE}")
    path = resolve_path(text, base)
    if path.is_dir() or text.endswith(("/", "\\")):
        path = path / DEFAULT_NAME
    return path


@functools.cache
def _secret_options() -> frozenset[str]:
    """The options libpq will not show (its ``dispchar`` is ``*`` or ``D``), with ours."""
    from psycopg import pq

    asked = {option.keyword.decode() for option in pq.Conninfo.get_defaults()
             if option.dispchar in (b"*", b"D")}
    return _SECRET_OPTIONS | asked


def _as_libpq_reads(url: str) -> dict[str, Any]:
    from psycopg import ProgrammingError
    from psycopg.conninfo import conninfo_to_dict

    try:
        return conninfo_to_dict(url)
    except ProgrammingError:  # libpq's message may quote the URL whole: not passed on
        raise UnreadableUrl(UNREADABLE_URL) from None


def libpq_parameters(url: str) -> dict[str, Any]:
    """The connection parameters libpq reads from ``url``; :class:`UnreadableUrl` where it
    cannot, or where what it reads cannot be what was meant (a port that is no number, an
    ``@`` left in the host, port or database: a raw ``/`` or ``@`` in a password ends the
    user part early, and the rest would be shown as a host); ``ImportError`` without
    psycopg."""
    parameters = _as_libpq_reads(url)
    if not _PORTS.fullmatch(str(parameters.get("port", ""))) or any(
            "@" in str(parameters.get(name, "")) for name in ("host", "hostaddr", "port",
                                                                "dbname")):
        raise UnreadableUrl(UNREADABLE_URL)
    return parameters


def describe(location: Location) -> str:
    """The location for whatever is shown or written: a path as it is; a URL as libpq reads
    it, its secrets as ``***``; a URL libpq cannot read as its scheme and ``***``."""
    if not is_url(location):
        return str(location)
    text = str(location)
    scheme = text[:text.index("://")].lower()
    try:
        parameters = libpq_parameters(text)
        secret = _secret_options()
    except (ImportError, UnreadableUrl):
        return f"{scheme}://{HIDDEN}"
    except Exception:  # whatever psycopg may raise: still nothing of the URL shown
        return f"{scheme}://{HIDDEN}"
    return _url(scheme, {key: HIDDEN if key in secret else str(value)
                         for key, value in parameters.items() if value is not None})


def _quoted(value: str, safe: str = "") -> str:
    return urllib.parse.quote(value, safe=safe)


def _url(scheme: str, parameters: dict[str, str]) -> str:
    """A URL of the parameters: user, password, a single host and port in their places; the
    rest (a socket folder, several hosts) in the query."""
    query = dict(parameters)
    netloc = ""
    host = query.get("host", "")
    if host and "," not in host and "/" not in host:
        query.pop("host")
        netloc = f"[{host}]" if ":" in host else _quoted(host)
        port = query.get("port", "")
        if port and "," not in port:
            netloc += f":{query.pop('port')}"
    user, password = query.pop("user", None), query.pop("password", None)
    if user is not None or password is not None:
        credentials = _quoted(user or "") + (f":{password}" if password is not None else "")
        netloc = f"{credentials}@{netloc}"
    path = "/" + _quoted(query.pop("dbname")) if "dbname" in query else ""
    rest = "&".join(f"{_quoted(key)}={value if value == HIDDEN else _quoted(value, '/,:')}"
                    for key, value in query.items())
    return f"{scheme}://{netloc}{path}" + (f"?{rest}" if rest else "")


def redact(text: str, location: Location) -> str:
    """``text`` (a driver's or server's message about ``location``) with every secret value
    of the URL replaced by ``***``: libpq does not quote a password back, and this makes
    sure of it."""
    if not is_url(location):
        return text
    try:
        parameters = _as_libpq_reads(str(location))
        secret = _secret_options()
    except Exception:  # nothing libpq could read: nothing it could have been sent
        return text
    for key, value in parameters.items():
        if key in secret and value:
            text = text.replace(str(value), HIDDEN)
    return text
