"""The files the project writes for the user (reports, facts, benchmark JSON, the history's PNG
and site): which paths an output may take, and how it is written, so that an output never
replaces what is not its own.

By what the path names (symbolic links followed):

- **a new path or a regular file**: written to a temporary file beside it and renamed over it,
  so an interrupted run never leaves half a file. ``mkstemp`` makes that file readable by its
  owner alone (0600); it gets the mode of the file it replaces, or, for a new file, the mode the
  umask gives (0644 under the usual 022), as ``open()`` would have made it. Through a symbolic
  link, the file it points to is replaced and the link stays. Missing folders above it are
  made, as pytest's ``--junitxml`` makes them;
- **the process's own stdout or stderr**, by any name (``/dev/stdout``, ``/dev/fd/2``, or the
  file the shell redirected it to): written to that stream, after what was printed so far;
- **a character device or a FIFO** (``/dev/null``, a terminal, a named pipe): written through,
  never renamed over (as root, a rename over ``/dev/null`` would break it for the whole
  machine). An error of the device (``/dev/full``: no space left) is the output's error;
- **anything under /proc or /sys** (the kernel's interfaces, not files: ``/proc/self/mem``),
  **a directory, a socket or a block device** is refused.

:class:`Claims` checks every output of one run (a pytest session, or one command) before any
work is done, so that a run never ends in an output it cannot write: beyond its kind, a new
path must be one that can be created (the nearest existing folder above it takes a new file)
and a regular file one that can be replaced (its folder takes the temporary file): each tried
for real, a file made and removed at once, since permissions alone do not tell on a read-only
file system or for root. Two outputs naming one file would overwrite each other, and an output
on the benchmark store would destroy it: :class:`Claims` refuses both (a device or a stream may
take several outputs). ``claim(config, ...)`` is the same check for a pytest session, as a
usage error that names the option.

A folder of pages (``history --html DIR``) is written by :func:`write_folder`: as a new
folder, or into an existing one, never through a symbolic link at or below the folder named.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import sys
import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path

import pytest

from pytest_gputrain.folders import make_folder

# The kernel's interfaces: a path there is never an output (a write to /proc/self/mem, or to a
# /proc/sys setting, is no report).
KERNEL_FOLDERS = ("/proc", "/sys")


class OutputPathError(ValueError):
    """The path cannot take an output; the message names it and says why."""


def what_it_is(mode: int) -> str:
    """What a file of ``mode`` is, for messages: "a file", "a directory", "a socket", "a
    block device", "a character device", "a named pipe", or "not a regular file"."""
    for test, words in ((stat.S_ISREG, "a file"), (stat.S_ISDIR, "a directory"),
                        (stat.S_ISSOCK, "a socket"),
                        (stat.S_ISBLK, "a block device"), (stat.S_ISCHR, "a character device"),
                        (stat.S_ISFIFO, "a named pipe")):
        if test(mode):
            return words
    return "not a regular file"


def _in_kernel_folder(path: Path) -> str | None:
    """The kernel folder (/proc, /sys) that ``path`` resolves into, if any."""
    resolved = os.path.realpath(path)
    for folder in KERNEL_FOLDERS:
        if resolved == folder or resolved.startswith(folder + "/"):
            return folder
    return None


def _no_nul(path: Path) -> None:
    """:class:`OutputPathError` for a name no OS call takes (Python would raise ValueError or
    UnicodeEncodeError): a NUL character, or a surrogate that is no byte."""
    try:
        name = os.fsencode(path)
    except UnicodeEncodeError:
        raise OutputPathError(f"{str(path)!r} is not a path: it holds characters that are "
                              "not text") from None
    if b"\x00" in name:
        raise OutputPathError(f"{str(path)!r} is not a path: it holds a NUL character")


def output_kind(path: Path) -> str:
    """``"new"``, ``"file"`` (regular), ``"stream"`` (a character device or a FIFO) or
    ``"standard"`` (this process's stdout or stderr), symbolic links followed;
    :class:`OutputPathError` naming the path for anything else."""
    _no_nul(path)
    if _standard_stream(path) is not None:
        return "standard"
    kernel = _in_kernel_folder(path)
    if kernel is not None:
        raise OutputPathError(f"{path} is under {kernel}, the kernel's interface, not a file "
                              "an output can be written to")
    try:
        mode = os.stat(path).st_mode
    except (FileNotFoundError, NotADirectoryError):
        return "new"  # a file in the way of its folder is reported by check_writable
    except OSError as exc:
        raise OutputPathError(f"{path}: {exc.strerror or exc}") from None
    if stat.S_ISREG(mode):
        return "file"
    if stat.S_ISCHR(mode) or stat.S_ISFIFO(mode):
        return "stream"
    raise OutputPathError(f"{path} is {what_it_is(mode)}: an output goes to a new or regular "
                          "file, or is written through to a device or pipe such as /dev/null "
                          "or /dev/stdout")


def _try_creating_in(folder: Path, path: Path, action: str, tried: set[Path]) -> None:
    if folder in tried:  # one try a folder: a site's thousand pages share one or two
        return
    try:
        handle, probe = tempfile.mkstemp(prefix=".gputrain-probe-", dir=folder)
    except OSError as exc:
        raise OutputPathError(f"{path} cannot be {action}: {folder} does not take a new file "
                              f"({exc.strerror or exc})") from None
    os.close(handle)
    os.unlink(probe)
    tried.add(folder)


def check_writable(path: Path, tried: set[Path] | None = None) -> str:
    """``output_kind(path)``, once the output is known to be writable there: a new path's
    nearest existing folder, or a regular file's folder, takes a new file (tried for real,
    once a folder in ``tried``); a device or pipe is one this process may write.
    :class:`OutputPathError` naming the path otherwise."""
    tried = set() if tried is None else tried
    kind = output_kind(path)
    if kind == "new":
        existing = next((p for p in Path(os.path.abspath(path)).parents if p.exists()), None)
        if existing is not None and not existing.is_dir():
            raise OutputPathError(f"{path} cannot be created: {existing} is a file, not a "
                                  "folder")
        if existing is not None:
            _try_creating_in(existing, path, "created", tried)
    elif kind == "file":
        _try_creating_in(Path(os.path.realpath(path)).parent, path, "replaced", tried)
    elif kind == "stream" and not os.access(path, os.W_OK):
        raise OutputPathError(f"{path} cannot be written: permission denied")
    return kind


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


def write_output(path: Path, content: str | bytes) -> None:
    """Write ``content`` (text as UTF-8) to ``path`` as the module's docstring says; OSError
    (a device's own, or :class:`OutputPathError`'s message) when it cannot be written."""
    data = content.encode("utf-8") if isinstance(content, str) else content
    try:
        kind = output_kind(path)
    except OutputPathError as exc:  # it changed since the options were checked
        raise OSError(errno.EINVAL, str(exc)) from None
    if kind == "standard":
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        fd = _standard_stream(path)
        assert fd is not None
        _write_all(fd, data)
    elif kind == "stream":
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


class Claims:
    """The files of one run, by the option that names them: each output checked
    (:func:`check_writable`), and no two on one file, nor one on a file the run keeps (the
    benchmark store). Claiming again for an option replaces its paths."""

    def __init__(self) -> None:
        self._paths: dict[str, tuple[list[Path], str]] = {}  # option -> (paths, "write"/"read")

    def claim(self, option: str, paths: Iterable[Path]) -> None:
        """Record ``paths`` as the outputs of ``option`` (e.g. ``--png``);
        :class:`OutputPathError` naming the option (and the other one) when a path cannot take
        an output or is another option's file."""
        files: list[Path] = []
        tried: set[Path] = set()
        for path in paths:
            try:
                kind = check_writable(path, tried)
            except OutputPathError as exc:
                raise OutputPathError(f"{option}: {exc}") from None
            if kind in ("stream", "standard"):
                continue  # several outputs may go to /dev/null or to a terminal
            for other in files:
                if _same_file(path, other):
                    raise OutputPathError(f"{option} names the same file twice ({other} and "
                                          f"{path}): the second would overwrite the first")
            self._check_others(option, path, "write")
            files.append(path)
        self._paths[option] = (files, "write")

    def keep(self, option: str, paths: Iterable[Path], role: str = "read") -> None:
        """Record ``paths`` as files ``option`` names that no output may take: the benchmark
        store, which the run reads (``role="read"``) or writes itself (``"write"``)."""
        files = list(paths)
        for path in files:
            self._check_others(option, path, role)
        self._paths[option] = (files, role)

    def _check_others(self, option: str, path: Path, role: str) -> None:
        for other_option, (others, other_role) in self._paths.items():
            if other_option == option or not any(_same_file(path, o) for o in others):
                continue
            if "read" in (role, other_role):
                kept, output = ((other_option, option) if other_role == "read"
                                else (option, other_option))
                raise OutputPathError(f"{output} would overwrite {path}, which {kept} names "
                                      f"and this run reads; give {output} its own file")
            raise OutputPathError(f"{other_option} and {option} both write {path}: one would "
                                  "overwrite the other; give each its own file")


_CLAIMS_KEY = pytest.StashKey[Claims]()


def claim(config: pytest.Config, option: str, paths: Iterable[Path]) -> None:
    """:meth:`Claims.claim` for a pytest session (``option``: e.g. ``gpu_report /
    --gpu-report``), its refusal a ``pytest.UsageError``."""
    try:
        config.stash.setdefault(_CLAIMS_KEY, Claims()).claim(option, paths)
    except OutputPathError as exc:
        raise pytest.UsageError(str(exc)) from None


def keep(config: pytest.Config, option: str, paths: Iterable[Path], role: str = "read") -> None:
    """:meth:`Claims.keep` for a pytest session, its refusal a ``pytest.UsageError``."""
    try:
        config.stash.setdefault(_CLAIMS_KEY, Claims()).keep(option, paths, role)
    except OutputPathError as exc:
        raise pytest.UsageError(str(exc)) from None


# -- a folder of pages ------------------------------------------------------------------------

_NO_FOLLOW = getattr(os, "O_NOFOLLOW", 0)
_DIRECTORY = getattr(os, "O_DIRECTORY", 0)


def _link_error(path: Path, what: str) -> OutputPathError:
    try:
        target = f" (to {os.readlink(path)})"
    except OSError:
        target = ""
    return OutputPathError(f"{path} is a symbolic link{target}: {what} is written into a folder "
                           "of its own, never through a link; remove the link or name "
                           "another folder")


def check_folder(folder: Path, names: Iterable[str], what: str = "the site") -> None:
    """:class:`OutputPathError` naming the first thing in the way of writing ``names``
    (relative paths) into ``folder``: ``folder`` itself or a folder or file below it that is
    a symbolic link, a folder where a file goes or the other way round. Links above
    ``folder`` are the user's own path, and followed."""
    def kind(path: Path) -> int | None:
        try:
            return os.lstat(path).st_mode
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise OutputPathError(f"{path}: {exc.strerror or exc}") from None

    _no_nul(folder)
    for name in names:
        _no_nul(Path(name))
    mode = kind(folder)
    if mode is None:
        return
    if stat.S_ISLNK(mode):
        raise _link_error(folder, what)
    if not stat.S_ISDIR(mode):
        raise OutputPathError(f"{folder} is {what_it_is(mode)}, not a folder: {what} is a "
                              "folder of pages; name a folder")
    for name in names:
        *parents, last = Path(name).parts
        place = folder
        for part in parents:
            place = place / part
            mode = kind(place)
            if mode is None:
                break
            if stat.S_ISLNK(mode):
                raise _link_error(place, what)
            if not stat.S_ISDIR(mode):
                raise OutputPathError(f"{place} is {what_it_is(mode)}, where {what} has a "
                                      "folder; move it away or name another folder")
        else:
            mode = kind(place / last)
            if mode is not None and stat.S_ISLNK(mode):
                raise _link_error(place / last, what)
            if mode is not None and not stat.S_ISREG(mode):
                raise OutputPathError(f"{place / last} is {what_it_is(mode)}, where {what} "
                                      "has a page; move it away or name another folder")


def _write_below(folder_fd: int, name: str, data: bytes, file_mode: int, dir_mode: int) -> None:
    """Write ``data`` to ``name`` below the open folder ``folder_fd``: each folder opened
    without following a link, the file written to a temporary name and renamed over, so that
    a link put in the way meanwhile is replaced, never followed."""
    *parents, last = Path(name).parts
    fds = [folder_fd]
    try:
        for part in parents:
            with contextlib.suppress(FileExistsError):
                os.mkdir(part, dir_mode, dir_fd=fds[-1])
            fds.append(os.open(part, os.O_RDONLY | _DIRECTORY | _NO_FOLLOW, dir_fd=fds[-1]))
        temporary = f".{last}.{os.getpid()}.tmp"
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NO_FOLLOW, file_mode,
                     dir_fd=fds[-1])
        try:
            with os.fdopen(fd, "wb") as stream:
                stream.write(data)
            os.replace(temporary, last, src_dir_fd=fds[-1], dst_dir_fd=fds[-1])
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(temporary, dir_fd=fds[-1])
            raise
    finally:
        for fd in fds[1:]:
            os.close(fd)


def write_folder(folder: Path, files: Mapping[str, bytes], what: str = "the site") -> None:
    """Write ``files`` (relative path -> content) into ``folder``. A missing folder is made
    whole beside where it goes and renamed into place, so it appears complete or not at all;
    an existing one (a site written before) gets each file replaced, other files left alone.
    Never through a symbolic link at or below ``folder`` (:func:`check_folder` first, then
    each folder opened without following one). OSError or :class:`OutputPathError`."""
    check_folder(folder, files, what)
    umask = current_umask()
    file_mode, dir_mode = 0o666 & ~umask, 0o777 & ~umask
    if not os.path.lexists(folder):
        make_folder(folder.parent)
        staging = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", dir=folder.parent))
        try:
            fd = os.open(staging, os.O_RDONLY | _DIRECTORY | _NO_FOLLOW)
            try:
                for name, data in files.items():
                    _write_below(fd, name, data, file_mode, dir_mode)
            finally:
                os.close(fd)
            os.chmod(staging, dir_mode)
            os.rename(staging, folder)
        except BaseException:
            import shutil

            shutil.rmtree(staging, ignore_errors=True)
            raise
        return
    fd = os.open(folder, os.O_RDONLY | _DIRECTORY | _NO_FOLLOW)
    try:
        for name, data in files.items():
            _write_below(fd, name, data, file_mode, dir_mode)
    finally:
        os.close(fd)
