"""Who holds a lock on a file: the processes Linux lists in ``/proc/locks``.

A benchmark store that another process has locked (a CI job saving its run, an ``sqlite3``
shell left in a transaction) makes a reader or writer wait; saying which process holds it turns
"locked" into something a person can act on. SQLite locks with ``fcntl`` (POSIX) locks on the
database file, and in WAL mode on its ``-shm`` file too. Elsewhere (not Linux, a ``/proc``
that cannot be read) nothing is known, and nothing is said.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

LOCKS = Path("/proc/locks")


@dataclass(frozen=True)
class LockHolder:
    pid: int
    name: str  # the process's command name (``/proc/PID/comm``), never its arguments

    def __str__(self) -> str:
        return f"pid {self.pid} ({self.name})" if self.name else f"pid {self.pid}"


def _identity(path: Path) -> tuple[int, int, int] | None:
    try:
        status = os.stat(path)
    except OSError:
        return None
    return os.major(status.st_dev), os.minor(status.st_dev), status.st_ino


def _name(pid: int) -> str:
    # The command name only: another process's arguments may hold a secret.
    try:
        return Path(f"/proc/{pid}/comm").read_text(encoding="utf-8", errors="replace").strip()
    except OSError:
        return ""


def lock_holders(paths: Iterable[Path], locks: Path = LOCKS) -> list[LockHolder]:
    """The other processes holding a lock on any of ``paths`` (writers first); empty where it
    cannot be known."""
    wanted = {identity for identity in map(_identity, paths) if identity is not None}
    try:
        lines = locks.read_text(encoding="ascii", errors="replace").splitlines()
    except OSError:
        return []
    writers: dict[int, None] = {}
    readers: dict[int, None] = {}
    for line in lines:
        fields = line.split()
        # "1: POSIX  ADVISORY  WRITE 12345 08:01:1234567 0 EOF"; "1: -> POSIX ..." waits.
        if len(fields) < 6 or fields[1] == "->":
            continue
        try:
            pid = int(fields[4])
            major, minor, inode = fields[5].split(":")
            identity = (int(major, 16), int(minor, 16), int(inode))
        except ValueError:
            continue
        if identity in wanted and pid > 0 and pid != os.getpid():
            (writers if fields[3] == "WRITE" else readers)[pid] = None
    pids = list(writers) + [pid for pid in readers if pid not in writers]
    return [LockHolder(pid, _name(pid)) for pid in pids]
