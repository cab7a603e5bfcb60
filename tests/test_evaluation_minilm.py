"""STS evaluation with real encoders: the full 7-task suite on all-MiniLM-L6-v2 (once, through the CLI), equality
with sentence-transformers' EmbeddingSimilarityEvaluator on raw STS-B, and the evaluator inside a training run."""

from __future__ import annotations

import io
import json
from contextlib import redirect_stdout

import numpy as np
import pytest

from simcse_weince.evaluation import STSEvaluator, evaluate_sts, load_stsb, stsb_spearman

SEVEN_TASKS = ("sts12", "sts13", "sts14", "sts15", "sts16", "stsb", "sickr")


@pytest.fixture(scope="session")
def independent_minilm_table(minilm, data_dir):
    """The 7-task table computed independently of our encoder and scoring code: sentence-transformers' own
    `encode` (its batching, no de-duplication), float64 cosines in numpy, scipy's spearmanr over the concatenated
    subsets (SentEval's "all"). Only the (separately tested) loaders are shared."""
    from scipy.stats import spearmanr

    from simcse_weince.evaluation import load_sts_task

    datasets = {task: load_sts_task(task, data_dir=data_dir) for task in SEVEN_TASKS}
    sentences = sorted({s for d in datasets.values() for s in d.sentences1 + d.sentences2})
    vectors = minilm.encode(sentences, batch_size=128, convert_to_numpy=True).astype(np.float64)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    row = {sentence: i for i, sentence in enumerate(sentences)}
    table = {}
    for task, data in datasets.items():
        left = vectors[[row[s] for s in data.sentences1]]
        right = vectors[[row[s] for s in data.sentences2]]
        table[task] = 100 * spearmanr((left * right).sum(axis=1), data.scores).statistic
    return table


@pytest.fixture(scope="session")
def minilm_suite(minilm_path, data_dir, tmp_path_factory):
    """The one full 7-task run of the default test suite, through `simcse-weince evaluate`."""
    from simcse_weince.cli import main

    output = tmp_path_factory.mktemp("sts-minilm") / "minilm.json"
    printed = io.StringIO()
    with redirect_stdout(printed):
        code = main(
            [
                "evaluate",
                minilm_path,
                "--data-dir",
                str(data_dir),
                "--output",
                str(output),
                "--no-progress",
                "--device",
                "cpu",
            ]
        )
    return code, printed.getvalue(), json.loads(output.read_text())


def test_full_suite_on_minilm_matches_an_independent_computation(minilm_suite, independent_minilm_table):
    code, printed, results = minilm_suite
    assert code == 0
    assert set(SEVEN_TASKS) | {"avg", "details"} <= set(results)
    for task, expected in independent_minilm_table.items():
        # SimCSE's own tolerance for table agreement; batching/padding moves only the last float digits
        assert results[task] == pytest.approx(expected, abs=0.01), task
    assert results["avg"] == pytest.approx(np.mean([results[task] for task in SEVEN_TASKS]))
    header, _, row = printed.splitlines()[:3]
    assert header.split() == "| STS12 | STS13 | STS14 | STS15 | STS16 | STS-B | SICK-R | Avg. |".split()
    assert row.split("|")[1:-1][0].strip() == f"{results['sts12']:.2f}"
    details = results["details"]["tasks"]
    assert details["sts16"]["n"] == 1186 and len(details["sts16"]["subsets"]) == 5
    # the three aggregations are reported; SimCSE's "all" is the headline number
    assert results["sts12"] == details["sts12"]["spearman"]["all"] != details["sts12"]["spearman"]["mean"]


def test_raw_stsb_test_equals_sentence_transformers_evaluator(minilm, data_dir):
    from sentence_transformers.sentence_transformer.evaluation import EmbeddingSimilarityEvaluator

    data = load_stsb("test", data_dir)
    # sentence-transformers' STS-B stores score / 5; the scale does not matter to Spearman but we use theirs
    reference = EmbeddingSimilarityEvaluator(
        data.sentences1, data.sentences2, [s / 5 for s in data.scores], main_similarity="cosine", name="sts-test"
    )(minilm)
    ours = stsb_spearman(minilm, split="test", data_dir=data_dir, show_progress_bar=False)
    assert ours / 100 == pytest.approx(reference["sts-test_spearman_cosine"], abs=1e-6)


@pytest.fixture(scope="module")
def tiny_sentence_transformer(tiny_model):
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Pooling, Transformer

    return SentenceTransformer(modules=[Transformer(tiny_model), Pooling(32, "mean")], device="cpu")


def test_evaluator_direct_call_and_csv(tiny_sentence_transformer, data_dir, tmp_path):
    evaluator = STSEvaluator(tasks=["sts13", "sickr"], data_dir=data_dir, name="sts")
    metrics = evaluator(tiny_sentence_transformer, output_path=str(tmp_path), epoch=1, steps=3)
    assert evaluator.primary_metric == "sts_stsb_dev_spearman"
    assert evaluator.greater_is_better
    expected = stsb_spearman(tiny_sentence_transformer, split="dev", data_dir=data_dir, show_progress_bar=False)
    assert metrics["sts_stsb_dev_spearman"] * 100 == pytest.approx(expected, abs=1e-3)
    assert metrics["sts_sts_avg_spearman"] == pytest.approx(
        (metrics["sts_sts13_spearman"] + metrics["sts_sickr_spearman"]) / 2
    )
    assert all(-1.0 <= value <= 1.0 for value in metrics.values())
    rows = (tmp_path / "sts_evaluation_sts_results.csv").read_text().splitlines()
    assert rows[0].startswith("epoch,steps,stsb_dev_spearman") and rows[1].startswith("1,3,")
    suite = evaluate_sts(tiny_sentence_transformer, tasks=["sts13"], data_dir=data_dir, show_progress_bar=False)
    assert metrics["sts_sts13_spearman"] * 100 == pytest.approx(suite["sts13"], abs=0.5)  # batches differ


def test_evaluator_inside_sentence_transformer_trainer(tiny_sentence_transformer, data_dir, tmp_path):
    from datasets import Dataset
    from sentence_transformers import SentenceTransformerTrainer, SentenceTransformerTrainingArguments
    from sentence_transformers.sentence_transformer.losses import MultipleNegativesRankingLoss

    train = load_stsb("train", data_dir)
    dataset = Dataset.from_dict({"anchor": train.sentences1[:32], "positive": train.sentences2[:32]})
    args = SentenceTransformerTrainingArguments(
        output_dir=str(tmp_path),
        max_steps=2,
        per_device_train_batch_size=16,
        eval_strategy="steps",
        eval_steps=2,
        save_strategy="no",
        report_to=[],
        logging_steps=1,
        use_cpu=True,
        metric_for_best_model="eval_stsb_dev_spearman",
    )
    trainer = SentenceTransformerTrainer(
        model=tiny_sentence_transformer,
        args=args,
        train_dataset=dataset,
        loss=MultipleNegativesRankingLoss(tiny_sentence_transformer),
        evaluator=STSEvaluator(data_dir=data_dir),
    )
    trainer.train()
    logged = [entry for entry in trainer.state.log_history if "eval_stsb_dev_spearman" in entry]
    assert [entry["step"] for entry in logged] == [2]
    # the trainer logged what the evaluator gives on the final weights (evaluated at the last step)
    direct = STSEvaluator(data_dir=data_dir)(tiny_sentence_transformer)
    assert logged[-1]["eval_stsb_dev_spearman"] == pytest.approx(direct["stsb_dev_spearman"], abs=1e-6)
