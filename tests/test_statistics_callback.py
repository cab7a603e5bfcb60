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


def _pairs(sentences):
    from datasets import Dataset

    return Dataset.from_dict({"anchor": sentences[: len(sentences) // 2], "positive": sentences[len(sentences) // 2 :]})


def test_two_datasets_evaluated_every_step_log_training_and_evaluation_apart(
    tiny_sentence_transformer, wiki_sentences, tmp_path
):
    """Round robin over a WEINCE dataset and an MNRL one, evaluation every step: a training log holds the WEINCE
    dataset's keys only at the steps it trained, with the mean of those training batches alone; each evaluation's
    log holds that evaluation's mean under sentence-transformers' evaluation names (``eval_{dataset}_...``), and
    only for the dataset whose loss is ours."""
    from datasets import DatasetDict
    from sentence_transformers import SentenceTransformerTrainer, SentenceTransformerTrainingArguments
    from sentence_transformers.sentence_transformer.losses import MultipleNegativesRankingLoss
    from transformers import TrainerCallback

    model = copy.deepcopy(tiny_sentence_transformer)
    weince = WeinceLoss(model, weince=CONFIG)
    calls = []  # every call of the WEINCE loss: (training?, statistics), as the loss reports them
    weince.register_forward_hook(lambda module, args, output: calls.append((model.training, module.last_statistics)))
    train = DatasetDict({"wiki": _pairs(wiki_sentences[:32]), "other": _pairs(wiki_sentences[32:64])})
    evaluation = DatasetDict({"wiki": _pairs(wiki_sentences[64:96]), "other": _pairs(wiki_sentences[96:128])})
    args = SentenceTransformerTrainingArguments(
        output_dir=str(tmp_path), per_device_train_batch_size=BATCH, per_device_eval_batch_size=BATCH,
        num_train_epochs=1, learning_rate=1e-3, logging_steps=1, eval_strategy="steps", eval_steps=1,
        save_strategy="no", report_to="none", use_cpu=True, seed=0, disable_tqdm=True,
        multi_dataset_batch_sampler="round_robin",
    )  # fmt: skip
    trainer = SentenceTransformerTrainer(
        model=model, args=args, train_dataset=train, eval_dataset=evaluation,
        loss={"wiki": weince, "other": MultipleNegativesRankingLoss(model)},
    )  # fmt: skip

    pending = []  # per log of the trainer: how many WEINCE calls came before it

    class Group(TrainerCallback):
        def on_log(self, args, state, control, logs=None, **kwargs):
            pending.append(len(calls))

    trainer.add_callback(Group())
    WeinceStatisticsCallback.attach(trainer)
    trainer.train()
    bounds = [0, *pending]
    entries = trainer.state.log_history[: len(pending)]
    trained_wiki = 0
    for entry, start, end in zip(entries, bounds, bounds[1:]):
        batches = [statistics for training, statistics in calls[start:end] if training == ("loss" in entry)]
        assert all(training == ("loss" in entry) for training, _ in calls[start:end]), "a log mixes both modes"
        key_prefix = "wiki_weince_" if "loss" in entry else "eval_wiki_weince_"
        ours = {key.removeprefix(key_prefix): value for key, value in entry.items() if key.startswith(key_prefix)}
        assert not [key for key in entry if "weince_" in key and not key.startswith(key_prefix)], entry
        if not batches:  # the other dataset trained, or evaluated: no WEINCE keys
            assert ours == {}, entry
            continue
        trained_wiki += "loss" in entry
        for key in STATISTIC_KEYS:
            assert ours[key] == pytest.approx(sum(batch[key] for batch in batches) / len(batches), rel=1e-6), key
    assert trained_wiki == 2  # 16 pairs at batch 8, round robin with the other dataset: steps 1 and 3
    assert sum("eval_wiki_weince_lambda_mean" in entry for entry in entries) == 4  # evaluated at every step
    assert not any(key.startswith("eval_other_weince") for entry in entries for key in entry)


def test_a_loss_shared_by_two_datasets_is_logged_under_each(tiny_sentence_transformer, wiki_sentences, tmp_path):
    from datasets import DatasetDict
    from sentence_transformers import SentenceTransformerTrainer, SentenceTransformerTrainingArguments

    from simcse_weince.losses.weince_statistics_callback import find_columns_losses

    model = copy.deepcopy(tiny_sentence_transformer)
    shared = WeinceLoss(model, weince=CONFIG)
    assert find_columns_losses({"a": shared, "b": shared}) == {"a": shared, "b": shared}
    train = DatasetDict({"a": _pairs(wiki_sentences[:16]), "b": _pairs(wiki_sentences[16:32])})
    args = SentenceTransformerTrainingArguments(
        output_dir=str(tmp_path), per_device_train_batch_size=BATCH, num_train_epochs=1, logging_steps=1,
        save_strategy="no", report_to="none", use_cpu=True, seed=0, disable_tqdm=True,
    )  # fmt: skip
    trainer = SentenceTransformerTrainer(model=model, args=args, train_dataset=train, loss={"a": shared, "b": shared})
    WeinceStatisticsCallback.attach(trainer)
    trainer.train()
    logged = [entry for entry in trainer.state.log_history if "loss" in entry]
    assert logged and all(entry["a_weince_lambda_mean"] == entry["b_weince_lambda_mean"] for entry in logged)
