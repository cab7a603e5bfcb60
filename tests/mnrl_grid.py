"""The grid of sentence-transformers' ``MultipleNegativesRankingLoss`` options on which our losses at λ = 0 must equal
it (issue 53, item 3); shared by tests/test_mnrl_equivalence.py (one process) and tests/distributed_mnrl_check.py
(two processes). Not a test module.

Every valid combination of ``directions`` x ``partition_mode`` x ``hardness_mode`` (α > 0; ``None`` with α > 0 too,
which MNRL ignores) is compared, on each input shape, for :class:`InfoNCELoss` and for :class:`WeinceLoss` forced to
λ = 0 by a real config (the AIC gate at a margin no ΔAIC reaches: σ(-huge) = 0 exactly), plain against MNRL and
cached (mini-batches smaller than the batch) against CachedMNRL: the loss and every parameter gradient of a real
encoder.
"""

from __future__ import annotations

import itertools

import torch
from sentence_transformers.base.losses.merged_forward import embed_columns
from sentence_transformers.sentence_transformer.losses import (
    CachedMultipleNegativesRankingLoss,
    MultipleNegativesRankingLoss,
)

from simcse_weince import CachedInfoNCELoss, CachedWeinceLoss, InfoNCELoss, WeinceConfig, WeinceLoss

DIRECTIONS = ("query_to_doc", "query_to_query", "doc_to_query", "doc_to_doc")
DIRECTION_SETS = [
    ("query_to_doc", *extra) for size in range(4) for extra in itertools.combinations(DIRECTIONS[1:], size)
]
PARTITION_MODES = ("joint", "per_direction")
HARDNESS_MODES = (None, "in_batch_negatives", "hard_negatives", "all_negatives")
HARDNESS_STRENGTH = 5.0  # EmbeddingGemma's α; with hardness_mode=None it must be ignored, as MNRL does
SHAPES = {"pairs": 2, "triplets": 3, "3_negatives": 5}  # number of text columns
MINI_BATCH_SIZE = 4  # smaller than the batch and not dividing it
LAMBDA_ZERO = WeinceConfig(gate="aic", aic_margin=1e30)  # λ = σ(ΔAIC - 1e30) = 0 exactly: WEINCE's path at λ = 0


def mnrl_accepts(directions, partition_mode) -> bool:
    try:
        MultipleNegativesRankingLoss(torch.nn.Identity(), directions=directions, partition_mode=partition_mode)
    except ValueError:
        return False
    return True


def grid() -> list[dict]:
    """Every option combination MNRL accepts (hardness over every mode)."""
    return [
        {"directions": directions, "partition_mode": partition_mode, "hardness_mode": hardness_mode,
         "hardness_strength": HARDNESS_STRENGTH}
        for directions in DIRECTION_SETS
        for partition_mode in PARTITION_MODES
        if mnrl_accepts(directions, partition_mode)
        for hardness_mode in HARDNESS_MODES
    ]  # fmt: skip


# a cross-section of the grid for the default suite's cached and two-process runs (the full grid runs under -m slow):
# the default, the symmetric loss, GTE's four directions jointly, and each hardness mode
SAMPLE = [
    {"directions": ("query_to_doc",), "partition_mode": "joint", "hardness_mode": None, "hardness_strength": 0.0},
    {"directions": ("query_to_doc", "doc_to_query"), "partition_mode": "per_direction",
     "hardness_mode": "in_batch_negatives", "hardness_strength": HARDNESS_STRENGTH},
    {"directions": DIRECTIONS, "partition_mode": "joint", "hardness_mode": "hard_negatives",
     "hardness_strength": HARDNESS_STRENGTH},
    {"directions": ("query_to_doc", "query_to_query"), "partition_mode": "joint", "hardness_mode": "all_negatives",
     "hardness_strength": HARDNESS_STRENGTH},
]  # fmt: skip


def column_features(model, sentences: list[str], num_columns: int, batch: int, rows: slice | None = None):
    """``num_columns`` columns of ``batch`` sentences each (column c: sentences c*batch ...), optionally only rows."""
    columns = [sentences[c * batch : (c + 1) * batch] for c in range(num_columns)]
    return [model.preprocess(column[rows] if rows else column) for column in columns]


def _flat(grads, params) -> torch.Tensor:
    return torch.cat([
        (torch.zeros_like(p) if g is None else g).flatten() for g, p in zip(grads, params)
    ])  # fmt: skip


def compare_grid(
    model, features, *, cached: bool, gather: bool = False, options_list=None, average=lambda tensor: tensor
) -> dict:
    """Ours (InfoNCE, WEINCE at λ = 0) against MNRL / CachedMNRL over :func:`grid` on one input: the number of
    comparisons, the largest relative loss difference and the largest gradient difference relative to the largest
    gradient, and the largest λ WEINCE reported. ``average`` reduces a rank's loss and gradient over processes."""
    params = [p for p in model.parameters() if p.requires_grad]
    embeddings = None if cached else embed_columns(model, [dict(f) for f in features])

    def run(loss_fn):
        if cached:
            model.zero_grad(set_to_none=True)
            value = loss_fn([dict(f) for f in features], None)
            value.backward()
            grad = _flat([p.grad for p in params], params)
        else:
            value = loss_fn.compute_loss_from_embeddings(embeddings, None)
            grad = _flat(torch.autograd.grad(value, params, retain_graph=True, allow_unused=True), params)
        return average(value.detach().double()), average(grad.double())

    numbers = {"comparisons": 0, "loss_difference": 0.0, "grad_difference": 0.0, "lambda_max": 0.0}
    for options in grid() if options_list is None else options_list:
        common = {"gather_across_devices": gather, **options}
        if cached:
            common["mini_batch_size"] = MINI_BATCH_SIZE
            reference = CachedMultipleNegativesRankingLoss(model, **common)
            ours = [
                CachedInfoNCELoss(model, scale=20.0, **common),
                CachedWeinceLoss(model, scale=20.0, weince=LAMBDA_ZERO, **common),
            ]
        else:
            reference = MultipleNegativesRankingLoss(model, **common)
            ours = [
                InfoNCELoss(model, scale=20.0, **common),
                WeinceLoss(model, scale=20.0, weince=LAMBDA_ZERO, **common),
            ]
        expected_loss, expected_grad = run(reference)
        scale = expected_grad.abs().max().item()
        assert scale > 0, f"no gradient reached the encoder for {options}"
        for loss_fn in ours:
            loss, grad = run(loss_fn)
            numbers["comparisons"] += 1
            numbers["loss_difference"] = max(
                numbers["loss_difference"], abs(loss - expected_loss).item() / abs(expected_loss).item()
            )
            numbers["grad_difference"] = max(
                numbers["grad_difference"], (grad - expected_grad).abs().max().item() / scale
            )
        numbers["lambda_max"] = max(numbers["lambda_max"], ours[1].last_statistics["lambda_mean"])
    return numbers
