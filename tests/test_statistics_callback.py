"""WeinceStatisticsCallback: WEINCE's per-step statistics reach SentenceTransformerTrainer's log history and its
report_to trackers (TensorBoard here), averaged over the steps since the last log, and the loss is unchanged."""

from __future__ import annotations

import copy

import pytest
import torch

from simcse_weince import CachedWeinceLoss, InfoNCELoss, WeinceConfig, WeinceLoss, WeinceStatisticsCallback
from simcse_weince.weince.loss import STATISTIC_KEYS

BATCH = 8
CONFIG = WeinceConfig(quantile=0.3)  # a tail of a few points at batch 8
KEYS = [f"weince_{key}" for key in STATISTIC_KEYS]


@pytest.fixture(scope="module")
def tiny_sentence_transformer(tiny_model_one_layer, one_thread):
    """The module's model; a test that trains it trains a copy."""
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(tiny_model_one_layer, device="cpu")


def _train(model, loss, dataset, tmp_path, *, attach, logging_steps=1, accumulation=1, report_to="none"):
    """Train a few steps; return the trainer, the log entries with a training loss, and every micro-batch's
    statistics as the loss reports them (``last_statistics``), grouped by the log they belong to."""
    from sentence_transformers import SentenceTransformerTrainer, SentenceTransformerTrainingArguments
    from transformers import TrainerCallback

    per_log, pending = [], []

    class RecordEveryMicroBatch(TrainerCallback):
        def on_substep_end(self, args, state, control, **kwargs):
            pending.append(loss.last_statistics)

        def on_step_end(self, args, state, control, **kwargs):
            pending.append(loss.last_statistics)
            if state.global_step % logging_steps == 0:
                per_log.append(list(pending))
                pending.clear()

    args = SentenceTransformerTrainingArguments(
        output_dir=str(tmp_path), per_device_train_batch_size=BATCH, gradient_accumulation_steps=accumulation,
        num_train_epochs=1, learning_rate=1e-3, logging_steps=logging_steps, save_strategy="no", report_to=report_to,
        use_cpu=True, seed=0, dataloader_drop_last=True, disable_tqdm=True,
    )  # fmt: skip
    trainer = SentenceTransformerTrainer(
        model=model, args=args, train_dataset=dataset, loss=loss, callbacks=[RecordEveryMicroBatch()]
    )
    if attach:
        WeinceStatisticsCallback.attach(trainer)
    trainer.train()
    logged = [entry for entry in trainer.state.log_history if "loss" in entry]
    return trainer, logged, per_log


@pytest.mark.parametrize(("logging_steps", "accumulation"), [(1, 1), (2, 2)])
def test_log_history_holds_the_mean_of_the_steps_since_the_last_log(
    tiny_sentence_transformer, wiki_sentences, tmp_path, logging_steps, accumulation
):
    from datasets import Dataset

    model = copy.deepcopy(tiny_sentence_transformer)
    dataset = Dataset.from_dict({"anchor": wiki_sentences[:32], "positive": wiki_sentences[32:64]})
    loss = WeinceLoss(model, weince=CONFIG)
    _, logged, per_log = _train(model, loss, dataset, tmp_path, attach=True, logging_steps=logging_steps,
                                accumulation=accumulation)  # fmt: skip
    # 32 pairs, batch 8: 4 micro-batches; every log averages logging_steps x accumulation of them
    assert len(logged) == 4 // (logging_steps * accumulation) == len(per_log)
    for entry, micro_batches in zip(logged, per_log):
        assert len(micro_batches) == logging_steps * accumulation
        for key in STATISTIC_KEYS:
            expected = sum(statistics[key] for statistics in micro_batches) / len(micro_batches)
            assert entry[f"weince_{key}"] == pytest.approx(expected, rel=1e-6, abs=1e-9), key
    assert len({entry["weince_lambda_mean"] for entry in logged}) == len(logged)  # each log its own steps


def test_the_loss_and_training_are_unchanged_by_the_callback(tiny_sentence_transformer, wiki_sentences, tmp_path):
    from datasets import Dataset

    dataset = Dataset.from_dict({"text": wiki_sentences[:24]})  # one column: unsupervised SimCSE
    runs = []
    for attach in (False, True):
        model = copy.deepcopy(tiny_sentence_transformer)
        _, logged, _ = _train(model, WeinceLoss(model, weince=CONFIG), dataset, tmp_path / str(attach), attach=attach)
        runs.append((logged, torch.cat([p.detach().flatten() for p in model.parameters()])))
    (plain_logs, plain_weights), (logged, weights) = runs
    assert [entry["loss"] for entry in logged] == [entry["loss"] for entry in plain_logs]
    assert torch.equal(weights, plain_weights)
    assert all(set(KEYS) <= set(entry) for entry in logged)
    assert not any(set(KEYS) & set(entry) for entry in plain_logs)


def test_tensorboard_receives_the_statistics_of_a_cached_loss(
    tiny_sentence_transformer, wiki_sentences, tmp_path, monkeypatch
):
    pytest.importorskip("tensorboard")
    monkeypatch.setenv("TENSORBOARD_LOGGING_DIR", str(tmp_path / "runs"))
    from datasets import Dataset
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    model = copy.deepcopy(tiny_sentence_transformer)
    dataset = Dataset.from_dict({"anchor": wiki_sentences[:24], "positive": wiki_sentences[24:48]})
    loss = CachedWeinceLoss(model, weince=CONFIG, mini_batch_size=3)  # statistics live in the wrapped WeinceLoss
    trainer, logged, per_log = _train(model, loss, dataset, tmp_path, attach=True, report_to="tensorboard")
    assert len(logged) == 3
    events = EventAccumulator(str(tmp_path / "runs")).Reload()
    for key in KEYS:
        scalars = events.Scalars(f"train/{key}")
        assert [event.step for event in scalars] == [entry["step"] for entry in logged]
        # TensorBoard keeps float32
        assert [event.value for event in scalars] == pytest.approx([entry[key] for entry in logged], rel=1e-6)
    assert [entry["weince_lambda_mean"] for entry in logged] == pytest.approx(
        [steps[0]["lambda_mean"] for steps in per_log], rel=1e-6
    )


def test_losses_are_found_in_wrappers_and_dicts(tiny_sentence_transformer):
    from sentence_transformers.sentence_transformer.losses import MatryoshkaLoss, MultipleNegativesRankingLoss

    from simcse_weince.losses.weince_statistics_callback import find_columns_losses

    weince, infonce = (
        WeinceLoss(tiny_sentence_transformer),
        InfoNCELoss(tiny_sentence_transformer, track_statistics=True),
    )
    cached = CachedWeinceLoss(tiny_sentence_transformer, mini_batch_size=4)
    matryoshka = MatryoshkaLoss(tiny_sentence_transformer, weince, matryoshka_dims=[32, 16])
    assert find_columns_losses(matryoshka) == {"": weince}
    assert find_columns_losses(cached) == {"": cached.loss}
    found = find_columns_losses(
        {"nli": matryoshka, "wiki": infonce, "other": MultipleNegativesRankingLoss(tiny_sentence_transformer)}
    )
    assert found == {"nli": weince, "wiki": infonce}
    callback = WeinceStatisticsCallback({"nli": matryoshka, "wiki": infonce})
    assert callback._key("nli", "lambda_mean") == "nli_weince_lambda_mean"
    with pytest.raises(TypeError, match="expected a loss module"):
        find_columns_losses({"nli": "WeinceLoss"})
