"""An input that never ends but is not refused at its first byte: ``{`` and then spaces for
ever, from a named pipe (``/dev/zero`` is refused at once now: its first byte opens no JSON
object), for the tests that the input limit stops a read."""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def endless_json(folder: Path) -> Iterator[Path]:
    """A FIFO in ``folder`` that gives ``{`` and spaces until its reader stops reading."""
    path = folder / "endless.json"
    os.mkfifo(path)
    stop = threading.Event()

    def write() -> None:
        try:
            fd = os.open(path, os.O_WRONLY)
        except OSError:
            return
        try:
            os.write(fd, b"{")
            block = b" " * 2**16
            while not stop.is_set():
                os.write(fd, block)
        except OSError:  # the reader closed the pipe: it stopped at its limit
            pass
        finally:
            os.close(fd)

    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    try:
        yield path
    finally:
        stop.set()
        with contextlib.suppress(OSError):  # unblock a writer still waiting for a reader
            os.close(os.open(path, os.O_RDONLY | os.O_NONBLOCK))
        writer.join(timeout=10)
