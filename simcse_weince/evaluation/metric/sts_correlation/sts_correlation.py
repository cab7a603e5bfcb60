"""STS correlation: cosine-vs-gold Spearman / Pearson x100 with SentEval's subset aggregations, as an 🤗 evaluate
metric module (loads offline from the installed package).

Example::

    import evaluate
    from simcse_weince.evaluation import METRIC_PATH

    sts = evaluate.load(METRIC_PATH)
    sts.compute(predictions=[0.9, 0.1, 0.5, 0.4], references=[5.0, 0.0, 3.0, 2.0],
                subsets=["a", "a", "b", "b"], aggregation="all")
    # {'spearman': 80.0, 'pearson': ..., 'n': 4, 'subsets': {...}, 'aggregation': 'all'}
"""

import datasets
import evaluate

from simcse_weince.evaluation.scoring import AGGREGATIONS, sts_correlations

_DESCRIPTION = """Spearman and Pearson correlation (x100) between predicted similarities and gold scores, for
semantic textual similarity. With `subsets`, SentEval's aggregations: `all` (one correlation over every pair,
SimCSE's reported setting), `mean` (average of per-subset correlations), `wmean` (weighted by subset size)."""

_KWARGS_DESCRIPTION = """
Args:
    predictions (list of float): predicted similarity per pair (e.g. cosine of the two embeddings).
    references (list of float): gold similarity per pair (e.g. 0-5).
    subsets (list of str, optional): subset name per pair (e.g. 'MSRpar'); default: a single subset.
    aggregation (str, optional): 'all' (default), 'mean' or 'wmean'.
Returns:
    spearman, pearson: the aggregated correlations x100; n: number of pairs;
    subsets: {name: {'spearman', 'pearson', 'n'}} with correlations x100; aggregation: the one used.
"""

_CITATION = """@inproceedings{conneau2018senteval, title={SentEval: An Evaluation Toolkit for Universal Sentence
Representations}, author={Conneau, Alexis and Kiela, Douwe}, booktitle={LREC}, year={2018}}
@inproceedings{gao2021simcse, title={SimCSE: Simple Contrastive Learning of Sentence Embeddings},
author={Gao, Tianyu and Yao, Xingcheng and Chen, Danqi}, booktitle={EMNLP}, year={2021}}"""


@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _KWARGS_DESCRIPTION)
class StsCorrelation(evaluate.Metric):
    def _info(self):
        return evaluate.MetricInfo(
            description=_DESCRIPTION,
            citation=_CITATION,
            inputs_description=_KWARGS_DESCRIPTION,
            # float64: casting similarities to float32 could create rank ties that the float64 scores lack
            features=datasets.Features(
                {"predictions": datasets.Value("float64"), "references": datasets.Value("float64")}
            ),
            reference_urls=["https://github.com/princeton-nlp/SimCSE", "https://github.com/facebookresearch/SentEval"],
        )

    def _compute(self, predictions, references, subsets=None, aggregation="all"):
        if aggregation not in AGGREGATIONS:
            raise ValueError(f"unknown aggregation {aggregation!r}; choose from {', '.join(AGGREGATIONS)}")
        report = sts_correlations(predictions, references, subsets)
        return {
            "spearman": 100.0 * report["spearman"][aggregation],
            "pearson": 100.0 * report["pearson"][aggregation],
            "n": report["n"],
            "aggregation": aggregation,
            "subsets": {
                name: {"spearman": 100.0 * entry["spearman"], "pearson": 100.0 * entry["pearson"], "n": entry["n"]}
                for name, entry in report["subsets"].items()
            },
        }
