"""Every write, move and removal inside a run folder goes through these functions: none follows a link.

A run folder may come from someone else, or hold a link someone planted; a write through a link would change a
file outside the run. So an entry the tool writes, and every folder between the output folder and it, must not be a
symbolic link (the output folder itself may be: the user chose it). A file is written to a temporary name beside it
(opened with ``O_NOFOLLOW``) and renamed over the entry: a rename replaces a link, never writes through it.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from pathlib import Path


class LinkInRunFolder(FileExistsError):
    """An entry the run writes (or a folder on its way) is a symbolic link; the message names it and its target."""


def run_folder_path(output_dir) -> Path:
    """The output folder as one absolute spelling (``.``, ``R/``, ``../R`` are the same folder); links are kept."""
    return Path(os.path.abspath(os.path.expanduser(str(output_dir))))


def check_not_linked(output_dir: Path, path: Path, *, entry_too: bool = True) -> None:
    """Refuse, naming it and its target, a link at ``path`` or at any folder between ``output_dir`` and it."""
    parts = Path(path).relative_to(output_dir).parts
    current = Path(output_dir)
    for index, part in enumerate(parts):
        current = current / part
        if (entry_too or index < len(parts) - 1) and os.path.islink(current):
            raise LinkInRunFolder(
                f"{current} is a link (to {os.readlink(current)}), where simcse-weince writes; it never writes "
                f"through a link in a run folder: remove the link (rm {current}) or choose another --output-dir"
            )


def check_entries(output_dir: Path, names) -> None:
    """:func:`check_not_linked` for each entry (``logs/metrics.csv``: a path below the folder) that exists."""
    for name in names:
        check_not_linked(output_dir, Path(output_dir) / name)


def write_bytes(output_dir: Path, path: Path, data: bytes) -> None:
    """Write ``path`` inside ``output_dir`` atomically, through no link."""
    check_not_linked(output_dir, path)
    staging = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
    try:
        with os.fdopen(os.open(staging, flags, 0o644), "wb") as handle:
            handle.write(data)
        os.replace(staging, path)
    except BaseException:
        if not os.path.islink(staging):
            with contextlib.suppress(OSError):
                os.unlink(staging)
        raise


def write_text(output_dir: Path, path: Path, text: str) -> None:
    write_bytes(output_dir, path, text.encode("utf-8"))


def move(output_dir: Path, source: Path, target: Path) -> None:
    """Rename ``source`` to ``target`` (both inside ``output_dir``; a link entry moves as the link itself)."""
    check_not_linked(output_dir, source, entry_too=False)
    check_not_linked(output_dir, target, entry_too=False)
    os.replace(source, target)


def remove(output_dir: Path, path: Path) -> None:
    """Remove an entry (a link is removed, not followed; a folder with what it holds)."""
    check_not_linked(output_dir, path, entry_too=False)
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path)
    elif os.path.lexists(path):
        os.unlink(path)


def make_dir(output_dir: Path, path: Path) -> None:
    check_not_linked(output_dir, path)
    path.mkdir(exist_ok=True)
