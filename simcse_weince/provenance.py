"""Which code made a result: the package versions and the git commit of the checkout, recorded in every
``results.json`` (a run's) and ``comparison.json`` (a sweep's)."""

from __future__ import annotations

import subprocess
from pathlib import Path


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

    from simcse_weince import __version__

    return {
        "simcse_weince": __version__,
        "git_commit": git_commit(),  # the training code's commit: a later re-summary does not rewrite it
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "sentence_transformers": sentence_transformers.__version__,
        "accelerate": accelerate.__version__,
    }
