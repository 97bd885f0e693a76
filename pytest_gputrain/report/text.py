"""Text cut to a terminal's width, in time linear in its length.

``textwrap`` and tabulate's ``maxcolwidths`` copy the rest of an unbroken word for every piece
they cut from it, so a word of n characters costs n²/width: a 2 MB rule title or test id did
not finish. Everything here walks its text once, and what is shown is capped first:

- a headline (a finding's title, a test id, a device) at ``MAX_HEADLINE`` characters,
- a paragraph (a message, a fix) at ``MAX_PARAGRAPH`` characters,

each cut with an ellipsis (``…``). The JSON report and the facts file keep the whole text.

Lines break at spaces only, never at a hyphen; a URL is never broken (one longer than the line
gets a line of its own), a test id breaks between its segments (after ``/``, before ``::`` and
``[``, after ``-`` between parameter ids), and any other word longer than a line is cut into
pieces of the line's length.
"""

from __future__ import annotations

import re

MAX_HEADLINE = 500
MAX_PARAGRAPH = 10_000
ELLIPSIS = "…"

_WORD = re.compile(r"\S+")
# A URL, possibly after the punctuation that opens it in prose: (https://…, `https://…`.
_URL = re.compile(r"[(\[<`'\"]*[A-Za-z][A-Za-z0-9+.-]*://")
# Where a test id may break: after a '/', before '::' or '['; inside the parameters, after '-'.
_PATH_BREAKS = re.compile(r"(?<=/)|(?=::)|(?=\[)")
_PARAM_BREAKS = re.compile(r"(?<=-)")


def shorten(text: str, limit: int) -> str:
    """``text``, or its first ``limit - 1`` characters and an ellipsis."""
    return text if len(text) <= limit else text[:limit - 1] + ELLIPSIS


def nodeid_segments(nodeid: str) -> list[str]:
    """The pieces of a test id between which it may break, in order: joined, they give it
    back (``a/``, ``test_b.py``, ``::TestC``, ``::test_d``, ``[x-``, ``y]``)."""
    base, bracket, params = nodeid.partition("[")
    segments = [part for part in _PATH_BREAKS.split(base) if part]
    if bracket:
        segments += [part for part in _PARAM_BREAKS.split(bracket + params) if part]
    return segments


def _pack(pieces: list[str], width: int) -> list[str]:
    """Pieces (each at most ``width`` long) joined into lines of at most ``width``."""
    lines: list[str] = []
    line: list[str] = []
    used = 0
    for piece in pieces:
        if line and used + len(piece) > width:
            lines.append("".join(line))
            line, used = [], 0
        line.append(piece)
        used += len(piece)
    lines.append("".join(line))
    return lines


def _cut(piece: str, width: int) -> list[str]:
    return [piece[start:start + width] for start in range(0, len(piece), width)] or [""]


def wrap_test_id(nodeid: str, width: int) -> list[str]:
    """``nodeid`` on lines of at most ``width`` characters, broken between its segments, so
    that every line is a whole piece of the id and the lines joined give the id back (it can be
    pasted into ``pytest``). Only a segment longer than ``width`` is cut inside."""
    width = max(1, width)
    pieces: list[str] = []
    for segment in nodeid_segments(nodeid):
        pieces.extend(_cut(segment, width) if len(segment) > width else [segment])
    return _pack(pieces, width)


def is_url(word: str) -> bool:
    return _URL.match(word) is not None


def _pieces(word: str, first: int, then: int) -> list[str]:
    """A word longer than a line, in the pieces it breaks into: the first at most ``first``
    long, the others at most ``then`` (a URL stays whole)."""
    if is_url(word):
        return [word]
    if "::" in word or "/" in word:  # a test id or a path
        return wrap_test_id(word, min(first, then))
    return [word[:first], *_cut(word[first:], then)]


def wrap(text: str, width: int, indent: str = "", first: str | None = None) -> list[str]:
    """``text`` in lines of at most ``width`` characters (a URL longer than a line excepted),
    each starting with ``indent``; the first with ``first`` instead when given. Runs of
    whitespace, newlines included, become one space."""
    lines: list[str] = []
    prefix = indent if first is None else first
    room = max(1, width - len(prefix))
    line: list[str] = []
    used = 0

    def flush() -> None:
        nonlocal line, used, prefix, room
        lines.append(prefix + " ".join(line))
        line, used = [], 0
        prefix = indent
        room = max(1, width - len(prefix))

    for match in _WORD.finditer(text):
        word = match.group()
        if line and used + 1 + len(word) <= room:
            line.append(word)
            used += 1 + len(word)
            continue
        if line:
            flush()
        if len(word) <= room:
            line, used = [word], len(word)
            continue
        *whole, last = _pieces(word, room, max(1, width - len(indent)))
        for piece in whole:
            line = [piece]
            flush()
        line, used = [last], len(last)
    if line or not lines:
        flush()
    return lines
