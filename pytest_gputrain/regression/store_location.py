"""Where the benchmark store is: one rule for ``pytest`` (``--gpu-store`` / ini ``gpu_store``)
and for ``python -m pytest_gputrain history`` and ``compare`` alike.

- a ``postgresql://`` (or ``postgres://``) URL is the store as it is, once its form is checked;
- anything else is an SQLite file: ``~`` expanded, a relative path relative to the folder the
  value came from (``options.read_with_base``: the current directory for a command-line value,
  the ini file's folder for an ini value); a folder, or a value ending in a slash, gets
  ``benchmarks.sqlite`` inside;
- with no value, ``.gputrain/benchmarks.sqlite`` in the rootdir.

Light (no sqlite3, no psycopg): the regression settings read it where an option is set.
"""

from __future__ import annotations

import re
import urllib.parse
from pathlib import Path

from pytest_gputrain.options import resolve_path
from pytest_gputrain.regression.options import DEFAULT_NAME, DEFAULT_STORE

URL_SCHEMES = ("postgresql://", "postgres://")
URL_EXAMPLE = "postgresql://ci@db.example.com:5432/benchmarks"

Location = Path | str  # a SQLite file, or a PostgreSQL URL (str)

# A password in a URL that cannot be taken apart (``user:pw@`` before the host, or a query
# parameter), hidden all the same.
_PASSWORD_IN_NETLOC = re.compile(r"(://[^/:@]*):[^/]*@")
_PASSWORD_IN_QUERY = re.compile(r"([?&]password=)[^&]*", re.IGNORECASE)


def is_url(location: object) -> bool:
    return isinstance(location, str) and location.lower().startswith(URL_SCHEMES)


def resolve_store(value: object, base: Path, rootpath: Path) -> Location:
    """The store ``value`` names, relative to ``base`` (``parse_location``); with no value,
    ``.gputrain/benchmarks.sqlite`` in the rootdir."""
    text = str(value or "").strip()
    return parse_location(text, base) if text else rootpath / DEFAULT_STORE


def parse_location(text: str, base: Path) -> Location:
    """The store ``text`` names (see the module's rules); ``ValueError`` naming the value, its
    password hidden, when it is neither a usable URL nor a path."""
    text = text.strip()
    if is_url(text):
        try:
            urllib.parse.urlsplit(text)
        except ValueError as exc:  # "Invalid IPv6 URL": an unclosed [ in the host
            raise ValueError(f"{describe(text)!r} is not a valid PostgreSQL URL ({exc}); "
                             f"e.g. {URL_EXAMPLE}") from None
        return text
    if "://" in text:
        raise ValueError(f"{text.split('://')[0]!r}:// is not a store this version knows; give "
                         f"a file path or a postgresql:// URL, e.g. {URL_EXAMPLE}")
    path = resolve_path(text, base)
    if path.is_dir() or text.endswith(("/", "\\")):
        path = path / DEFAULT_NAME
    return path


def describe(location: Location) -> str:
    """The location for messages: a URL without its password, a path as it is."""
    if not is_url(location):
        return str(location)
    text = str(location)
    try:
        parts = urllib.parse.urlsplit(text)
    except ValueError:  # not a URL that can be taken apart: hide what looks like a password
        return _PASSWORD_IN_QUERY.sub(r"\1***", _PASSWORD_IN_NETLOC.sub(r"\1:***@", text))
    netloc = parts.netloc
    if "@" in netloc:
        credentials, host = netloc.rsplit("@", 1)
        user = credentials.split(":", 1)[0]
        netloc = f"{user}:***@{host}" if ":" in credentials else f"{user}@{host}"
    query = urllib.parse.parse_qsl(parts.query, keep_blank_values=True)
    hidden = [(k, "***" if k.lower() == "password" else v) for k, v in query]
    return urllib.parse.urlunsplit((parts.scheme, netloc, parts.path,
                                    urllib.parse.urlencode(hidden, safe="/*"), parts.fragment))
