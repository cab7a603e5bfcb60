"""STS evaluation: STS-B and the SentEval 7-task suite (SimCSE's table), as a library, a sentence-transformers
evaluator, an 🤗 evaluate metric and the ``simcse-weince evaluate`` command.

* data: :func:`load_stsb` (original STS Benchmark), :func:`load_sts_task` (SentEval layout), :class:`STSData`
* encoders: :func:`as_encoder` (SentenceTransformer, callable, path, (hf_model, tokenizer); SimCSE poolers)
* numbers: :func:`stsb_spearman` (raw STS-B, x100), :func:`evaluate_sts` (7 tasks + avg, x100),
  :func:`format_sts_table`
* training: :class:`STSEvaluator` (sentence-transformers ``SentenceEvaluator``)
* 🤗 evaluate: ``evaluate.load(METRIC_PATH)``

Names are imported lazily so that ``import simcse_weince.evaluation`` (and the CLI's ``--help``) stays light.
"""

from __future__ import annotations

from simcse_weince._lazy import lazy_exports

_EXPORTS = {
    "STSData": "data",
    "load_stsb": "data",
    "load_sts_task": "data",
    "download_senteval": "data",
    "STS_TASKS": "data",
    "correlations": "scoring",
    "sts_correlations": "scoring",
    "AGGREGATIONS": "scoring",
    "as_encoder": "encoders",
    "HFEncoder": "encoders",
    "SentenceTransformerEncoder": "encoders",
    "POOLERS": "encoders",  # simcse_weince.poolers.POOLERS
    "stsb_spearman": "suite",
    "evaluate_sts": "suite",
    "format_sts_table": "suite",
    "STSEvaluator": "evaluator",
    "SimCSESTSEvaluator": "evaluator",
    "METRIC_PATH": "metric",
}

__all__ = list(_EXPORTS)


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
