"""Where the data lives: one rule for every command.

Order: an explicit ``data_dir`` argument (the ``--data-dir`` flag), then the ``SIMCSE_WEINCE_DATA_DIR``
environment variable, then ``~/.cache/simcse_weince/data``. Downloaders write into the same folder, so a
file fetched once is found offline afterwards.
"""

from __future__ import annotations

import os
from pathlib import Path

DATA_DIR_ENV = "SIMCSE_WEINCE_DATA_DIR"
DEFAULT_DATA_DIR = Path("~/.cache/simcse_weince/data")


def resolve_data_dir(data_dir: str | os.PathLike | None = None) -> Path:
    """The data directory to read from (and download into): argument > $SIMCSE_WEINCE_DATA_DIR > cache."""
    if data_dir is None:
        data_dir = os.environ.get(DATA_DIR_ENV) or DEFAULT_DATA_DIR
    return Path(data_dir).expanduser()


def hub_is_offline() -> bool:
    """True when the user asked for offline mode (HF_HUB_OFFLINE / HF_DATASETS_OFFLINE / TRANSFORMERS_OFFLINE)."""
    return any(
        os.environ.get(name, "").strip().lower() in {"1", "true", "yes", "on"}
        for name in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE")
    )
