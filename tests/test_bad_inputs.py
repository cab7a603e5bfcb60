"""Bad input never costs a run: every bad value, file or option ends in one clear line (or one specific exception),
and an earlier run in the output folder is byte-identical afterwards.

The table runs the CLI's ``main()`` in this process (a subprocess costs ~5-10 s of imports); two subprocess cases
check the exit code, the absence of a traceback and ``--debug`` end to end. Damaged checkpoints of each kind are
resumed at the end of the module.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch
from train_helpers import make_tiny_model, write_train_file

from simcse_weince.cli import main
from simcse_weince.train import TrainConfig, preset, train

OFFLINE_VARIABLES = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE")


def tree_digest(folder: Path) -> str:
    """sha256 over every path and file content under ``folder`` (byte-identical trees have equal digests)."""
    digest = hashlib.sha256()
    for path in sorted(folder.rglob("*")):
        digest.update(path.relative_to(folder).as_posix().encode() + b"\0")
        if path.is_file():
            digest.update(path.read_bytes())
    return digest.hexdigest()


@pytest.fixture(scope="module")
def world(tmp_path_factory, data_dir):
    """A finished 5-step run (checkpoints at steps 2 and 4) and the bad files of the table."""
    root = tmp_path_factory.mktemp("bad_inputs")
    model = make_tiny_model(root / "tiny")
    train_file = write_train_file(root / "train.txt", data_dir, lines=120)
    run = root / "run"
    flags = [
        "--model", str(model), "--train-file", str(train_file), "--batch-size", "8", "--max-steps", "5",
        "--save-steps", "2", "--save-total-limit", "2", "--eval-steps", "0", "--final-evaluation", "false",
        "--report-to", "csv", "--max-length", "16", "--eval-max-length", "16", "--learning-rate", "1e-3",
    ]  # fmt: skip
    assert main(["train", *flags, "--output-dir", str(run)]) == 0
    files = {
        "latin1": b"caf\xe9 au lait\n" * 20,
        "binary": b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR",
        "empty": b"",
        "few": b"one\ntwo\nthree\n",
        "bad.yaml": b"batch_size: [16\nquantile: 0.3\n",
        "bad.json": b'{"batch_size": 16,}',
        "list.yaml": b"- batch_size\n- 16\n",
        "unknown.yaml": b"batch_sise: 16\n",
        "sentences.txt": "\n".join(f"sentence number {i}" for i in range(20)).encode(),
    }
    for name, content in files.items():
        (root / name).write_bytes(content)
    (root / "folder").mkdir()
    (root / "not-a-model").mkdir()
    (root / "empty-data").mkdir()
    return {
        "root": root,
        "run": run,
        "model": model,
        "train_file": train_file,
        "flags": flags,
        "digest": tree_digest(run),
        "history": json.loads((run / "results.json").read_text())["history"],
    }


@dataclass
class Case:
    name: str
    argv: list  # "{root}", "{run}", "{model}", "{train}" are filled in; or a callable(world) for API cases
    expect: str  # the one line must contain this
    code: int | type = 1  # the exit code, or the exception class for API cases
    env: dict = field(default_factory=dict)  # variables to set (None: unset)
    base: bool = True  # prepend the run's flags (train cases)
    absent: str | None = None  # a path that must not exist afterwards


def T(name, *flags, expect, code=1, **kwargs):  # noqa: N802 - a table row
    return Case(name, ["train", *flags], expect, code, **kwargs)


ONLINE_WITHOUT_NETWORK = {
    **dict.fromkeys(OFFLINE_VARIABLES),
    **dict.fromkeys(("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy"), "http://127.0.0.1:9"),
}
SENTENCES = "{root}/sentences.txt"

CASES = [
    # --- train: the earlier run survives every failed --overwrite start
    T("overwrite-missing-model-path", "--model", "/typo/model", "--output-dir", "{run}", "--overwrite",
      expect="model folder /typo/model not found"),
    T("overwrite-unknown-hub-model", "--model", "no-such-org/no-such-model", "--output-dir", "{run}", "--overwrite",
      expect="cannot load the model 'no-such-org/no-such-model'"),
    T("overwrite-latin1-train-file", "--train-file", "{root}/latin1", "--output-dir", "{run}", "--overwrite",
      expect="is not UTF-8 text: invalid byte 0xe9 at byte offset 3"),
    T("overwrite-binary-train-file", "--train-file", "{root}/binary", "--output-dir", "{run}", "--overwrite",
      expect="binary file (NUL byte at byte offset 8)"),
    T("overwrite-missing-train-file", "--train-file", "{root}/nope.txt", "--output-dir", "{run}", "--overwrite",
      expect="training file not found"),
    T("overwrite-empty-train-file", "--train-file", "{root}/empty", "--output-dir", "{run}", "--overwrite",
      expect="empty is empty"),
    T("overwrite-too-few-sentences", "--train-file", "{root}/few", "--output-dir", "{run}", "--overwrite",
      expect="fewer than one batch of 8"),
    T("overwrite-max-length-beyond-model", "--max-length", "1000", "--output-dir", "{run}", "--overwrite",
      expect="max_length 1000 exceeds the 128 positions"),
    T("overwrite-model-is-a-file", "--model", "{root}/sentences.txt", "--output-dir", "{run}", "--overwrite",
      expect="sentences.txt is a file"),
    T("overwrite-bad-yaml-config", "--config", "{root}/bad.yaml", "--output-dir", "{run}", "--overwrite",
      expect="bad.yaml is not valid YAML"),
    T("no-overwrite-flag", "--output-dir", "{run}", expect="already holds a simcse-weince run"),
    # --- train: config files
    T("bad-json-config", "--config", "{root}/bad.json", "--output-dir", "{root}/new", expect="is not valid JSON"),
    T("missing-config", "--config", "{root}/nope.yaml", "--output-dir", "{root}/new", expect="nope.yaml not found"),
    T("list-config", "--config", "{root}/list.yaml", "--output-dir", "{root}/new", expect="must hold a mapping"),
    T("unknown-key-config", "--config", "{root}/unknown.yaml", "--output-dir", "{root}/new",
      expect="unknown config setting 'batch_sise'"),
    # --- train: range checks (and no training_config.yaml stub left behind)
    T("bad-lr-scheduler", "--lr-scheduler", "warmup_cosine", "--output-dir", "{root}/new",
      expect="unknown lr_scheduler 'warmup_cosine'", absent="{root}/new"),
    T("save-total-limit-0", "--save-total-limit", "0", "--output-dir", "{root}/new",
      expect="save_total_limit must be >= 1", absent="{root}/new"),
    T("batch-size-1", "--batch-size", "1", "--output-dir", "{root}/new", expect="batch_size must be >= 2"),
    T("batch-size-text", "--batch-size", "abc", "--output-dir", "{root}/new", expect="batch_size must be an integer"),
    T("learning-rate-nan", "--learning-rate", "nan", "--output-dir", "{root}/new",
      expect="learning_rate must be a finite number"),
    T("temperature-negative", "--temperature", "-1", "--output-dir", "{root}/new", expect="temperature must be > 0"),
    T("quantile-out-of-range", "--quantile", "1.5", "--output-dir", "{root}/new", expect="quantile must be in [0, 1]"),
    T("quantile-text", "--weince.quantile", "high", "--output-dir", "{root}/new", expect="quantile must be a number"),
    T("beta-negative", "--beta", "-1", "--output-dir", "{root}/new", expect="beta must be > 0"),
    T("mixed-precision-fp8", "--mixed-precision", "fp8", "--output-dir", "{root}/new",
      expect="mixed_precision must be no, fp16 or bf16"),
    T("unknown-final-task", "--final-tasks", "sts99", "--output-dir", "{root}/new", expect="unknown final_tasks"),
    T("dropout-1.5", "--dropout", "1.5", "--output-dir", "{root}/new", expect="dropout must be in [0, 1)"),
    T("eval-max-length-0", "--eval-max-length", "0", "--output-dir", "{root}/new", expect="eval_max_length must be"),
    T("report-to-wandb", "--report-to", "wandb", "--output-dir", "{root}/new", expect="unknown report_to"),
    T("max-steps-0", "--max-steps", "0", "--output-dir", "{root}/new", expect="max_steps must be >= 1"),
    T("warmup-negative", "--warmup-steps", "-1", "--output-dir", "{root}/new", expect="warmup_steps must be >= 0"),
    T("output-dir-is-a-file", "--output-dir", SENTENCES, expect="sentences.txt is a file"),
    T("resume-without-run", "--output-dir", "{root}/new", "--resume", expect="holds no simcse-weince run"),
    T("resume-missing-checkpoint", "--output-dir", "{run}", "--resume", "{root}/nope",
      expect="checkpoint folder {root}/nope not found"),
    T("unknown-preset", "--preset", "huge", expect="invalid choice: 'huge'", code=2, base=False),
    T("unknown-flag", "--batchsize", "8", expect="unrecognized arguments: --batchsize", code=2, base=False),
    # --- evaluate
    Case("evaluate-max-length-negative", ["evaluate", "{run}", "--max-length", "-5"],
         "--max-length must be a positive number of tokens, got -5"),
    Case("evaluate-missing-model-path", ["evaluate", "/typo/model"], "model folder /typo/model not found"),
    Case("evaluate-unknown-task", ["evaluate", "{run}", "--tasks", "sts99"], "sts99"),
    Case("evaluate-batch-size-0", ["evaluate", "{run}", "--batch-size", "0"], "--batch-size must be positive"),
    Case("evaluate-output-is-a-folder", ["evaluate", "{run}", "--output", "{root}/folder"], "is a folder"),
    Case("evaluate-unknown-split", ["evaluate", "{run}", "--split", "train"], "invalid choice: 'train'", 2),
    # --- diagnose
    Case("diagnose-binary-data", ["diagnose", "{run}", "--data", "{root}/binary"], "binary file (NUL byte"),
    Case("diagnose-latin1-data", ["diagnose", "{run}", "--data", "{root}/latin1"],
         "invalid byte 0xe9 at byte offset 3"),
    Case("diagnose-missing-data", ["diagnose", "{run}", "--data", "{root}/nope.txt"], "--data file not found"),
    Case("diagnose-quantile-1.5", ["diagnose", "{run}", "--data", SENTENCES, "--quantile", "1.5"],
         "--quantile must be in (0, 1)"),
    Case("diagnose-temperature-0", ["diagnose", "{run}", "--data", SENTENCES, "--temperature", "0"],
         "--temperature must be > 0"),
    Case("diagnose-batch-size-1", ["diagnose", "{run}", "--data", SENTENCES, "--batch-size", "1"],
         "--batch-size must be at least 2"),
    Case("diagnose-missing-model-path", ["diagnose", "/typo/model", "--data", SENTENCES],
         "model folder /typo/model not found"),
    Case("diagnose-output-dir-is-a-file", ["diagnose", "{run}", "--data", SENTENCES, "--output-dir", SENTENCES],
         "--output-dir {root}/sentences.txt is a file"),
    # --- vision
    Case("vision-cifar10-online-without-network",
         ["vision", "train", "--dataset", "cifar10", "--data-dir", "{root}/empty-data", "--output-dir", "{root}/v"],
         "cifar10 is not under", env=ONLINE_WITHOUT_NETWORK, absent="{root}/v"),
    Case("vision-cifar10-no-download",
         ["vision", "train", "--dataset", "cifar10", "--data-dir", "{root}/empty-data", "--no-download",
          "--output-dir", "{root}/v"], "downloads are off", absent="{root}/v"),
    Case("vision-batch-size-1", ["vision", "train", "--batch-size", "1", "--output-dir", "{root}/v"],
         "batch_size must be >= 2", absent="{root}/v"),
    Case("vision-epochs-0", ["vision", "train", "--epochs", "0", "--output-dir", "{root}/v"], "epochs must be >= 1"),
    Case("vision-temperature-0", ["vision", "train", "--temperature", "0", "--output-dir", "{root}/v"],
         "temperature and learning_rate must be > 0"),
    Case("vision-train-size-0", ["vision", "train", "--train-size", "0", "--output-dir", "{root}/v"],
         "train_size must be >= 1"),
    Case("vision-beta-text", ["vision", "train", "--beta", "big", "--output-dir", "{root}/v"], "--beta", 2),
    Case("vision-eval-missing-checkpoint", ["vision", "eval", "{root}/nope"], "no checkpoint at"),
    Case("vision-eval-probe-epochs-0", ["vision", "eval", "{run}", "--probe-epochs", "0"],
         "--probe-epochs must be >= 1"),
    # --- push
    Case("push-missing-folder", ["push", "{root}/nope", "me/model"], "model folder {root}/nope not found"),
    Case("push-not-a-model", ["push", "{root}/not-a-model", "me/model"], "not a trained model folder"),
    Case("push-bad-repo-id", ["push", "{run}", "me/my model!"], "invalid repository id 'me/my model!'"),
    Case("push-offline", ["push", "{run}", "me/model"], "the Hugging Face Hub is offline",
         env={"HF_HUB_OFFLINE": "1"}),
    Case("push-no-token", ["push", "{run}", "me/model"], "no Hugging Face token",
         env={**dict.fromkeys(OFFLINE_VARIABLES), "HF_TOKEN": None, "HF_HOME": "{root}/hf-home"}),
]  # fmt: skip


def _fill(value: str, world) -> str:
    return value.format(root=world["root"], run=world["run"], model=world["model"], train=world["train_file"])


@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
def test_cli_bad_input(case, world, capsys, monkeypatch):
    for name, value in case.env.items():
        if value is None:
            monkeypatch.delenv(name, raising=False)
        else:
            monkeypatch.setenv(name, _fill(value, world))
    argv = [_fill(arg, world) for arg in case.argv]
    if case.argv[0] == "train" and case.base:
        argv = ["train", *world["flags"], *argv[1:]]
    capsys.readouterr()
    try:
        code = main(argv)
    except SystemExit as exit_:  # argparse: usage errors
        code = exit_.code
    err = capsys.readouterr().err
    assert code == case.code, err[-3000:]
    assert "Traceback" not in err
    error_lines = [line for line in err.splitlines() if "error:" in line]
    assert len(error_lines) == 1, err[-3000:]
    assert _fill(case.expect, world) in error_lines[0], error_lines[0]
    assert tree_digest(world["run"]) == world["digest"], "the earlier run changed"
    assert not any(world["root"].glob(".*previous-run")), "an earlier run was left aside"
    if case.absent:
        assert not Path(_fill(case.absent, world)).exists(), "a failed start left files behind"


# ------------------------------------------------------------------------------------------ the Python API


def _embeddings():
    generator = torch.Generator().manual_seed(0)
    return torch.randn(8, 16, generator=generator), torch.randn(8, 16, generator=generator)


def _weince(temperature=0.05, **kwargs):
    from simcse_weince.weince import weince_loss

    return weince_loss(*_embeddings(), temperature=temperature, **kwargs)


def _train_in_run(world, **overrides):
    settings = dict(
        model=str(world["model"]), train_file=str(world["train_file"]), batch_size=8, max_steps=2, eval_steps=0,
        final_evaluation=False, report_to=["csv"], output_dir=str(world["run"]),
    )  # fmt: skip
    config = preset("paper", **{**settings, **overrides})
    return train(config, overwrite=True)


def _weince_config(**kwargs):
    from simcse_weince.weince import WeinceConfig

    return WeinceConfig(**kwargs)


def _vision_config(**kwargs):
    from simcse_weince.vision.train import VisionTrainConfig

    return VisionTrainConfig(**kwargs)


API_CASES = [
    ("weince-mixing-weight-2", lambda w: _weince(mixing_weight=2.0), ValueError, "mixing_weight must be in [0, 1]"),
    ("weince-mixing-weight-minus-1", lambda w: _weince(mixing_weight=-1.0), ValueError, "got -1.0"),
    ("weince-mixing-weight-nan", lambda w: _weince(mixing_weight=math.nan), ValueError, "got nan"),
    ("weince-temperature-0", lambda w: _weince(temperature=0.0), ValueError, "temperature must be > 0, got 0.0"),
    ("weince-config-quantile-text", lambda w: _weince_config(quantile="0.3"), TypeError,
     "WeinceConfig.quantile must be a number, got '0.3'"),
    ("weince-config-tail-points-float", lambda w: _weince_config(min_tail_points=2.5), TypeError,
     "WeinceConfig.min_tail_points must be an integer"),
    ("weince-config-kappa-nan", lambda w: _weince_config(kappa_rho=math.nan), ValueError,
     "WeinceConfig.kappa_rho must be a finite number"),
    ("train-config-batch-size-text", lambda w: TrainConfig(batch_size="32"), TypeError,
     "TrainConfig.batch_size must be an integer, got '32'"),
    ("train-config-file-batch-size-none", lambda w: preset("paper", batch_size=None), ValueError,
     "batch_size must be an integer, got None"),
    ("train-config-save-total-limit-0", lambda w: preset("paper", save_total_limit=0), ValueError,
     "save_total_limit must be >= 1"),
    ("train-config-lr-scheduler", lambda w: preset("paper", lr_scheduler="cosine_with_min_lr"), ValueError,
     "unknown lr_scheduler 'cosine_with_min_lr'"),
    ("train-missing-model-overwrite", lambda w: _train_in_run(w, model="/typo/model"), FileNotFoundError,
     "model folder /typo/model not found"),
    ("train-model-is-a-file", lambda w: _train_in_run(w, model=str(w["root"] / "sentences.txt")),
     ValueError, "is a file"),
    ("vision-config-epochs-text", lambda w: _vision_config(epochs="10"), TypeError,
     "VisionTrainConfig.epochs must be an integer"),
    ("load-sentences-latin1", lambda w: __import__("simcse_weince.train", fromlist=["x"]).load_sentences(
        w["root"] / "latin1"), ValueError, "invalid byte 0xe9 at byte offset 3"),
    ("read-sentences-binary", lambda w: __import__("simcse_weince.diagnostics", fromlist=["x"]).read_sentences(
        w["root"] / "binary"), ValueError, "binary file"),
    ("read-config-bad-yaml", lambda w: __import__("simcse_weince.train", fromlist=["x"]).read_config_file(
        w["root"] / "bad.yaml"), ValueError, "is not valid YAML"),
    ("as-encoder-max-length-negative", lambda w: __import__(
        "simcse_weince.evaluation.encoders", fromlist=["x"]).as_encoder(lambda texts: texts, max_length=-5),
     ValueError, "max_length must be a positive integer"),
]  # fmt: skip


@pytest.mark.parametrize("case", API_CASES, ids=[case[0] for case in API_CASES])
def test_api_bad_input(case, world):
    _, call, exception, expect = case
    with pytest.raises(exception) as raised:
        call(world)
    message = str(raised.value)
    assert expect in message and "\n" not in message, message
    assert tree_digest(world["run"]) == world["digest"]


def test_the_table_has_at_least_40_cases():
    assert len(CASES) + len(API_CASES) >= 40
