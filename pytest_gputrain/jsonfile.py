"""Read a JSON file a user hands to the command line (a facts file), with limits.

No input file is read past :func:`input_limit` bytes (256 MiB unless ``GPUTRAIN_MAX_INPUT_SIZE``
says otherwise), counted while it is read: ``replay /dev/zero`` stops there with an error
naming the file and the limit, rather than reading until the kernel kills the process (a
device or a pipe has no size to check beforehand). :func:`read_limited` is that reader, for
rule files too.

Facts files are written by ``--gpu-facts-out``, but the one given to ``replay`` may have been
edited by hand, cut short or made by someone else. ``json.loads`` alone turns some of those into
crashes far from the file: a ``RecursionError`` for ``[[[[…`` nested thousands deep, a
``ValueError`` for an integer of 4300+ digits, an ``OverflowError`` later for one of 400 digits
(no float holds it), and a ``UnicodeEncodeError`` when a string with a lone surrogate
(``"\\ud800"``, legal in JSON, unprintable in UTF-8) reaches the terminal. :func:`read_json`
turns each into a :class:`JsonFileError` that names the file and the problem, or, for the
surrogate, into text that prints (``\\ud800`` written out).

Parsed, JSON takes many times its size in memory: a facts file about five times, but a file of
nested empty arrays (``[[],[],…]``) twenty, and 200 MB of them took 43 s and 4.6 GB before
being refused as no facts file. Given a :class:`Shape`, :func:`read_json` checks the file's
top level while it reads it, in bounded memory and before the parse: the first thing in it
must open an object (refused after one block read otherwise), and from
:data:`SHAPE_CHECK_FROM` bytes on it must name its kind (a facts file's ``"kind":
"pytest-gputrain-facts"``) and hold no more arrays and objects than one per
:data:`MIN_BYTES_PER_CONTAINER` bytes (a facts file holds one per 100 bytes or more): what is
refused costs a read of the file, and what is parsed no more than a few times its size
(``benchmarks/facts_shape.py`` measures both).
"""

from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pytest_gputrain.units import format_bytes, parse_size, shown

# No fact is larger than a 64-bit integer (bytes, counts, nanoseconds); neither NVML nor torch
# reports one. 20 characters: 19 digits and a sign.
MAX_INT = 2**63
_MAX_INT_CHARS = 20

_LONG_DIGITS = re.compile(r"[0-9]{19}")  # 2**63 has 19 digits: anything shorter is in range
_LARGE_EXPONENT = re.compile(r"[eE]\+?[0-9]{3}")  # 1e400 is infinity; below e100 never is
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")


# A facts file of 20,000 runs is about 60 MB; no rule file comes near a megabyte.
DEFAULT_INPUT_LIMIT = 256 * 2**20
INPUT_LIMIT_VARIABLE = "GPUTRAIN_MAX_INPUT_SIZE"


class JsonFileError(ValueError):
    """The file cannot be read as JSON within the limits; the message names the file."""


class InputFileError(ValueError):
    """An input file cannot be read, or is larger than the limit; the message names it."""


def input_limit() -> int:
    """The most bytes an input file may hold: ``GPUTRAIN_MAX_INPUT_SIZE`` (a size such as
    ``1GiB``) when set, else 256 MiB; ValueError naming the variable for a bad value."""
    text = os.environ.get(INPUT_LIMIT_VARIABLE, "").strip()
    if not text:
        return DEFAULT_INPUT_LIMIT
    try:
        limit = parse_size(text)
    except ValueError as exc:
        raise ValueError(f"{INPUT_LIMIT_VARIABLE}: {exc}") from None
    if limit < 1:
        raise ValueError(f"{INPUT_LIMIT_VARIABLE}: {shown(text)} must be at least 1 byte; e.g. "
                         "1GiB")
    return limit


# A facts file of the 71 recorded in tests/facts holds one array or object per 104 bytes at
# the densest (written without spaces); a third of that leaves room for any real one.
MIN_BYTES_PER_CONTAINER = 32
# Below this size a file is parsed whatever it holds (it cannot cost much memory), so that a
# small file's error is the parser's own, precise one ("not valid JSON" at its line).
SHAPE_CHECK_FROM = 4 * 2**20
_BLOCK = 2**20  # bytes read at a time: the top level is checked in the first


@dataclass(frozen=True)
class Shape:
    """What the top level of a JSON input must be, checked as it is read (:func:`read_json`):
    an object that holds ``"key": "value"`` (its kind), and ``what`` it is, for messages."""

    what: str  # "a pytest-gputrain facts file (written by --gpu-facts-out)"
    key: str
    value: str

    def marker(self) -> re.Pattern[bytes]:
        return re.compile(rb'"' + re.escape(self.key.encode()) + rb'"\s*:\s*"'
                          + re.escape(self.value.encode()) + rb'"')


def _first_byte(block: bytes) -> bytes:
    """The first byte of JSON text in ``block`` (after a byte order mark and white space)."""
    return block.removeprefix(b"\xef\xbb\xbf").lstrip(b" \t\r\n")[:1]


def read_limited(path: Path, shape: Shape | None = None) -> bytes:
    """The bytes of ``path``, read up to :func:`input_limit`; :class:`InputFileError` naming
    the file when it is missing, unreadable or larger, or (with ``shape``) when it is not of
    that shape (:class:`Shape`): its first block does not open an object, or, from
    :data:`SHAPE_CHECK_FROM` bytes, it does not name its kind or holds arrays and objects more
    densely than any such file."""
    try:
        limit = input_limit()
    except ValueError as exc:
        raise InputFileError(f"{path}: not read: {exc}") from None
    data = bytearray()
    containers = 0
    started = False  # the first byte of JSON text has been seen
    try:
        with open(path, "rb") as stream:
            while len(data) <= limit:
                block = stream.read(min(_BLOCK, limit + 1 - len(data)))
                if not block:
                    break
                if shape is not None and not started:
                    first = _first_byte(block)
                    started = bool(first)
                    if started and first != b"{":
                        raise InputFileError(_not_shaped(path, shape, "its top level is not "
                                                         "an object"))
                containers += block.count(b"[") + block.count(b"{")
                data += block
    except FileNotFoundError:
        raise InputFileError(f"{path}: no such file") from None
    except OSError as exc:
        raise InputFileError(f"{path}: cannot be read: {exc.strerror or exc}") from None
    if len(data) > limit:
        shown_limit = format_bytes(limit).replace(".0 ", " ")
        raise InputFileError(f"{path}: larger than {shown_limit} ({limit} bytes), the "
                             f"most an input file may hold; set {INPUT_LIMIT_VARIABLE} (e.g. "
                             "1GiB) to read a larger one")
    if shape is not None and started and len(data) >= SHAPE_CHECK_FROM:
        if containers * MIN_BYTES_PER_CONTAINER > len(data):
            raise InputFileError(_not_shaped(
                path, shape, f"it holds {containers} arrays and objects in {len(data)} bytes, "
                f"more than one per {MIN_BYTES_PER_CONTAINER} bytes"))
        if shape.marker().search(data) is None:
            raise InputFileError(_not_shaped(path, shape,
                                             f'no "{shape.key}": "{shape.value}" in it'))
    return bytes(data)


def _not_shaped(path: Path, shape: Shape, why: str) -> str:
    return f"{path}: not {shape.what}: {why}"


class _OutOfRange(ValueError):
    pass


def _bounded_int(text: str) -> int:
    # Checked before int(): int() refuses 4300+ digits, and is slow well before that.
    value = int(text) if len(text) <= _MAX_INT_CHARS else None
    if value is None or not -MAX_INT <= value <= MAX_INT:
        raise _OutOfRange(f"the integer {shown(text)} is out of range (a fact is at most 2**63)")
    return value


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise _OutOfRange(f"the number {shown(text)} is too large for a float (it would be "
                          "infinity)")
    return value


def _no_constant(text: str) -> Any:
    raise _OutOfRange(f"{text} is not a JSON number (write null for an unknown value)")


def _printable(text: str) -> str:
    # Only lone surrogates cannot be encoded as UTF-8; they are written out as \udXXX.
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def _replace_lone_surrogates(data: Any) -> Any:
    """``data`` with every string printable, walked without recursion (it may nest deeply)."""
    if isinstance(data, str):
        return _printable(data)
    stack = [data]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            for key in list(node):
                value = node.pop(key)
                node[_printable(key)] = _printable(value) if isinstance(value, str) else value
                if isinstance(value, dict | list):
                    stack.append(value)
        elif isinstance(node, list):
            for index, value in enumerate(node):
                if isinstance(value, str):
                    node[index] = _printable(value)
                elif isinstance(value, dict | list):
                    stack.append(value)
    return data


def read_json(path: Path, shape: Shape | None = None) -> Any:
    """The parsed content of ``path``; raises :class:`JsonFileError` naming the file. With
    ``shape``, a file whose top level is not of that shape is refused before it is parsed."""
    try:
        raw = read_limited(path, shape)
    except InputFileError as exc:
        raise JsonFileError(str(exc)) from None
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise JsonFileError(f"{path}: not UTF-8 text (byte {exc.start} is "
                            f"{raw[exc.start]:#04x})") from None
    del raw  # a large file is held once, as text, while it is parsed
    # Integers are checked one by one only when a run of 19 or more digits appears anywhere
    # (maybe in a string): every other integer is within range, and json's own C parser reads
    # them several times faster than a Python hook per integer.
    long_digits = _LONG_DIGITS.search(text) is not None
    parse_int = _bounded_int if long_digits else None
    # A float overflows only with a large exponent or 309 digits or more (a long run of them).
    parse_float = _finite_float if long_digits or _LARGE_EXPONENT.search(text) else None
    try:
        data = json.loads(text, parse_int=parse_int, parse_float=parse_float,
                          parse_constant=_no_constant)
    except json.JSONDecodeError as exc:
        raise JsonFileError(f"{path}: not valid JSON: {exc}") from None
    except _OutOfRange as exc:
        raise JsonFileError(f"{path}: {exc}") from None
    except RecursionError:
        raise JsonFileError(f"{path}: arrays or objects are nested too deeply to read (a facts "
                            "file nests fewer than ten levels)") from None
    if _SURROGATE_ESCAPE.search(text):  # rare, and the search is fast next to the parse
        data = _replace_lone_surrogates(data)
    return data
