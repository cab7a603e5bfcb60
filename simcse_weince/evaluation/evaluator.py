"""STS as a sentence-transformers evaluator, for ``SentenceTransformerTrainer(evaluator=...)`` and ``model.fit``.

Primary metric: raw STS-B dev cosine Spearman (``<name>_stsb_dev_spearman``), what SimCSE and the trainer select
checkpoints on. Optionally the SentEval suite (``tasks=``) is added to the metrics.

Metrics are returned on sentence-transformers' scale (correlations in [-1, 1], like its
``EmbeddingSimilarityEvaluator``); the library functions and the CLI print x100.

Example::

    from simcse_weince.evaluation import STSEvaluator

    evaluator = STSEvaluator()                                   # STS-B dev only (fast, model selection)
    metrics = evaluator(model)                                   # {"stsb_dev_spearman": 0.87, ...}
    full = STSEvaluator(tasks=("sts12", "sts13", "sts14", "sts15", "sts16", "stsb", "sickr"))
    trainer = SentenceTransformerTrainer(model=model, ..., evaluator=evaluator)
"""

from __future__ import annotations

import csv
import os
from collections.abc import Sequence
from pathlib import Path

try:  # sentence-transformers >= 6 moved the base class; older releases export it here
    from sentence_transformers.sentence_transformer.evaluation import SentenceEvaluator
except ImportError:  # pragma: no cover
    from sentence_transformers.evaluation import SentenceEvaluator

from simcse_weince.evaluation.data import SENTEVAL_STS_SUBSETS, load_sts_task, load_stsb
from simcse_weince.evaluation.encoders import as_encoder
from simcse_weince.evaluation.scoring import AGGREGATIONS, sts_correlations
from simcse_weince.evaluation.suite import encode_unique, pair_cosines


class SimCSESTSEvaluator(SentenceEvaluator):
    """Raw STS-B dev Spearman (primary metric), optionally with SentEval STS tasks.

    Args:
        tasks: SentEval tasks to add (e.g. the 7 of SimCSE's table); empty: STS-B dev only.
        split: split of the SentEval tasks (``"test"`` for STS12-16).
        stsb_split: split of the raw STS-B used for the primary metric.
        aggregation: STS12-16 subset aggregation (``"all"``, ``"mean"``, ``"wmean"``).
        data_dir: data folder (default ``$SIMCSE_WEINCE_DATA_DIR``).
        name: metric prefix (empty by default: metrics are ``stsb_dev_spearman``, ``sts12_spearman``, ...).
        pooler: SimCSE pooler to apply to the model's Hugging Face encoder instead of its own pooling.
        batch_size, show_progress_bar: encoding options.
        write_csv: append the metrics to ``<output_path>/sts_evaluation[_name]_results.csv``.

    The data are read once, at construction (a missing file fails before training starts).
    """

    def __init__(
        self,
        tasks: Sequence[str] = (),
        split: str = "test",
        stsb_split: str = "dev",
        aggregation: str = "all",
        data_dir: str | Path | None = None,
        name: str = "",
        pooler: str | None = None,
        batch_size: int = 64,
        show_progress_bar: bool = False,
        write_csv: bool = True,
    ):
        super().__init__()
        if aggregation not in AGGREGATIONS:
            raise ValueError(f"unknown aggregation {aggregation!r}; choose from {', '.join(AGGREGATIONS)}")
        self.aggregation = aggregation
        self.name = name
        self.pooler = pooler
        self.batch_size = batch_size
        self.show_progress_bar = show_progress_bar
        self.write_csv = write_csv
        self.stsb_split = stsb_split
        self.primary_data_key = f"stsb_{stsb_split}"
        self.datasets = {self.primary_data_key: load_stsb(stsb_split, data_dir=data_dir)}
        for task in tasks:
            data = load_sts_task(task, split=split, data_dir=data_dir)
            self.datasets[data.name] = data
        self.primary_metric = f"{self.primary_data_key}_spearman"
        self.greater_is_better = True
        self.csv_file = "sts_evaluation" + (f"_{name}" if name else "") + "_results.csv"

    def __call__(self, model, output_path: str | None = None, epoch: int = -1, steps: int = -1) -> dict[str, float]:
        encoder = as_encoder(
            model, pooler=self.pooler, batch_size=self.batch_size, show_progress_bar=self.show_progress_bar
        )
        sentences = [s for data in self.datasets.values() for s in (*data.sentences1, *data.sentences2)]
        index, embeddings = encode_unique(encoder, sentences)

        metrics: dict[str, float] = {}
        suite = []
        for key, data in self.datasets.items():
            report = sts_correlations(pair_cosines(index, embeddings, data), data.scores, data.subsets)
            chosen = self.aggregation if key in SENTEVAL_STS_SUBSETS else "all"
            metrics[f"{key}_spearman"] = report["spearman"][chosen]
            metrics[f"{key}_pearson"] = report["pearson"][chosen]
            if key != self.primary_data_key:
                suite.append(metrics[f"{key}_spearman"])
        if suite:
            metrics["sts_avg_spearman"] = sum(suite) / len(suite)

        if output_path is not None and self.write_csv:
            self._append_csv(output_path, epoch, steps, metrics)
        self.primary_metric = f"{self.primary_data_key}_spearman"
        metrics = self.prefix_name_to_metrics(metrics, self.name)
        if hasattr(model, "model_card_data"):
            self.store_metrics_in_model_card_data(model, metrics, epoch, steps)
        return metrics

    def _append_csv(self, output_path: str, epoch: int, steps: int, metrics: dict[str, float]) -> None:
        os.makedirs(output_path, exist_ok=True)
        path = os.path.join(output_path, self.csv_file)
        is_new = not os.path.isfile(path)
        with open(path, "a", newline="", encoding="utf-8") as file:
            writer = csv.writer(file)
            if is_new:
                writer.writerow(["epoch", "steps", *metrics])
            writer.writerow([epoch, steps, *metrics.values()])

    @property
    def description(self) -> str:
        return "Semantic Similarity (STS)"

    def get_config_dict(self):
        return {
            "aggregation": self.aggregation,
            "tasks": [key for key in self.datasets if key != self.primary_data_key],
        }


STSEvaluator = SimCSESTSEvaluator
