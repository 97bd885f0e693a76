"""The files the project writes for the user (reports, facts, benchmark JSON): which paths an
output may take, and how it is written, so that an output never replaces what is not its own.

By what the path names (symbolic links followed):

- **a new path or a regular file**: written to a temporary file beside it and renamed over it,
  so an interrupted run never leaves half a file. ``mkstemp`` makes that file readable by its
  owner alone (0600); it gets the mode of the file it replaces, or, for a new file, the mode the
  umask gives (0644 under the usual 022), as ``open()`` would have made it. Through a symbolic
  link, the file it points to is replaced and the link stays;
- **the process's own stdout or stderr**, by any name (``/dev/stdout``, ``/dev/fd/2``, or the
  file the shell redirected it to): written to that stream, after what was printed so far;
- **a character device or a FIFO** (``/dev/null``, a terminal, a named pipe): written through,
  never renamed over (as root, a rename over ``/dev/null`` would break it for the whole
  machine). An error of the device (``/dev/full``: no space left) is the output's error;
- **anything else** (a directory, a socket, a block device) is refused: :func:`claim` makes it a
  usage error that names the option and the path, before the tests run.

Two outputs naming one file would overwrite each other: :func:`claim` refuses that too (a
device or a stream may take several).
"""

from __future__ import annotations

import errno
import os
import stat
import sys
import tempfile
from collections.abc import Iterable
from pathlib import Path

import pytest

from pytest_gputrain.folders import make_folder

_CLAIMS_KEY = pytest.StashKey[dict[str, list[Path]]]()


class OutputPathError(ValueError):
    """The path cannot take an output; the message names it and says why."""


def _what(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISBLK(mode):
        return "a block device"
    return "not a regular file"


def output_kind(path: Path) -> str:
    """``"new"``, ``"file"`` (regular) or ``"stream"`` (a character device or a FIFO), symbolic
    links followed; :class:`OutputPathError` naming the path for anything else."""
    try:
        mode = os.stat(path).st_mode
    except (FileNotFoundError, NotADirectoryError):
        return "new"  # a file in the way of its folder is reported when the folder is made
    except OSError as exc:
        raise OutputPathError(f"{path}: {exc.strerror or exc}") from None
    if stat.S_ISREG(mode):
        return "file"
    if stat.S_ISCHR(mode) or stat.S_ISFIFO(mode):
        return "stream"
    raise OutputPathError(f"{path} is {_what(mode)}: an output goes to a new or regular file, "
                          "or is written through to a device or pipe such as /dev/null or "
                          "/dev/stdout")


def _identity(path: Path) -> tuple[int, int] | None:
    try:
        status = os.stat(path)
    except OSError:
        return None
    return status.st_dev, status.st_ino


def _standard_stream(path: Path) -> int | None:
    """The file descriptor (1 or 2) of this process's stdout or stderr when ``path`` names it."""
    identity = _identity(path)
    if identity is None:
        return None
    for fd in (1, 2):
        try:
            status = os.fstat(fd)
        except OSError:
            continue
        if (status.st_dev, status.st_ino) == identity:
            return fd
    return None


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def _write_through(path: Path, data: bytes) -> None:
    # O_NONBLOCK: opening a FIFO no one reads fails at once (ENXIO) rather than waiting forever.
    try:
        fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno == errno.ENXIO:
            raise OSError(exc.errno, "no process is reading from this pipe or device") from None
        raise
    try:
        os.set_blocking(fd, True)
        _write_all(fd, data)
    finally:
        os.close(fd)


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


def write_atomically(path: Path, data: bytes) -> None:
    """Write via a temporary file beside ``path`` and rename it over ``path``; keep the
    replaced file's mode (else the umask's)."""
    make_folder(path.parent)
    mode = _mode_for(path)
    handle, temporary = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(handle, "wb") as stream:
            stream.write(data)
        os.chmod(temporary, mode)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def write_output(path: Path, text: str) -> None:
    """Write ``text`` (UTF-8) to ``path`` as the module's docstring says; OSError (a device's
    own, or :class:`OutputPathError`'s message) when it cannot be written."""
    data = text.encode("utf-8")
    fd = _standard_stream(path)
    if fd is not None:
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        _write_all(fd, data)
        return
    try:
        kind = output_kind(path)
    except OutputPathError as exc:  # it changed since the options were checked
        raise OSError(errno.EINVAL, str(exc)) from None
    if kind == "stream":
        _write_through(path, data)
    else:
        write_atomically(Path(os.path.realpath(path)), data)


def append_text(path: Path, text: str) -> None:
    """Append ``text`` as a block of its own (a blank line after what the file holds)."""
    make_folder(path.parent)
    with path.open("a+", encoding="utf-8") as stream:
        if stream.tell() > 0:
            stream.write("\n")
        stream.write(text)


def _same_file(first: Path, second: Path) -> bool:
    if os.path.realpath(first) == os.path.realpath(second):
        return True
    identity = _identity(first)
    return identity is not None and identity == _identity(second)  # hard links


def claim(config: pytest.Config, option: str, paths: Iterable[Path]) -> None:
    """Record ``paths`` as the outputs of ``option`` (e.g. ``gpu_report / --gpu-report``); a
    ``pytest.UsageError`` naming the option (and the other one) when a path cannot take an
    output or is already another output's. Claiming again for an option replaces its paths."""
    claimed = config.stash.setdefault(_CLAIMS_KEY, {})
    files: list[Path] = []
    for path in paths:
        try:
            kind = output_kind(path)
        except OutputPathError as exc:
            raise pytest.UsageError(f"{option}: {exc}") from None
        if kind == "stream":
            continue  # several outputs may go to /dev/null or to a terminal
        for other in files:
            if _same_file(path, other):
                raise pytest.UsageError(f"{option} names the same file twice ({other} and "
                                        f"{path}): the second would overwrite the first")
        for other_option, others in claimed.items():
            if other_option == option:
                continue
            for other in others:
                if _same_file(path, other):
                    raise pytest.UsageError(
                        f"{other_option} and {option} both write {path}: one would overwrite "
                        "the other; give each its own file")
        files.append(path)
    claimed[option] = files
