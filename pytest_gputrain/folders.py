"""Creating the folder an output goes in, with the reason it cannot be (a file in the way is
the usual one, and the OS only says "File exists" or "Not a directory")."""

from __future__ import annotations

from pathlib import Path


def make_folder(folder: Path) -> None:
    """``folder`` and its parents; OSError whose ``strerror`` says why it cannot be made."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        blocking = next((p for p in (folder, *folder.parents) if p.exists()), None)
        if blocking is not None and not blocking.is_dir():
            raise OSError(exc.errno, f"{blocking} is a file, not a folder") from None
        raise
