"""Writing report and facts files: atomically, with the mode other programs' files get.

``write_atomically`` writes a temporary file and renames it over the target, so an interrupted
run never leaves half a report. ``mkstemp`` creates that file readable by its owner alone
(0600); a report is then chmod-ed to the mode the file it replaces had, or, for a new file, to
the mode the umask gives (0644 under the usual 022), as ``open()`` would have made it.
``append_text`` adds to a file another program reads as it grows (GitHub's step summary).
"""

from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path

from pytest_gputrain.folders import make_folder


def current_umask() -> int:
    """The process's umask, read without changing it where Linux says it (/proc)."""
    try:
        with open("/proc/self/status", encoding="ascii", errors="replace") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)  # elsewhere the only way to read it is to set it, and set it back
    os.umask(mask)
    return mask


def _mode_for(path: Path) -> int:
    try:
        return stat.S_IMODE(path.stat().st_mode)
    except FileNotFoundError:
        return 0o666 & ~current_umask()


def write_atomically(path: Path, text: str) -> None:
    """Write via a temporary file and rename; keep the replaced file's mode (else the umask's)."""
    make_folder(path.parent)
    mode = _mode_for(path)
    handle, temporary = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as stream:
            stream.write(text)
        os.chmod(temporary, mode)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def append_text(path: Path, text: str) -> None:
    """Append ``text`` as a block of its own (a blank line after what the file holds)."""
    make_folder(path.parent)
    with path.open("a+", encoding="utf-8") as stream:
        if stream.tell() > 0:
            stream.write("\n")
        stream.write(text)
