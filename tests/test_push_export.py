"""``push`` uploads exactly the files the export wrote, as it wrote them.

The export records every file it writes, nested ones included, with its size and sha256 in ``export_files.json``
(a file of the run, not uploaded). The invariant: the set ``push`` uploads is that listing, whatever else lies in
the folder (a file added later inside the export's folders is named in a warning and stays home); a listed file
that changed, is missing or is a link is refused, naming it and the next step, and nothing is uploaded. The Hub
is a local stand-in for ``HfApi`` that records the commit.
"""

from __future__ import annotations

import hashlib
import json
import logging
import random
import shutil
from pathlib import Path

import pytest
from train_helpers import make_tiny_model, tree_digest, write_train_file

from simcse_weince.cli import main
from simcse_weince.hub import EXPORT_LISTING, write_export_listing


@pytest.fixture(scope="module")
def exported(tmp_path_factory, data_dir):
    """A finished 3-step run with checkpoints, and its train command."""
    root = tmp_path_factory.mktemp("push_export")
    model = make_tiny_model(root / "tiny")
    train_file = write_train_file(root / "train.txt", data_dir, lines=120)
    command = [
        "train", "--model", str(model), "--train-file", str(train_file), "--batch-size", "8", "--max-steps", "3",
        "--save-steps", "2", "--eval-steps", "0", "--final-evaluation", "false", "--report-to", "csv",
        "--max-length", "16", "--eval-max-length", "16",
    ]  # fmt: skip
    run = root / "run"
    assert main([*command, "--output-dir", str(run)]) == 0
    return {"run": run, "command": command}


@pytest.fixture()
def hub(monkeypatch):
    """``HfApi`` replaced by a stand-in that records the files of the commit (path in the repository -> bytes)."""
    import huggingface_hub

    uploads = []

    class LocalHub:
        def __init__(self, token=None, **kwargs):
            pass

        def create_repo(self, repo_id, **kwargs):
            pass

        def create_commit(self, *, repo_id, operations, **kwargs):
            uploads.append({op.path_in_repo: Path(op.path_or_fileobj).read_bytes() for op in operations})
            return huggingface_hub.CommitInfo(commit_url=f"https://huggingface.co/{repo_id}/commit/1", oid="1",
                                              commit_message="m", commit_description="")  # fmt: skip

    for name in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(huggingface_hub, "HfApi", LocalHub)
    return uploads


def _copy(exported, tmp_path) -> Path:
    folder = tmp_path / "run"
    shutil.copytree(exported["run"], folder, symlinks=True)
    return folder


def _push(folder, capsys) -> tuple[int, str]:
    capsys.readouterr()
    code = main(["push", str(folder), "me/simcse-tiny", "--token", "hf_not_a_real_token"])
    return code, capsys.readouterr().err


def _listing(folder) -> dict:
    return json.loads((folder / EXPORT_LISTING).read_text(encoding="utf-8"))["files"]


def test_the_export_records_each_file_it_wrote_with_its_hash(exported):
    run = exported["run"]
    files = _listing(run)
    assert {"modules.json", "model.safetensors", "README.md", "results.json", "1_Pooling/config.json"} <= set(files)
    for name, record in files.items():
        data = (run / name).read_bytes()
        assert record == {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}, name
    assert not any(name.split("/")[0] in ("checkpoints", "logs", EXPORT_LISTING) for name in files)
    manifest = json.loads((run / "run_files.json").read_text(encoding="utf-8"))["files"]
    assert manifest[EXPORT_LISTING] == "run"  # a file of the run: --overwrite moves it aside, push leaves it home


def test_files_added_inside_the_export_later_are_never_uploaded(exported, hub, tmp_path, capsys, caplog):
    """``R/1_Pooling/sub/.env`` and other files planted at random depths inside the export's folders (and beside
    it) stay home, each named in the warning; the commit holds exactly the listed files, byte for byte."""
    folder = _copy(exported, tmp_path)
    listed = _listing(folder)
    folders = sorted({str(Path(name).parent) for name in listed} - {"."})
    generator = random.Random(0)
    planted = ["1_Pooling/sub/.env"] + [
        f"{generator.choice(folders)}/{'deeper/' * generator.randrange(3)}extra-{index}.txt" for index in range(8)
    ] + ["NOTES.md"]  # fmt: skip
    for name in planted:
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text("API_KEY=secret\n", encoding="utf-8")
    with caplog.at_level(logging.WARNING, logger="simcse_weince.hub"):
        code, err = _push(folder, capsys)
    assert code == 0, err
    [uploaded] = hub
    assert set(uploaded) == set(listed)
    assert all(uploaded[name] == (folder / name).read_bytes() for name in listed)
    warning = " ".join(record.getMessage() for record in caplog.records)
    assert all(name in warning for name in planted if name != "NOTES.md"), warning  # inside the export: named


@pytest.mark.parametrize("change", ["edited", "missing", "link", "linked-folder", "listing-escapes"])
def test_a_listed_file_not_as_the_export_wrote_it_is_refused(exported, hub, tmp_path, capsys, change):
    folder = _copy(exported, tmp_path)
    outside = tmp_path / "outside"
    outside.mkdir()
    named = {"edited": folder / "README.md", "missing": folder / "1_Pooling" / "config.json",
             "link": folder / "tokenizer.json", "linked-folder": folder / "1_Pooling",
             "listing-escapes": folder / EXPORT_LISTING}[change]  # fmt: skip
    if change == "edited":
        named.write_text(named.read_text(encoding="utf-8") + "\nedited after the export\n", encoding="utf-8")
    elif change == "missing":
        named.unlink()
    elif change == "link":
        (outside / named.name).write_bytes(named.read_bytes())  # the same bytes, elsewhere
        named.unlink()
        named.symlink_to(outside / named.name)
    elif change == "linked-folder":
        shutil.copytree(named, outside / named.name)
        shutil.rmtree(named)
        named.symlink_to(outside / named.name)
    else:
        listing = json.loads(named.read_text(encoding="utf-8"))
        listing["files"]["README.md/../../outside/secret"] = {"size": 1, "sha256": "0" * 64}
        named.write_text(json.dumps(listing), encoding="utf-8")
    before = tree_digest(folder)
    code, err = _push(folder, capsys)
    assert code == 1 and not hub, err
    [line] = [line for line in err.splitlines() if "error:" in line]
    assert str(named) in line, line
    assert "run the same train command with --resume to export the run again" in line, line
    assert tree_digest(folder) == before


def test_the_next_step_of_a_refusal_restores_a_pushable_export(exported, hub, tmp_path, capsys):
    folder = _copy(exported, tmp_path)
    (folder / "README.md").write_text("edited\n", encoding="utf-8")
    assert _push(folder, capsys)[0] == 1
    assert main([*exported["command"], "--output-dir", str(folder), "--resume"]) == 0
    code, err = _push(folder, capsys)
    assert code == 0, err
    assert set(hub[0]) == set(_listing(folder))


def test_the_listing_is_never_written_through_a_link(exported, tmp_path):
    folder = _copy(exported, tmp_path)
    victims = {}
    for name in (EXPORT_LISTING, f".{EXPORT_LISTING}.tmp"):
        victims[name] = tmp_path / f"victim-{len(victims)}.txt"
        victims[name].write_text("someone else's file\n", encoding="utf-8")
        (folder / name).unlink(missing_ok=True)
        (folder / name).symlink_to(victims[name])
    write_export_listing(folder)
    assert all(victim.read_text(encoding="utf-8") == "someone else's file\n" for victim in victims.values())
    listing = folder / EXPORT_LISTING
    assert not listing.is_symlink() and _listing(folder) == _listing(exported["run"])
    assert not (folder / f".{EXPORT_LISTING}.tmp").exists()
