"""Saying, once, that a read or write of the benchmark store is waiting for another process.

A store locked by another process (a parallel CI job saving its run, an ``sqlite3`` shell left
in a transaction) makes a read or a write wait: SQLite up to its busy timeout on each of its
attempts, PostgreSQL up to its lock timeout on each of its own. That is minutes in the worst
case, and a job that sits silent that long looks hung. A :class:`WaitNotice` around a read or a
write says on stderr, after :data:`NOTICE_AFTER_S` seconds and once per store, that it is
waiting, for which store (``store_location.describe``: a URL without its password), for which
process where that can be known, and how long it waits at most before giving up.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TextIO

# An uncontended write takes milliseconds; a few seconds means another writer holds the lock.
NOTICE_AFTER_S = 3.0


def longest_wait(attempts: int, timeout_s: float) -> str:
    """How long ``attempts`` waits of ``timeout_s`` each last, for people (the short pauses
    between them aside): ``about 6 min (12 attempts of 30 s)``."""
    total = attempts * timeout_s
    amount = f"{total / 60:.0f} min" if total >= 90 else f"{total:.0f} s"
    return f"about {amount} ({attempts} attempts of {timeout_s:g} s)"


class WaitNotice:
    """Times each write of one store; the first that waits past ``after_s`` is announced."""

    def __init__(self, where: str, longest: str, after_s: float | None = None,
                 stream: TextIO | None = None,
                 holders: Callable[[], str] | None = None) -> None:
        self.where = where
        self.longest = longest
        self.holders = holders  # who holds the lock, in words ("" where not known)
        self.after_s = NOTICE_AFTER_S if after_s is None else after_s
        self._stream = stream
        self._said = threading.Event()

    @contextmanager
    def waiting(self, doing: str = "writing to it") -> Iterator[None]:
        """Around one read or write (``doing``: what the other process is said to be doing,
        "writing to it" or "using it"), with its retries."""
        if self._said.is_set():
            yield
            return
        timer = threading.Timer(self.after_s, self._say, (doing,))
        timer.daemon = True
        timer.start()
        try:
            yield
        finally:
            timer.cancel()

    def who(self) -> str:
        """The processes that hold the lock, in words: ", pid 4242 (python3),", or ""."""
        try:
            holders = self.holders() if self.holders is not None else ""
        except Exception:  # who holds it is a courtesy: the wait goes on without it
            holders = ""
        return f", {holders}," if holders else ""

    def _say(self, doing: str) -> None:
        if self._said.is_set():
            return
        self._said.set()
        stream = self._stream or sys.stderr
        try:
            stream.write(f"gputrain: waiting for the benchmark store {self.where}: another "
                         f"process{self.who()} is {doing}; waiting at most {self.longest} "
                         "before giving up\n")
            stream.flush()
        except (OSError, ValueError):  # stderr closed: the wait goes on, silent as before
            pass
