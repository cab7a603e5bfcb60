"""WEINCE's per-step statistics in the trainer's logs: :class:`WeinceStatisticsCallback`."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn
from transformers import TrainerCallback

from simcse_weince.losses._columns import ColumnsLoss
from simcse_weince.weince.loss import STATISTIC_KEYS

logger = logging.getLogger(__name__)

KEY_PREFIX = "weince_"
LOSS_KEY_SUFFIX = "_loss"  # the trainer's loss key of a log: loss, eval_loss, eval_{dataset}_loss


def find_columns_losses(loss: nn.Module | Mapping[str, nn.Module]) -> dict[str, ColumnsLoss]:
    """Every loss of this package in ``loss`` (a loss, a wrapper such as ``MatryoshkaLoss`` or a cached loss around
    one, or a dict of them by dataset name), keyed by the name its statistics are logged under: ``""`` for a single
    loss, the dataset name for a dict (with ``_0``, ``_1``, ... when one entry holds several). A loss object shared by
    several datasets is found under each of their names."""
    entries = loss.items() if isinstance(loss, Mapping) else [("", loss)]
    found: dict[str, ColumnsLoss] = {}
    for name, entry in entries:
        if not isinstance(entry, nn.Module):
            raise TypeError(f"expected a loss module, got {type(entry).__name__} for {name or 'the loss'!r}")
        # a wrapper holds ours as a submodule (MatryoshkaLoss.loss, CachedColumnsLoss.loss)
        members = [module for module in entry.modules() if isinstance(module, ColumnsLoss)]
        for index, module in enumerate(members):
            found[name if len(members) == 1 else f"{name}_{index}".lstrip("_")] = module
    return found


class WeinceStatisticsCallback(TrainerCallback):
    def __init__(self, loss: nn.Module | Mapping[str, nn.Module], *, prefix: str = KEY_PREFIX) -> None:
        """Adds WEINCE's per-step statistics to the trainer's logs: mean λ, the share of anchors with λ > 0.5, ρ_0,
        mean ΔAIC and mean β̂, each averaged over the loss evaluations since the last log, under
        ``weince_lambda_mean``, ``weince_lambda_above_half``, ``weince_rho0``, ``weince_delta_aic_mean`` and
        ``weince_beta_hat_mean``. They reach ``trainer.state.log_history``, the progress bar and every tracker set
        with ``report_to`` (TensorBoard, W&B, ...: ``train/weince_lambda_mean``), beside ``loss``.

        The loss is not touched (a loss returning a dict would have its entries summed into the loss by
        sentence-transformers): after every forward and backward pass the callback keeps the statistics the loss
        computed anyway (detached tensors, no device synchronisation), and reads them once per log.

        Attach it with :meth:`attach`, which finds the losses in the trainer and puts the callback first, so that
        the trackers see the statistics: a callback passed in ``callbacks=[...]`` runs after the ``report_to``
        integrations, which would log without them (``log_history`` and the console still get them).

        Args:
            loss: a loss of this package (:class:`~simcse_weince.WeinceLoss`, :class:`~simcse_weince.InfoNCELoss`
                with ``track_statistics=True``, their cached versions), a sentence-transformers wrapper around one
                (``MatryoshkaLoss``, ``AdaptiveLayerLoss``, ...), or a dict of losses by dataset name (the trainer's
                ``loss``). Losses of other kinds in it are skipped.
            prefix: the start of every logged key. A dict of losses logs each dataset's statistics under
                ``{dataset}_{prefix}{statistic}``.

        Every optimizer step contributes each of its training micro-batches (``gradient_accumulation_steps > 1``);
        a wrapper that calls the loss several times per batch (``MatryoshkaLoss``: once per dimension) contributes
        the last call of each batch. A batch counts as training when the model was in training mode
        (``model.training``, the signal sentence-transformers' own loss logging uses); a log holds a dataset's keys
        only when that dataset's loss trained since the last log. Evaluation batches (``eval_dataset``) are averaged
        apart and added to the evaluation's log under its keys, as sentence-transformers names evaluation metrics:
        ``eval_weince_lambda_mean``, or ``eval_{dataset}_weince_lambda_mean`` for a dict of evaluation datasets. A
        loss object shared by several datasets holds one set of statistics, logged under each dataset's name. A
        batch of one anchor reports no statistics (it trains at λ = 0) and does not count. In distributed training
        each process averages its own steps and the main process logs; with ``gather_across_devices=True`` every
        process's statistics are those of the global batch.

        Example:
            ::

                from datasets import Dataset
                from sentence_transformers import (
                    SentenceTransformer, SentenceTransformerTrainer, SentenceTransformerTrainingArguments,
                )
                from simcse_weince import WeinceLoss, WeinceStatisticsCallback

                model = SentenceTransformer("sentence-transformers/all-MiniLM-L6-v2")
                train_dataset = Dataset.from_dict({"text": ["A man is playing a guitar.", "The cat sleeps.",
                                                            "Stocks fell on Monday.", "She reads in the park."]})
                args = SentenceTransformerTrainingArguments("out", logging_steps=1, report_to="tensorboard")
                trainer = SentenceTransformerTrainer(model=model, args=args, train_dataset=train_dataset,
                                                     loss=WeinceLoss(model))
                WeinceStatisticsCallback.attach(trainer)
                trainer.train()
                print(trainer.state.log_history[0]["weince_lambda_mean"])
        """
        self.prefix = prefix
        self.losses = find_columns_losses(loss)
        if not self.losses:
            logger.warning("WeinceStatisticsCallback found no loss of simcse_weince in %s: nothing will be logged",
                           type(loss).__name__)  # fmt: skip
        # per loss object (id) and mode ("train", "eval"): the sum of the statistics since the last log of that mode
        # (a device tensor) and how many batches it holds
        self._sums: dict[tuple[int, str], torch.Tensor] = {}
        self._counts: dict[tuple[int, str], int] = {}
        # the last result read from each loss object, so that a hook firing twice on one result does not count it twice
        self._read: dict[int, Any] = {}
        self._history_warned = False

    @classmethod
    def attach(cls, trainer, **kwargs) -> WeinceStatisticsCallback:
        """A callback for ``trainer``'s loss(es), added to ``trainer`` first among its callbacks (before the
        ``report_to`` integrations, which then log the statistics too); returns it. ``kwargs``: as for the
        constructor."""
        callback = cls(trainer.loss, **kwargs)
        callbacks = getattr(getattr(trainer, "callback_handler", None), "callbacks", None)
        if isinstance(callbacks, list):
            callbacks.insert(0, callback)
        else:
            # a trainer without transformers' CallbackHandler list: the public route, after the trackers
            trainer.add_callback(callback)
            logger.warning("could not put WeinceStatisticsCallback before the trainer's other callbacks: "
                           "trackers set with report_to may log without WEINCE's statistics")  # fmt: skip
        return callback

    def _key(self, name: str, statistic: str) -> str:
        return f"{name}_{self.prefix}{statistic}" if name else f"{self.prefix}{statistic}"

    def _collect(self) -> None:
        """Add each loss's latest statistics (if new) to the sums of the mode it ran in, on the device, without
        synchronising."""
        for loss in {id(loss): loss for loss in self.losses.values()}.values():
            last = loss.last_batch  # the EmbeddingsLoss of the loss's last call
            if last is None or last is self._read.get(id(loss)) or not last.statistics:
                continue
            self._read[id(loss)] = last
            slot = (id(loss), "train" if loss.last_batch_training else "eval")
            values = torch.stack([last.statistics[key].detach() for key in STATISTIC_KEYS])
            self._sums[slot] = values if slot not in self._sums else self._sums[slot] + values
            self._counts[slot] = self._counts.get(slot, 0) + 1

    def _averages(self, mode: str) -> dict[int, list[float]]:
        """Each loss object's mean statistics of ``mode`` since the last log of that mode (and forget them)."""
        slots = [slot for slot in self._sums if slot[1] == mode]
        # the one device synchronisation per log
        averages = {slot[0]: (self._sums.pop(slot).cpu().double() / self._counts.pop(slot)).tolist() for slot in slots}
        return averages

    def on_substep_end(self, args, state, control, **kwargs):
        self._collect()

    def on_step_end(self, args, state, control, **kwargs):
        self._collect()

    def on_prediction_step(self, args, state, control, **kwargs):
        self._collect()

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs is None:
            return
        self._collect()
        if "loss" in logs:  # a training log
            averages = self._averages("train")
            keys = {self._key(name, key): value for name, loss in self.losses.items() if id(loss) in averages
                    for key, value in zip(STATISTIC_KEYS, averages[id(loss)])}  # fmt: skip
        else:
            eval_prefix = evaluation_prefix(logs)
            if eval_prefix is None:  # the end-of-training summary, an evaluator's own log, ...
                return
            averages = self._averages("eval")
            names = [name for name, loss in self.losses.items() if id(loss) in averages]
            keys = {}
            for name in names:  # the losses that evaluated this dataset; one of them is logged under the prefix
                key_prefix = eval_prefix if len(averages) == 1 else f"{eval_prefix}_{name}".rstrip("_")
                keys.update({f"{key_prefix}_{self.prefix}{key}": value
                             for key, value in zip(STATISTIC_KEYS, averages[id(self.losses[name])])})  # fmt: skip
        if not keys:
            return
        record = state.log_history[-1] if state.log_history else None
        # Trainer.log appends a copy of logs to log_history before the callbacks run: add the averages to that
        # record too, once it is recognised as this log's
        is_this_log = (isinstance(record, dict) and record.get("step") == state.global_step
                       and all(record.get(key) is value for key, value in logs.items()))  # fmt: skip
        logs.update(keys)
        if is_this_log:
            record.update(keys)
        elif not self._history_warned:
            self._history_warned = True
            logger.warning("the last entry of trainer.state.log_history is not this log's: WEINCE's statistics "
                           "reach the trackers and the console but not log_history")  # fmt: skip


def evaluation_prefix(logs: Mapping[str, Any]) -> str | None:
    """The prefix of an evaluation's log (``eval``, or ``eval_{dataset}`` for one of several evaluation datasets),
    read from its loss key as the trainer names it; None for a log without an evaluation loss."""
    prefixes = [
        key.removesuffix(LOSS_KEY_SUFFIX) for key in logs if key.startswith("eval") and key.endswith(LOSS_KEY_SUFFIX)
    ]
    return min(prefixes, key=len) if prefixes else None
