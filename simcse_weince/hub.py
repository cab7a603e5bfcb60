"""The Hugging Face Hub side of a trained encoder: its model card (README.md) and ``push``.

The card is rendered from a Jinja template with huggingface_hub.

The template ships inside the package (``simcse_weince/model_cards/simcse_sentence_encoder.md``), so it is
found after ``pip install`` as well as in a checkout. Its YAML header (base model, datasets, tags, STS-B
results as ``model-index``) is what the Hub indexes.

Example::

    from simcse_weince.hub import render_model_card
    print(render_model_card(json.load(open("runs/demo/results.json")), repo_id="me/simcse-weince-minilm"))
"""

from __future__ import annotations

import json
import logging
import os
from importlib import resources
from pathlib import Path

from simcse_weince.paths import hub_id_of, hub_is_offline
from simcse_weince.poolers import EXPORT_POOLER, SENTENCE_TRANSFORMERS_POOLING
from simcse_weince.precision import precision_label
from simcse_weince.provenance import file_sha256
from simcse_weince.records import RecordError, check_count, read_json

logger = logging.getLogger(__name__)

TEMPLATE = "simcse_sentence_encoder.md"
LOSS_TITLES = {"weince": "WEINCE", "infonce": "InfoNCE"}


def contrastive_options_text(config: dict) -> str:
    """The loss's MultipleNegativesRankingLoss options as the card's Loss line names them; "" when the loss is the
    plain one (query -> doc, one softmax, no hardness weighting). Older runs' configs lack the keys: defaults."""
    directions = list(config.get("directions") or ["query_to_doc"])
    partition_mode = config.get("partition_mode") or "joint"
    strength = config.get("hardness_strength") or 0.0
    # older runs lack the key: their strength weighed the in-batch negatives; None (none) turns the weighting off
    hardness_mode = config.get("hardness_mode", "in_batch_negatives")
    if hardness_mode is None:
        strength = 0.0
    parts = []
    if directions != ["query_to_doc"]:
        parts.append("directions " + ", ".join(f"`{direction}`" for direction in directions))
    if partition_mode != "joint":
        parts.append(f"partition mode `{partition_mode}`")
    if strength:
        parts.append(f"hardness weighting `{hardness_mode}` with strength {strength:g}")
    return "; ".join(parts)


def template_text(name: str = TEMPLATE) -> str:
    """The text of a model-card template shipped in ``simcse_weince/model_cards/``."""
    return resources.files("simcse_weince").joinpath("model_cards", name).read_text(encoding="utf-8")


def render_model_card(results: dict, repo_id: str | None = None, template: str | None = None) -> str:
    """Render the card from a ``results.json`` dict (it carries the config).

    Args:
        results: what :func:`simcse_weince.text.train` returns / writes.
        repo_id: the Hub id shown in the usage snippet (default: ``<user>/<run folder name>`` placeholder).
        template: a template text to use instead of the packaged one.
    """
    from huggingface_hub import EvalResult, ModelCard, ModelCardData

    config = results["config"]
    base_model = hub_id_of(config["model"])
    loss_title = LOSS_TITLES.get(config["loss"], config["loss"])
    model_name = f"SimCSE ({loss_title}) on {base_model or Path(config['model']).name}"
    simcse_files = ("wiki1m", "nli_for_simcse")
    from_simcse = Path(config["train_file"]).name.startswith(simcse_files)
    datasets = ["princeton-nlp/datasets-for-simcse"] if from_simcse else None
    eval_results = [
        EvalResult(
            task_type="semantic-similarity",
            dataset_type="sentence-transformers/stsb",
            dataset_name="STS Benchmark",
            dataset_split=split,
            metric_type="spearman_cosine",
            metric_value=round(results[f"stsb_{split}_spearman"] / 100, 6),
        )
        for split in ("dev", "test")
        if results.get(f"stsb_{split}_spearman") is not None
    ] or None
    card_data = ModelCardData(
        base_model=base_model,
        datasets=datasets,
        language="en",
        library_name="sentence-transformers",
        pipeline_tag="sentence-similarity",
        tags=["sentence-transformers", "sentence-similarity", "feature-extraction", "simcse", config["loss"]],
        model_name=model_name,
        eval_results=eval_results,
    )
    evaluation_pooler = results.get("evaluation_pooler") or EXPORT_POOLER[config["pooler"]]
    train_columns = results.get("train_columns") or {"text": "sentence"}
    supervised = len(train_columns) > 1
    return ModelCard.from_template(
        card_data,
        template_str=template or template_text(),
        model_name=model_name,
        repo_id=repo_id or f"your-name/{Path(config['output_dir']).name}",
        loss=config["loss"],
        loss_title=loss_title,
        contrastive_options=contrastive_options_text(config),
        pooler=config["pooler"],
        recipe="supervised SimCSE" if supervised else "unsupervised SimCSE",
        supervised=supervised,
        train_columns=train_columns,
        num_train_rows=results.get("num_train_rows", results.get("num_train_sentences")),
        evaluation_pooler=evaluation_pooler,
        st_pooling=SENTENCE_TRANSFORMERS_POOLING[evaluation_pooler],
        base_model=base_model or config["model"],
        base_model_link=base_model is not None,
        train_file_name=Path(results.get("train_file", config["train_file"])).name,
        dimension=results.get("embedding_dimension", "fixed-size"),
        results_note="STS-B: the original benchmark, raw text"
        + (
            "; encoded under bf16 autocast, which moves a score by about 0.01"
            if results.get("evaluation_precision") == "bf16"
            else ""
        ),
        sts_table=results.get("sts_table"),
        config=config,
        # the precision the run trained in (results.json); config.mixed_precision may say "auto"
        training_precision=precision_label(results.get("mixed_precision", config["mixed_precision"])),
        **{
            key: value
            for key, value in results.items()
            if key not in ("config", "sts_table", "evaluation_pooler", "train_columns", "num_train_rows")
        },  # fmt: skip
    ).content


def write_model_card(output_dir: str | Path, results: dict, repo_id: str | None = None) -> Path:
    """Write ``README.md`` into the model folder (sentence-transformers' own card is not written)."""
    from simcse_weince.training.folder_io import write_text

    path = Path(output_dir) / "README.md"
    write_text(path.parent, path, render_model_card(results, repo_id=repo_id))  # never through a link
    return path


#: the export's record of what it wrote: each file (its path in the run folder) with its size and sha256; a file of
#: the run (not uploaded), written last by the export, before results.json
EXPORT_LISTING = "export_files.json"
#: the next step when the export's files are not as it wrote them
EXPORT_AGAIN = "restore it, or run the same train command with --resume to export the run again"


def _export_entries(folder: Path) -> list[str]:
    """The top-level entries of the run's export (its manifest's ``export`` entries; a staging folder excluded)."""
    from simcse_weince.training.run_folder import run_files

    names = sorted(name for name, kind in run_files(folder).items() if kind == "export")
    for name in names:
        if Path(name).name != name or name in ("", ".", ".."):
            raise ValueError(f"{folder}/run_files.json names {name!r}, not an entry of the folder: refusing to push")
    return [name for name in names if not name.startswith(".")]


def _files_under(top: Path) -> list[Path]:
    """``top`` or every entry below it, links included and never entered (``os.walk`` does not follow them)."""
    if not top.is_dir() or top.is_symlink():
        return [top]
    paths = []
    for root, dirs, file_names in os.walk(top):
        paths += [Path(root) / entry for entry in sorted(dirs + file_names)]
    return paths


def write_export_listing(output_dir, staging=None) -> Path:
    """Record every file of the run's export with its size and sha256 in :data:`EXPORT_LISTING` (main process, as
    the export's last step): the export entries of the run's manifest, and the entries of ``staging`` (files the
    export is about to move into the folder, listed under their final names). Written to a new file and renamed
    over the old one, so a link in its place is replaced, never written through. A link inside the export is
    refused (the export writes none)."""
    from simcse_weince.training.run_folder import record_run_files

    folder = Path(output_dir)
    staged = {entry.name: entry for entry in sorted(Path(staging).iterdir())} if staging is not None else {}
    files = {}
    for name in sorted(set(_export_entries(folder)) | set(staged)):
        top = staged.get(name, folder / name)
        for path in _files_under(top):
            if path.is_symlink():
                raise ValueError(f"{path} is a symbolic link: the export writes none; export the run again")
            if path.is_file():
                relative = (Path(name) / path.relative_to(top)).as_posix() if path != top else name
                files[relative] = {"size": path.stat().st_size, "sha256": file_sha256(path)}
    record_run_files(folder, [EXPORT_LISTING], kind="run")
    target = folder / EXPORT_LISTING
    temporary = folder / f".{EXPORT_LISTING}.tmp"
    if temporary.is_symlink() or temporary.exists():
        temporary.unlink()  # a leftover (or a planted link): removed, not opened
    handle = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o644)
    with os.fdopen(handle, "w", encoding="utf-8") as stream:
        json.dump({"format": 1, "files": files}, stream, indent=1)
    os.replace(temporary, target)
    return target


def _listed_files(folder: Path, listing_path: Path) -> dict[str, dict]:
    """The files :data:`EXPORT_LISTING` records, checked: each a relative path inside one of the export's entries,
    with a size (a count) and a sha256."""
    listing = read_json(listing_path, "export listing")
    where = f"export listing {listing_path}"
    files = listing.get("files") if isinstance(listing, dict) else None
    if not isinstance(files, dict):
        raise RecordError(f"{where} holds no 'files' mapping; {EXPORT_AGAIN}")
    entries = set(_export_entries(folder))
    for name, record in files.items():
        parts = Path(name).parts
        if Path(name).is_absolute() or ".." in parts or not parts or parts[0] not in entries:
            raise RecordError(f"{where} names {name!r}, not a file of the run's export; {EXPORT_AGAIN}")
        if not isinstance(record, dict) or not isinstance(record.get("sha256"), str):
            raise RecordError(f"{where}: {name} has no sha256; {EXPORT_AGAIN}")
        check_count(record.get("size"), f"{name}'s size", where)
    return files


def export_files(directory) -> list[tuple[str, Path]]:
    """What ``push`` uploads: exactly the files the export wrote, as ``(path in the repository, local file)``.

    The export records each file it wrote with its size and sha256 in :data:`EXPORT_LISTING`; push uploads those
    and nothing else. A listed file that is missing, a link (or below one), or whose content changed is refused,
    naming it; a file added later inside the export's folders (``1_Pooling/sub/.env``) is not uploaded, and a
    warning names it. A run of an earlier release (no listing) uploads the files below the export's entries of its
    manifest (``run_files.json``), links refused, with a warning that their content cannot be checked.
    """
    folder = Path(directory)
    listing_path = folder / EXPORT_LISTING
    if listing_path.is_symlink():
        raise ValueError(f"{listing_path} is a symbolic link, not the export's listing; {EXPORT_AGAIN}")
    if not listing_path.exists():
        return _unlisted_export_files(folder)
    listed = _listed_files(folder, listing_path)
    files = []
    for name, record in sorted(listed.items()):
        path = folder / name
        for parent in [folder / Path(*Path(name).parts[:depth]) for depth in range(1, len(Path(name).parts) + 1)]:
            if parent.is_symlink():
                raise ValueError(
                    f"{parent} is a symbolic link (to {os.readlink(parent)}): push uploads only the files the export "
                    f"wrote; {EXPORT_AGAIN}"
                )
        if not path.is_file():
            raise FileNotFoundError(f"{path}, written by the export, is missing; {EXPORT_AGAIN}")
        size = path.stat().st_size
        if size != record["size"] or file_sha256(path) != record["sha256"]:
            raise ValueError(
                f"{path} changed since the export wrote it ({record['size']:,} bytes, sha256 "
                f"{record['sha256'][:12]} then; {size:,} bytes now): push uploads the export as it was written; "
                f"{EXPORT_AGAIN}"
            )
        files.append((name, path))
    unlisted = sorted(
        path.relative_to(folder).as_posix()
        for name in _export_entries(folder)
        for path in _files_under(folder / name)
        if (path.is_file() or path.is_symlink()) and path.relative_to(folder).as_posix() not in listed
    )
    if unlisted:
        logger.warning("not uploading %s: the export did not write %s (%s records what it wrote)",
                       ", ".join(unlisted), "them" if len(unlisted) > 1 else "it", EXPORT_LISTING)  # fmt: skip
    return files


def _unlisted_export_files(folder: Path) -> list[tuple[str, Path]]:
    """:func:`export_files` of a folder without :data:`EXPORT_LISTING` (an earlier release's run)."""
    from simcse_weince.training.run_folder import read_run_manifest

    logger.warning("%s has no %s (an earlier release's export): pushing the files below the export's entries "
                   "unchecked; run the same train command with --resume to record them", folder,
                   EXPORT_LISTING)  # fmt: skip
    if read_run_manifest(folder) is None:
        logger.warning("%s has no run manifest (an earlier release's run): pushing the files named like an export",
                       folder)  # fmt: skip
    files = []
    for name in _export_entries(folder):
        top = folder / name
        if not top.exists() and not top.is_symlink():
            raise FileNotFoundError(f"{top} is missing from the export of {folder}; export the run again to push it")
        for path in _files_under(top):
            if path.is_symlink():
                raise ValueError(
                    f"{path} is a symbolic link (to {os.readlink(path)}): push uploads only the files the export "
                    f"wrote; replace it with the file itself or export the run again"
                )
            if path.is_file():
                files.append((path.relative_to(folder).as_posix(), path))
    return files


def push_folder(
    directory,
    repo_id: str,
    *,
    private: bool = False,
    token: str | None = None,
    commit_message: str = "Upload SimCSE model trained with simcse-weince",
) -> str:
    """Upload a trained model folder's export (:func:`export_files`: the model and its card, nothing else) to the
    Hub in one commit; returns the commit URL.

    Raises clear RuntimeErrors when the Hub is offline, no token is available, or the upload fails.
    """
    import re

    folder = Path(directory)
    if not folder.is_dir():
        raise FileNotFoundError(f"model folder {folder} not found; pass the --output-dir of a `train` run")
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*(/[A-Za-z0-9][A-Za-z0-9_.-]*)?", repo_id) or ".." in repo_id:
        raise ValueError(f"invalid repository id {repo_id!r}: use NAME or OWNER/NAME (letters, digits, - _ .)")
    if not (folder / "modules.json").is_file():
        raise FileNotFoundError(
            f"{folder} is not a trained model folder (no modules.json); pass a --output-dir of `train`"
        )
    files = export_files(folder)  # checked before the Hub is asked anything
    if hub_is_offline():
        raise RuntimeError("the Hugging Face Hub is offline (HF_HUB_OFFLINE is set): unset it to push")
    from huggingface_hub import CommitOperationAdd, HfApi, get_token
    from huggingface_hub.errors import HfHubHTTPError

    token = token or get_token()
    if not token:
        raise RuntimeError("no Hugging Face token: run `hf auth login`, set HF_TOKEN, or pass --token")
    api = HfApi(token=token)
    try:
        api.create_repo(repo_id, private=private, exist_ok=True, repo_type="model")
        commit = api.create_commit(
            repo_id=repo_id,
            repo_type="model",
            operations=[CommitOperationAdd(path_in_repo=name, path_or_fileobj=str(path)) for name, path in files],
            commit_message=commit_message,
        )
    except HfHubHTTPError as error:
        raise RuntimeError(f"the Hub refused the upload to {repo_id}: {str(error).splitlines()[0]}") from error
    except Exception as error:  # connection errors (httpx / requests), timeouts
        raise RuntimeError(f"cannot reach the Hugging Face Hub to push {repo_id}: {error}") from error
    return getattr(commit, "commit_url", str(commit))
