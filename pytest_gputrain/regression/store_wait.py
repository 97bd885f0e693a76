"""Saying, once, that a write to the benchmark store is waiting for another writer.

A store locked by another process (a parallel CI job saving its run) makes a write wait:
SQLite up to its busy timeout on each of its attempts, PostgreSQL up to its lock timeout on
each of its own. That is minutes in the worst case, and a job that sits silent that long looks
hung. A :class:`WaitNotice` around a write says on stderr, after :data:`NOTICE_AFTER_S` seconds
and once per store, that it is waiting, for which store (a URL without its password) and how
long it waits at most before giving up.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterator
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
                 stream: TextIO | None = None) -> None:
        self.where = where
        self.longest = longest
        self.after_s = NOTICE_AFTER_S if after_s is None else after_s
        self._stream = stream
        self._said = threading.Event()

    @contextmanager
    def waiting(self) -> Iterator[None]:
        """Around one write, with its retries."""
        if self._said.is_set():
            yield
            return
        timer = threading.Timer(self.after_s, self._say)
        timer.daemon = True
        timer.start()
        try:
            yield
        finally:
            timer.cancel()

    def _say(self) -> None:
        if self._said.is_set():
            return
        self._said.set()
        stream = self._stream or sys.stderr
        try:
            stream.write(f"gputrain: waiting for the benchmark store {self.where}: another "
                         f"process is writing to it; waiting at most {self.longest} before "
                         "giving up\n")
            stream.flush()
        except (OSError, ValueError):  # stderr closed: the wait goes on, silent as before
            pass
