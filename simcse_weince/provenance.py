"""Which code and data made a result: the package versions and the git commit of the checkout, recorded in every
``results.json`` (a run's) and ``comparison.json`` (a sweep's), and the fingerprint of a training file (checked by
``--resume`` and by ``compare`` before a finished cell is reused)."""

from __future__ import annotations

import hashlib
import subprocess
from pathlib import Path

from simcse_weince import __version__


def git_commit() -> str | None:
    """The checkout's ``git rev-parse HEAD`` (None outside a git checkout or without git)."""
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=Path(__file__).resolve().parent, capture_output=True, text=True,
            timeout=10, check=True,
        )  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


def versions() -> dict:
    """The versions of the packages a run depends on, and the commit of this package's checkout."""
    import accelerate
    import sentence_transformers
    import torch
    import transformers

    return {
        "simcse_weince": __version__,
        "git_commit": git_commit(),  # the training code's commit: a later re-summary does not rewrite it
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "sentence_transformers": sentence_transformers.__version__,
        "accelerate": accelerate.__version__,
    }


#: sha256 of the training files hashed in this process, (path, size, mtime, inode, ctime) -> hex digest (compare
#: clears it). The ctime is in the key because a rewrite that keeps the mtime (``cp -p``, ``rsync -t``, ``os.utime``)
#: still moves it: no program can set it back
_DIGESTS: dict[tuple, str] = {}


def clear_digests() -> None:
    """Forget the hashed files: a training file may have changed since the last call in this process."""
    _DIGESTS.clear()


def file_fingerprint(path) -> dict:
    """``{"path", "size", "sha256"}`` of a file: what a run (and a finished ``compare`` cell) records of its
    training data, checked on ``--resume``."""
    path = Path(path)
    stat = path.stat()
    key = (str(path.resolve()), stat.st_size, stat.st_mtime_ns, stat.st_ino, stat.st_ctime_ns)
    if key not in _DIGESTS:
        _DIGESTS[key] = file_sha256(path)
    return {"path": str(path), "size": stat.st_size, "sha256": _DIGESTS[key]}


def file_sha256(path) -> str:
    """The sha256 of a file's bytes, read in 4 MiB blocks (training files, checkpoints, an export's files)."""
    digest = hashlib.sha256()
    with Path(path).open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 22), b""):
            digest.update(block)
    return digest.hexdigest()
