"""The SimCSE trainer: config and CLI, data order, bad input, and an end-to-end run on a tiny BERT."""

from __future__ import annotations

import csv
import dataclasses
import hashlib
import json
import os
from pathlib import Path

import pytest
import torch
import yaml
from train_helpers import folder_score, write_train_file

from simcse_weince import WeinceConfig, infonce_loss, weince_loss
from simcse_weince.losses.from_embeddings import ContrastiveObjective
from simcse_weince.settings import apply_overrides, read_config_file
from simcse_weince.text.config import TrainConfig, preset, resolve_length_chunks
from simcse_weince.text.data import load_sentences
from simcse_weince.text.fast_path.onednn_linear import resolve_onednn_linear
from simcse_weince.text.results import format_summary
from simcse_weince.text.trainer import train
from simcse_weince.training.batches import StepBatchSampler
from simcse_weince.training.timing import TIME_PARTS

TRAIN_LINES = 400  # the train_file fixture's sentences (conftest.py)


def tiny_config(model: str, train_file: str, output_dir: Path, **overrides) -> TrainConfig:
    """20 steps of 16 sentences, STS-B dev every 10 steps, a checkpoint every 5: a few seconds."""
    settings = {
        "model": model,
        "train_file": train_file,
        "pooler": "cls",
        "batch_size": 16,
        "max_steps": 20,
        "eval_steps": 10,
        "save_steps": 5,
        "learning_rate": 1e-3,
        "final_tasks": ["stsb"],
        "eval_max_length": 32,
        "report_to": ["csv"],
        "output_dir": str(output_dir),
        **overrides,
    }
    return preset("paper", **settings)


# --------------------------------------------------------------------------------------------- config


def test_presets_hold_the_recipes():
    paper = preset("paper")
    assert (paper.model, paper.pooler, paper.loss, paper.temperature) == ("bert-base-uncased", "cls", "weince", 0.05)
    assert (paper.batch_size, paper.max_length, paper.learning_rate, paper.num_epochs) == (64, 32, 3e-5, 1)
    assert paper.eval_steps == 125 and paper.final_tasks == (
        "sts12",
        "sts13",
        "sts14",
        "sts15",
        "sts16",
        "stsb",
        "sickr",
    )
    assert paper.weince == WeinceConfig()
    demo = preset("cpu-demo")
    assert (demo.model, demo.pooler, demo.train_file) == ("bundled:all-MiniLM-L6-v2", "avg", "wiki1m_head.txt")
    # cpu-cls: the cpu-demo trained and evaluated SimCSE's way ([CLS] + MLP in training, without it at evaluation)
    cls = preset("cpu-cls")
    assert (cls.pooler, cls.output_dir) == ("cls", "runs/cpu-cls")
    differing = {k for k, v in cls.to_dict().items() if v != demo.to_dict()[k]}
    assert differing == {"pooler", "output_dir"}
    with pytest.raises(ValueError, match="unknown preset"):
        preset("laptop")


def test_every_preset_is_a_cli_choice(capsys):
    from simcse_weince.cli import main
    from simcse_weince.text.config import PRESETS

    with pytest.raises(SystemExit):
        main(["train", "--preset", "laptop"])
    message = capsys.readouterr().err
    assert all(f"'{name}'" in message for name in PRESETS) and "cpu-cls" in PRESETS


def test_overrides_are_typed_and_reach_every_weince_field(tmp_path):
    config = apply_overrides(
        TrainConfig(),
        {
            "batch-size": "8",
            "weince.quantile": "0.3",
            "gate": "rho",
            "beta": "1.0",
            "max_steps": "none",
            "final_tasks": "stsb,sickr",
            "cpu": "true",
        },
    )
    assert config.batch_size == 8 and config.max_steps is None and config.cpu is True
    assert config.final_tasks == ("stsb", "sickr")
    assert (config.weince.quantile, config.weince.gate, config.weince.beta) == (0.3, "rho", 1.0)
    assert apply_overrides(config, {"beta": "estimated"}).weince.beta == "estimated"
    with pytest.raises(ValueError, match="unknown config setting"):
        apply_overrides(config, {"batch": 3})
    with pytest.raises(ValueError, match="batch_size must be an integer"):
        apply_overrides(config, {"batch_size": "many"})
    with pytest.raises(ValueError, match="batch_size must be >= 2"):
        apply_overrides(config, {"batch_size": 1})
    with pytest.raises(ValueError, match="unknown loss"):
        apply_overrides(config, {"loss": "triplet"})
    with pytest.raises(ValueError, match="quantile"):
        apply_overrides(config, {"quantile": 1.5})


def test_config_files_yaml_and_json(tmp_path):
    (tmp_path / "run.yaml").write_text("loss: infonce\ntemperature: 0.1\nweince:\n  kappa_rho: 5\n")
    (tmp_path / "run.json").write_text(json.dumps({"batch_size": 32, "weince.aic_margin": 6}))
    config = apply_overrides(TrainConfig(), read_config_file(tmp_path / "run.yaml"))
    config = apply_overrides(config, read_config_file(tmp_path / "run.json"))
    assert (config.loss, config.temperature, config.weince.kappa_rho) == ("infonce", 0.1, 5.0)
    assert (config.batch_size, config.weince.aic_margin) == (32, 6.0)
    with pytest.raises(FileNotFoundError):
        read_config_file(tmp_path / "missing.yaml")
    (tmp_path / "list.yaml").write_text("- 1\n- 2\n")
    with pytest.raises(ValueError, match="mapping"):
        read_config_file(tmp_path / "list.yaml")


@dataclasses.dataclass
class AugmentSection:
    crop: float = 0.5


@dataclasses.dataclass
class ConfigWithItsOwnSection:
    """A trainer's config whose section is neither the text trainer's ``weince`` nor its ``speed``."""

    seed: int = 1
    augment: AugmentSection = dataclasses.field(default_factory=AugmentSection)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def test_config_file_sections_come_from_the_config_class(tmp_path):
    """settings.py names no trainer's sections: a nested section of any config reads the same as its dotted form."""
    (tmp_path / "run.yaml").write_text("seed: 3\naugment:\n  crop: 0.25\n")
    assert read_config_file(tmp_path / "run.yaml") == {"seed": 3, "augment.crop": 0.25}
    config = apply_overrides(ConfigWithItsOwnSection(), read_config_file(tmp_path / "run.yaml"))
    assert config == ConfigWithItsOwnSection(seed=3, augment=AugmentSection(crop=0.25))
    with pytest.raises(ValueError, match="unknown config setting 'augment.crop'"):
        apply_overrides(TrainConfig(), read_config_file(tmp_path / "run.yaml"))


def test_cli_flags_cover_every_field(tmp_path, capsys):
    from simcse_weince.cli import build_parser, main

    parser = build_parser()
    weince_fields = list(WeinceConfig.__dataclass_fields__)
    values = {
        "quantile": "0.3",
        "aic_margin": "6",
        "kappa_rho": "5",
        "kappa_aic": "2",
        "tail_fraction": "0.2",
        "min_tail_points": "16",
        "beta": "1.0",
        "beta_min": "0.25",
        "beta_max": "8",
        "gate": "aic",
        "eps": "1e-5",
    }
    assert set(values) == set(weince_fields)
    argv = ["train", "--preset", "cpu-demo", "--batch-size", "32", "--loss", "infonce", "--max-steps", "7"]
    for name, value in values.items():  # short and dotted spellings alternate
        flag = name.replace("_", "-")
        argv += [f"--weince.{name}" if len(argv) % 4 else f"--{flag}", value]
    args = parser.parse_args(argv)
    from simcse_weince.text.cli import build_config

    config = build_config(args)
    assert config.weince == WeinceConfig(
        quantile=0.3,
        aic_margin=6,
        kappa_rho=5,
        kappa_aic=2,
        tail_fraction=0.2,
        min_tail_points=16,
        beta=1.0,
        beta_min=0.25,
        beta_max=8,
        gate="aic",
        eps=1e-5,
    )
    assert (config.batch_size, config.loss, config.max_steps, config.pooler) == (32, "infonce", 7, "avg")
    for name in TrainConfig.__dataclass_fields__:
        if name != "weince":
            assert f"--{name.replace('_', '-')}" in parser._subparsers._group_actions[0].choices["train"].format_help()

    config_file = tmp_path / "c.yaml"
    config_file.write_text("temperature: 0.1\nbatch_size: 16\n")
    assert main(["train", "--config", str(config_file), "--batch-size", "8", "--print-config"]) == 0
    printed = yaml.safe_load(capsys.readouterr().out)
    assert (printed["temperature"], printed["batch_size"], printed["model"]) == (0.1, 8, "bert-base-uncased")
    assert main(["train", "--batch-size", "1", "--print-config"]) == 1
    assert "batch_size must be >= 2" in capsys.readouterr().err


# ------------------------------------------------------------------------------------- data and loss


def test_batches_are_a_pure_function_of_the_step():
    full = list(StepBatchSampler(100, 10, seed=3, start_batch=0, num_batches=25))
    assert len(full) == 25 and all(len(batch) == 10 for batch in full)
    assert sorted(i for batch in full[:10] for i in batch) == list(range(100))  # an epoch is a permutation
    assert full[10:20] != full[:10]  # the next epoch is shuffled again
    assert list(StepBatchSampler(100, 10, seed=3, start_batch=7, num_batches=25)) == full[7:]  # resume
    assert list(StepBatchSampler(100, 10, seed=4, start_batch=0, num_batches=25)) != full
    halves = [list(StepBatchSampler(100, 10, 3, 0, 25, process_index=r, num_processes=2)) for r in (0, 1)]
    assert [a + b for a, b in zip(*halves)] == full  # processes split each global batch
    with pytest.raises(ValueError, match="divisible"):
        StepBatchSampler(100, 10, 3, 0, 25, process_index=0, num_processes=3)
    with pytest.raises(ValueError, match="fewer than one batch"):
        StepBatchSampler(5, 10, 3, 0, 1)


def test_objective_is_the_core_loss_on_two_views():
    torch.manual_seed(0)
    first, second = torch.randn(24, 16), torch.randn(24, 16)
    loss, stats = ContrastiveObjective("weince", 0.05, weince=WeinceConfig(quantile=0.3))(first, second)
    expected, full = weince_loss(first, second, temperature=0.05, weince=WeinceConfig(quantile=0.3), return_stats=True)
    assert torch.equal(loss, expected)
    assert stats["lambda_mean"] == full["mixing_weight"].mean()
    assert stats["lambda_above_half"] == (full["mixing_weight"] > 0.5).float().mean()
    assert set(stats) == {"lambda_mean", "lambda_above_half", "rho0", "delta_aic_mean", "beta_hat_mean"}
    loss, stats = ContrastiveObjective("infonce", 0.05)(first, second)
    assert torch.equal(loss, infonce_loss(first, second, temperature=0.05)) and stats == {}


def test_sentences_skip_empty_lines_and_bad_files_are_clear(tmp_path):
    path = tmp_path / "t.txt"
    path.write_text("first sentence\n\n   \nsecond sentence\n")
    sentences, skipped = load_sentences(path)
    assert sentences["text"] == ["first sentence", "second sentence"] and skipped == 2
    with pytest.raises(FileNotFoundError, match="not found"):
        load_sentences(tmp_path / "missing.txt")
    (tmp_path / "empty.txt").write_text("")
    with pytest.raises(ValueError, match="is empty"):
        load_sentences(tmp_path / "empty.txt")
    (tmp_path / "blank.txt").write_text("\n \n\n")
    with pytest.raises(ValueError, match="no sentences"):
        load_sentences(tmp_path / "blank.txt")


def test_prepared_lines_follow_the_file_content_not_its_path_and_mtime(tmp_path):
    """A training file rewritten with other lines of the same size, its mtime kept (``cp -p``, ``rsync -t`` do
    this), is read anew: the prepared-data cache is keyed by the sha256 the run records, not by path and mtime
    (🤗 datasets' own key), and the recorded fingerprint is the one of the lines read."""
    from simcse_weince.provenance import file_fingerprint
    from simcse_weince.text.data import prepared_data_cache

    path = tmp_path / "data.txt"
    first = [f"old sentence {i:03d}" for i in range(40)]
    path.write_text("\n".join(first) + "\n", encoding="utf-8")
    kept = path.stat()
    assert load_sentences(path)[0]["text"] == first
    assert load_sentences(path)[0]["text"] == first  # now from the cache
    second = [f"new sentence {i:03d}" for i in range(40)]  # the same size
    path.write_text("\n".join(second) + "\n", encoding="utf-8")
    os.utime(path, ns=(kept.st_atime_ns, kept.st_mtime_ns))
    assert (path.stat().st_size, path.stat().st_mtime_ns) == (kept.st_size, kept.st_mtime_ns)
    assert load_sentences(path)[0]["text"] == second
    fingerprint = file_fingerprint(path)
    assert fingerprint["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
    assert prepared_data_cache(path).name == f"text-{fingerprint['sha256']}"


def test_bad_runs_fail_early_with_clear_messages(tmp_path, tiny_model, train_file, capsys):
    from simcse_weince.cli import main

    def run(*args):
        code = main(
            [
                "train",
                "--model",
                tiny_model,
                "--train-file",
                train_file,
                "--batch-size",
                "16",
                "--report-to",
                "csv",
                *args,
            ]
        )
        return code, capsys.readouterr().err

    code, err = run("--train-file", str(tmp_path / "nope.txt"), "--output-dir", str(tmp_path / "a"))
    assert code == 1 and "training file not found" in err
    (tmp_path / "empty.txt").write_text("")
    code, err = run("--train-file", str(tmp_path / "empty.txt"), "--output-dir", str(tmp_path / "b"))
    assert code == 1 and "is empty" in err
    code, err = run("--model", "no-such-org/no-such-model", "--output-dir", str(tmp_path / "c"))
    assert code == 1 and "cannot load the model 'no-such-org/no-such-model'" in err and "offline" in err
    code, err = run("--batch-size", "1", "--output-dir", str(tmp_path / "d"))
    assert code == 1 and "batch_size must be >= 2" in err
    few = tmp_path / "few.txt"
    few.write_text("one\ntwo\nthree\n")
    code, err = run("--train-file", str(few), "--output-dir", str(tmp_path / "e"))
    assert code == 1 and "fewer than one batch of 16" in err

    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("keep me")
    code, err = run("--output-dir", str(foreign))
    assert code == 1 and "already holds files" in err
    code, err = run("--output-dir", str(foreign), "--overwrite")
    assert code == 1 and "not a simcse-weince run" in err
    assert (foreign / "notes.txt").read_text() == "keep me"
    code, err = run("--output-dir", str(tmp_path / "f"), "--resume")
    assert code == 1 and "holds no simcse-weince run" in err


# ----------------------------------------------------------------------------------------- end to end


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory, tiny_model, train_file):
    """One uninterrupted tiny run (also the reference of the resume test)."""
    output_dir = tmp_path_factory.mktemp("runs") / "uninterrupted"
    config = tiny_config(tiny_model, train_file, output_dir)
    return config, train(config)


def test_end_to_end_run_writes_a_sentence_transformer_and_its_results(tiny_run, data_dir):
    from sentence_transformers import SentenceTransformer

    config, results = tiny_run
    output_dir = Path(config.output_dir)
    on_disk = json.loads((output_dir / "results.json").read_text())
    for key in (
        "stsb_dev_spearman",
        "stsb_test_spearman",
        "best_step",
        "config",
        "lambda_stats",
        "wall_time_seconds",
        "train_sentences_per_second",
        "history",
    ):
        assert key in on_disk
    assert on_disk["total_steps"] == 20 and len(on_disk["history"]) == 20
    # length_chunks auto: the chunks of the precision the run used (auto: bf16 where native, else fp32)
    assert on_disk["length_chunks"] == resolve_length_chunks("auto", on_disk["mixed_precision"])
    assert on_disk["unpadded_layers"] is True  # a BertModel: the linear layers ran on the real tokens only
    # ... because the fast path passed its start-up check on the installed transformers
    assert on_disk["training_forward"]["path"] == "fast" and on_disk["training_forward"]["reason"] is None
    # auto: oneDNN's fp32 linear layers on an AMD CPU, in fp32 steps only
    assert on_disk["onednn_linear"] is (on_disk["mixed_precision"] == "no" and resolve_onednn_linear("auto", "cpu"))
    # the wall time is the whole run, the final evaluation and export included, and holds every part
    parts = [f"{name}_seconds" for name in TIME_PARTS]
    assert all(on_disk[key] >= 0 for key in parts)
    assert on_disk["final_evaluation_seconds"] > 0 and on_disk["evaluation_seconds"] > 0
    assert sum(on_disk[key] for key in parts) <= on_disk["wall_time_seconds"]
    assert on_disk["train_seconds"] == on_disk["train_time_seconds"] == on_disk["history"][-1]["train_seconds"]
    summary = format_summary(on_disk, output_dir)
    assert f"wall time {on_disk['wall_time_seconds']:.0f} s (" in summary and "final evaluation" in summary
    assert [e["step"] for e in on_disk["evaluations"]] == [10, 20]
    assert on_disk["best_step"] in (10, 20)
    # during training our own encoder scores dev; at the end the exported folder does (same model, other batching:
    # a random tiny model's cosines crowd near 1, so float noise in the last digits can swap a few ranks)
    assert on_disk["best_stsb_dev_spearman_during_training"] == pytest.approx(on_disk["stsb_dev_spearman"], abs=0.1)
    assert set(on_disk["lambda_stats"]) == {
        "lambda_mean",
        "lambda_above_half",
        "rho0",
        "delta_aic_mean",
        "beta_hat_mean",
    }
    assert all(0 <= e["lambda_mean"] <= 1 for e in on_disk["history"])
    assert on_disk["config"]["model"] == config.model and on_disk["config"]["weince"]["quantile"] == 0.2
    # the folder is a SentenceTransformer with the evaluation pooler (CLS without the MLP head)
    model = SentenceTransformer(str(output_dir), device="cpu")
    assert model[1].get_config_dict()["pooling_mode"] == "cls"
    assert folder_score(model, results, "test", data_dir) == pytest.approx(results["stsb_test_spearman"], abs=1e-6)
    # resolved config, trackers, model card
    assert yaml.safe_load((output_dir / "training_config.yaml").read_text())["batch_size"] == 16
    with (output_dir / "logs" / "metrics.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    assert {row["name"] for row in rows} >= {"loss", "lambda_mean", "rho0", "stsb_dev_spearman"}
    card = (output_dir / "README.md").read_text()
    assert (
        "Gao" in card and "2606.00262" in card and "WEINCE" in card and f"{results['stsb_test_spearman']:.2f}" in card
    )
    assert "SentenceTransformer(" in card
    assert f"{on_disk['wall_time_seconds']:.0f} s wall time for the whole run" in card
    assert f"final evaluation {on_disk['final_evaluation_seconds']:.0f} s" in card
    header = yaml.safe_load(card.split("---")[1])
    assert header["library_name"] == "sentence-transformers" and "model-index" in header


def test_a_finished_run_is_not_overwritten_without_the_flag(tiny_run):
    config, _ = tiny_run
    with pytest.raises(FileExistsError, match="--resume to continue it, --overwrite"):
        train(config)


def test_push_fails_clearly_offline_without_token_or_model(tmp_path, monkeypatch, capsys):
    import huggingface_hub

    from simcse_weince.cli import main

    model_dir = tmp_path / "model"
    model_dir.mkdir()
    assert main(["push", str(model_dir), "me/model"]) == 1
    assert "not a trained model folder" in capsys.readouterr().err
    (model_dir / "modules.json").write_text("[]")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert main(["push", str(model_dir), "me/model"]) == 1
    assert "offline" in capsys.readouterr().err
    for name in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(huggingface_hub, "get_token", lambda: None)
    assert main(["push", str(model_dir), "me/model"]) == 1
    assert "no Hugging Face token" in capsys.readouterr().err


def test_bf16_gradient_accumulation_and_no_evaluation(tmp_path, tiny_model, train_file):
    config = tiny_config(
        tiny_model, train_file, tmp_path / "run", loss="infonce", max_steps=3, gradient_accumulation_steps=2,
        mixed_precision="bf16", eval_steps=0, save_steps=0, final_evaluation=False, unpadded_layers=False,
    )  # fmt: skip
    results = train(config)
    assert results["unpadded_layers"] is False  # turned off: the model's own (padded) forward
    assert results["onednn_linear"] is False  # only in fp32 steps of the unpadded forward
    assert [entry["learning_rate"] for entry in results["history"]] == pytest.approx([2e-3 / 3, 1e-3 / 3, 0.0])
    assert results["stsb_test_spearman"] is None and results["lambda_stats"] == {}
    assert results["train_sentences_per_second"] > 0 and results["best_step"] == 3
    # auto under bf16 on this CPU: one padded forward with AMX, chunks without
    assert results["config"]["speed"]["length_chunks"] == "auto"
    assert results["length_chunks"] == resolve_length_chunks("auto", "bf16", "cpu")
    assert "Not evaluated" in (tmp_path / "run" / "README.md").read_text()
    assert (tmp_path / "run" / "modules.json").is_file()


# ----------------------------------------------------------------------------------- training trains


def test_views_differ_by_dropout_in_train_mode_only(tiny_model):
    from simcse_weince.text.model import SimCSEModel

    model = SimCSEModel.from_pretrained(tiny_model, pooler="cls", max_seq_length=32, dropout=0.1)
    batch = model.tokenizer(["a man plays a guitar .", "stocks fell on monday ."], padding=True, return_tensors="pt")
    model.train()
    first, second = model(**batch, num_views=2)
    assert first.shape == second.shape == (2, 32)
    assert (first - second).abs().max() > 1e-3  # independent dropout masks for the two copies
    model.eval()
    first, second = model(**batch, num_views=2)
    torch.testing.assert_close(first, second)


def _fixed_batch_loss(model_path: str, sentences: list[str]) -> float:
    """The WEINCE loss of one batch in train mode, averaged over five fixed sets of dropout masks (seeds 0-4)."""
    from simcse_weince.losses.from_embeddings import ContrastiveObjective
    from simcse_weince.text.model import SimCSEModel

    model = SimCSEModel.from_pretrained(model_path, pooler="avg", max_seq_length=32, dropout=0.1).train()
    batch = model.tokenizer(sentences, padding=True, truncation=True, max_length=32, return_tensors="pt")
    objective = ContrastiveObjective("weince", 0.05, gather=False)
    values = []
    with torch.no_grad():
        for seed in range(5):
            torch.manual_seed(seed)
            values.append(objective(*model(**batch, num_views=2))[0].item())
    return sum(values) / len(values)


def test_training_changes_every_layer_and_lowers_the_loss_on_a_fixed_batch(tmp_path, tiny_model, data_dir, monkeypatch):
    """16 sentences and batches of 16: every step sees the same batch, so its loss must fall as training goes on."""
    from sentence_transformers import SentenceTransformer
    from transformers import AutoModel

    import simcse_weince.text.trainer as train_module

    views = []

    class RecordViews(train_module.ContrastiveObjective):  # the real objective; it also keeps the views it saw
        def __call__(self, first_view, second_view):
            views.append((first_view.detach().clone(), second_view.detach().clone()))
            return super().__call__(first_view, second_view)

    monkeypatch.setattr(train_module, "ContrastiveObjective", RecordViews)
    one_batch = write_train_file(tmp_path / "one_batch.txt", data_dir, lines=16)
    # mean pooling: the exported folder then embeds exactly as the training forward does (no MLP head)
    config = tiny_config(
        tiny_model, str(one_batch), tmp_path / "run", pooler="avg", max_steps=10, eval_steps=0, save_steps=0,
        final_evaluation=False, warmup_steps=0, lr_scheduler="constant",
    )  # fmt: skip
    train(config)
    # in train mode the two views of every step differ by their dropout masks (model.eval() would make them equal)
    assert len(views) == 10
    assert all((first - second).abs().max() > 1e-3 for first, second in views)
    # Baseline: the untrained model on the same batch with the same dropout masks. Measured: 1.87 before (the five
    # mask sets range over 1.81-1.95); an unchanged model gives the same value to 1e-7; 10 steps at lr 1e-3 give 0.013.
    before = _fixed_batch_loss(tiny_model, one_batch.read_text().splitlines())
    after = _fixed_batch_loss(str(tmp_path / "run"), one_batch.read_text().splitlines())
    assert after < 0.5 * before, (before, after)
    # every trainable tensor of the exported encoder moved away from the initial weights (BERT's NSP pooler is frozen)
    initial = AutoModel.from_pretrained(tiny_model).state_dict()
    exported = SentenceTransformer(str(tmp_path / "run"), device="cpu")[0].auto_model.state_dict()
    unchanged = [name for name, value in exported.items() if name in initial and torch.equal(value, initial[name])]
    assert all(name.startswith("pooler.") or "position_ids" in name for name in unchanged), unchanged
    assert any(name.startswith("encoder.layer.1.") for name in exported)


def test_the_best_dev_step_is_the_one_exported(tmp_path, tiny_model, train_file, monkeypatch):
    """Dev scores scripted as 5, 9, 3: the exported folder must hold the weights of step 2, not of the last step."""
    from sentence_transformers import SentenceTransformer

    import simcse_weince.text.results as results_module

    probe = ["A man is playing a guitar.", "The cat sleeps on the sofa.", "Stocks fell sharply on Monday."]
    scores, probe_embeddings = iter([5.0, 9.0, 3.0]), []

    def scripted_dev_score(encoder, split, data_dir):
        assert split == "dev"
        probe_embeddings.append(encoder(probe))  # what the weights of this step embed
        return next(scores)

    monkeypatch.setattr(results_module, "stsb_spearman", scripted_dev_score)  # where the dev selection looks it up
    config = tiny_config(
        tiny_model,
        train_file,
        tmp_path / "run",
        max_steps=3,
        eval_steps=1,
        save_steps=0,
        final_evaluation=False,
        eval_bf16=False,  # fp32 probes: the exported weights must embed them exactly as during training
    )
    results = train(config)
    assert [e["stsb_dev_spearman"] for e in results["evaluations"]] == [5.0, 9.0, 3.0]
    assert results["best_step"] == 2 and results["best_stsb_dev_spearman_during_training"] == 9.0
    exported = SentenceTransformer(str(tmp_path / "run"), device="cpu").encode(probe, convert_to_numpy=True)
    # the steps are told apart: one step at lr 1e-3 moves the probe embeddings by far more than the tolerance
    assert abs(probe_embeddings[2] - probe_embeddings[1]).max() > 1e-3
    assert abs(exported - probe_embeddings[1]).max() < 1e-5


def test_the_documented_imports_give_the_functions_not_the_modules_of_the_same_name():
    """``from simcse_weince.text import train`` is the README's import; the lazy package attribute once handed out
    the module text/train.py instead (importing a submodule binds its name on the package)."""
    import subprocess
    import sys

    code = (
        "import types\n"
        "from simcse_weince.text import preset, train\n"
        "from simcse_weince.vision import train as vision_train\n"
        "assert not isinstance(train, types.ModuleType) and callable(train), train\n"
        "assert not isinstance(vision_train, types.ModuleType) and callable(vision_train), vision_train\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
