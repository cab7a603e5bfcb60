"""The main job at its real data scale (issue 57): batches tokenised as the loader draws them are the pre-tokenised
path's tensors bit for bit, and the dress rehearsal (``scripts/benchmarks/paper_rehearsal.py``: ``--preset paper``
on a generated corpus, 2 processes, killed after a checkpoint and resumed) prepares the data once per machine and
resumes with the uninterrupted run's losses."""

from __future__ import annotations

import sys

import pytest
import torch
from train_helpers import REPO_ROOT

from simcse_weince.text.data import PaddingCollator, TokenizingCollator, tokenize

sys.path.insert(0, str(REPO_ROOT / "scripts" / "benchmarks"))
import paper_rehearsal  # noqa: E402 - the script under test


@pytest.fixture(scope="module")
def tokenizer(minilm_path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(minilm_path)


@pytest.mark.parametrize("columns", [("text",), ("sent0", "sent1", "hard_neg")])
def test_batches_tokenised_when_drawn_equal_the_pretokenised_batches(tokenizer, data_dir, columns):
    from datasets import Dataset

    lines = (data_dir / "wiki1m_head.txt").read_text(encoding="utf-8").splitlines()[:96]
    lines[5] = " ".join(lines[5:9])  # longer than max_length: truncated the same way
    rows = Dataset.from_dict({name: lines[c * 32 : (c + 1) * 32] for c, name in enumerate(columns)})
    tokenizer.padding_side = "left"  # the collator pads on the right whatever the tokenizer's default
    try:
        tokenized = tokenize(rows, tokenizer, 24, columns)  # today's path: every row up front
        for indices in ([3, 0, 17, 5, 9], list(range(len(rows)))):
            expected = PaddingCollator(tokenizer.pad_token_id)([tokenized[i] for i in indices])
            actual = TokenizingCollator(tokenizer, 24, columns)([rows[i] for i in indices])
            assert set(actual) == set(expected) == {"input_ids", "token_type_ids", "attention_mask"}
            for name in expected:
                assert actual[name].dtype == expected[name].dtype and torch.equal(actual[name], expected[name])
            assert actual["input_ids"].shape[0] == len(indices) * len(columns)
            assert actual["attention_mask"][:, -1].any()  # padded to the batch's longest sentence, not further
    finally:
        tokenizer.padding_side = "right"


def _rehearse(tmp_path, data_dir, *flags: str) -> dict:
    args = paper_rehearsal.parse_args(
        ["--model-size", "tiny", "--processes", "2", "--data-dir", str(data_dir), "--work-dir", str(tmp_path),
         "--cpu", "--mixed-precision", "no", *flags]
    )  # fmt: skip
    report = paper_rehearsal.rehearse(args)
    lines = paper_rehearsal.report_lines(report)
    for label in ("time to first step (first run, cold cache)", "s/step", "sentences/s", "MFU", "peak RSS",
                  "resumed losses equal uninterrupted"):  # fmt: skip
        assert any(line.startswith(label + ":") for line in lines), label
    return report


def _check(report: dict, steps: int, checkpoint_step: int) -> None:
    # one process of the two read the corpus into the datasets cache; the other waited and reused it
    assert (report["preparations"], report["reuses"]) == (1, 1)
    assert report["resumed_from_step"] == checkpoint_step and report["resumed_steps"] == list(
        range(checkpoint_step + 1, steps + 1)
    )
    assert report["resumed_losses_equal"] is True and report["max_resumed_loss_difference"] == 0
    assert report["time_to_first_step_seconds"] > 0 and report["seconds_per_step"] > 0
    assert report["mfu"] is not None and 0 < report["mfu"] < 1  # a BERT's FLOPs are counted
    assert report["peak_rss_bytes"] > 100 * 2**20


def test_small_rehearsal_two_processes_prepare_once_and_resume_exactly(tmp_path, data_dir):
    # one loader worker per process: batches tokenised in another process, as device_check.sh runs it on a GPU.
    # 200,000 lines take the first process long enough to prepare that a second one not made to wait would
    # start preparing them too (3,000 lines were done before it looked)
    flags = ("--lines", "200000", "--steps", "4", "--checkpoint-step", "2", "--num-workers", "1")
    _check(_rehearse(tmp_path, data_dir, *flags), 4, 2)


@pytest.mark.slow
def test_rehearsal_at_one_million_lines_prepares_once_and_resumes_exactly(tmp_path, data_dir):
    report = _rehearse(tmp_path, data_dir, "--lines", "1000000", "--steps", "6", "--checkpoint-step", "3")
    _check(report, 6, 3)
