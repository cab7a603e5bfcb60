"""Issue 53: our losses are a drop-in for sentence-transformers' ``MultipleNegativesRankingLoss`` (MNRL) and
``CachedMultipleNegativesRankingLoss``: the same options, refused where MNRL refuses them, and at λ = 0 the same loss
and parameter gradients on a real encoder over the whole option grid (``tests/mnrl_grid.py``), plain, cached and on
two processes; the definition of WEINCE on every direction (``docs/directions.md``) against a brute-force reference;
the README's swap line as printed."""

from __future__ import annotations

import json
import math
import re

import mnrl_grid
import pytest
import torch
from sentence_transformers import SentenceTransformer
from sentence_transformers.base.losses.merged_forward import embed_columns
from sentence_transformers.sentence_transformer.losses import MultipleNegativesRankingLoss
from sentence_transformers.util import cos_sim, dot_score
from test_train_distributed import _has_torchrun_module, _run_two_processes
from train_helpers import REPO_ROOT

from simcse_weince import CachedInfoNCELoss, CachedWeinceLoss, InfoNCELoss, WeinceConfig, WeinceLoss
from simcse_weince.losses.from_embeddings import (
    ContrastiveObjective,
    check_contrastive_options,
    loss_from_embeddings,
)
from simcse_weince.weince import tail
from simcse_weince.weince.directions import directions_loss
from simcse_weince.weince.loss import weince_logits

BATCH = 6
LOSS_TOLERANCE = 1e-5  # relative, float32
GRAD_TOLERANCE = 5e-5  # of the largest gradient; float32 sums in another order (measured up to 1.5e-5)
NO_ENCODER = torch.nn.Sequential(torch.nn.Identity())  # where only the options are checked


@pytest.fixture(scope="module")
def tiny(tiny_model_one_layer, one_thread):
    model = SentenceTransformer(tiny_model_one_layer, device="cpu")
    for module in model.modules():  # deterministic: the losses are compared on the same embeddings
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
    return model


def _assert_equal_to_mnrl(numbers: dict, expected_comparisons: int) -> None:
    print(numbers)  # the differences, for reports (pytest -s)
    assert numbers["comparisons"] == expected_comparisons
    assert numbers["loss_difference"] <= LOSS_TOLERANCE, numbers
    assert numbers["grad_difference"] <= GRAD_TOLERANCE, numbers
    assert numbers["lambda_max"] == 0.0  # WEINCE really ran at λ = 0


# ------------------------------------------------------------------------------------------- the options


def test_the_grid_is_every_combination_mnrl_accepts():
    # 8 direction sets x joint, plus the 2 without same-type directions x per_direction; x 4 hardness modes
    assert len(mnrl_grid.grid()) == (8 + 2) * 4


@pytest.mark.parametrize("directions", mnrl_grid.DIRECTION_SETS + [(), ("doc_to_query",), ("query_to_doc", "x")])
@pytest.mark.parametrize("partition_mode", ["joint", "per_direction", "both"])
def test_options_are_refused_where_mnrl_refuses_them(directions, partition_mode):
    options = {"directions": directions, "partition_mode": partition_mode}
    try:
        MultipleNegativesRankingLoss(NO_ENCODER, **options)
    except ValueError:
        for loss_class in (WeinceLoss, InfoNCELoss, CachedWeinceLoss, CachedInfoNCELoss):
            with pytest.raises(ValueError, match="directions|partition_mode"):
                loss_class(NO_ENCODER, **options)
        return
    for loss_class in (WeinceLoss, InfoNCELoss, CachedWeinceLoss, CachedInfoNCELoss):
        assert loss_class(NO_ENCODER, **options).directions == tuple(directions)


def test_bad_options_get_one_clear_line():
    model = NO_ENCODER
    cases = [
        ({"temperature": 0.05, "scale": 20.0}, "give temperature or scale"),
        ({"scale": 0.0}, "Scale must be a positive value"),
        ({"hardness_mode": "hardest"}, "hardness_mode must be None or one of"),
        ({"hardness_strength": -1.0}, "hardness_strength must be a finite number >= 0"),
        ({"directions": ("query_to_doc", "query_to_query"), "partition_mode": "per_direction"}, "use partition_mode"),
    ]
    for options, message in cases:
        for loss_class in (WeinceLoss, InfoNCELoss, CachedWeinceLoss, CachedInfoNCELoss):
            with pytest.raises(ValueError, match=message):
                loss_class(model, **options)
    for loss_class in (WeinceLoss, CachedWeinceLoss):
        with pytest.raises(ValueError, match="cosine similarity only .* bounded by 1"):
            loss_class(model, similarity_fct=dot_score)
    with pytest.raises(ValueError, match="track_statistics .* need cosine"):
        InfoNCELoss(model, similarity_fct=dot_score, track_statistics=True)
    with pytest.raises(ValueError, match="simcse geometry|takes no directions"):
        loss_from_embeddings([torch.randn(4, 8)] * 2, geometry="simclr", directions=("query_to_doc", "doc_to_query"))
    # the trainer's entry point: normalised values
    assert check_contrastive_options("query_to_doc", "joint", None, 0.0) == (("query_to_doc",), "joint", None)
    repeated = ["query_to_doc", "doc_to_query", "query_to_doc"]
    expected = (("query_to_doc", "doc_to_query"), "per_direction", "hard_negatives")
    assert check_contrastive_options(repeated, "per_direction", "hard_negatives", 5) == expected


def test_scale_and_config_dict_follow_mnrl():
    loss = CachedWeinceLoss(
        NO_ENCODER, scale=42.0, mini_batch_size=4, directions=("query_to_doc", "doc_to_query"),
        partition_mode="per_direction", hardness_mode="in_batch_negatives", hardness_strength=9.0,
    )  # fmt: skip
    assert loss.scale == pytest.approx(42.0) and loss.temperature == pytest.approx(1 / 42)
    assert CachedWeinceLoss(NO_ENCODER, 42.0).scale == pytest.approx(42.0)  # CMNRL's second positional
    assert loss.directions == ("query_to_doc", "doc_to_query") and loss.partition_mode == "per_direction"
    assert loss.hardness_mode == "in_batch_negatives" and loss.hardness_strength == 9.0
    config = loss.get_config_dict()
    assert {key: config[key] for key in ("similarity_fct", "directions", "partition_mode", "hardness_mode")} == {
        "similarity_fct": "cos_sim", "directions": ("query_to_doc", "doc_to_query"), "partition_mode": "per_direction",
        "hardness_mode": "in_batch_negatives",
    }  # fmt: skip
    assert WeinceLoss(NO_ENCODER, scale=20.0).temperature == WeinceLoss(NO_ENCODER).temperature


def test_hardness_strength_alone_is_ignored_as_mnrl_ignores_it():
    """``hardness_strength=α`` without a mode does what MNRL does with it (nothing: its default mode is None), in
    the function, the four classes and the trainers' objective; a named mode applies it."""
    generator = torch.Generator().manual_seed(0)
    columns = [torch.randn(8, 16, generator=generator) for _ in range(3)]
    for loss in ("weince", "infonce"):
        alone = loss_from_embeddings(columns, loss=loss, hardness_strength=9.0).loss
        named = loss_from_embeddings(columns, loss=loss, hardness_strength=9.0, hardness_mode="in_batch_negatives").loss
        plain = loss_from_embeddings(columns, loss=loss).loss
        assert torch.equal(alone, plain) and not torch.equal(alone, named)
        objective_loss, _ = ContrastiveObjective(loss, 0.05, gather=False, hardness_strength=9.0)(*columns)
        assert torch.equal(objective_loss, plain)
    for loss_class in (WeinceLoss, InfoNCELoss, CachedWeinceLoss, CachedInfoNCELoss):
        assert loss_class(NO_ENCODER, hardness_strength=9.0).hardness_mode is None
    mnrl = MultipleNegativesRankingLoss(NO_ENCODER, hardness_strength=9.0)
    ours = InfoNCELoss(NO_ENCODER, hardness_strength=9.0)
    assert torch.equal(ours.compute_loss_from_embeddings(columns), mnrl.compute_loss_from_embeddings(columns, None))


# --------------------------------------------------------------------- equal to sentence-transformers at λ = 0


@pytest.mark.parametrize("shape", mnrl_grid.SHAPES)
def test_plain_losses_at_lambda_zero_equal_mnrl_on_the_whole_grid(tiny, wiki_sentences, shape):
    features = mnrl_grid.column_features(tiny, wiki_sentences, mnrl_grid.SHAPES[shape], BATCH)
    _assert_equal_to_mnrl(mnrl_grid.compare_grid(tiny, features, cached=False), 2 * len(mnrl_grid.grid()))


@pytest.mark.parametrize("shape", mnrl_grid.SHAPES)
def test_cached_losses_at_lambda_zero_equal_cached_mnrl(tiny, wiki_sentences, shape):
    features = mnrl_grid.column_features(tiny, wiki_sentences, mnrl_grid.SHAPES[shape], BATCH)
    numbers = mnrl_grid.compare_grid(tiny, features, cached=True, options_list=mnrl_grid.SAMPLE)
    _assert_equal_to_mnrl(numbers, 2 * len(mnrl_grid.SAMPLE))


@pytest.mark.slow
@pytest.mark.parametrize("shape", mnrl_grid.SHAPES)
def test_cached_losses_at_lambda_zero_equal_cached_mnrl_on_the_whole_grid(tiny, wiki_sentences, shape):
    features = mnrl_grid.column_features(tiny, wiki_sentences, mnrl_grid.SHAPES[shape], BATCH)
    _assert_equal_to_mnrl(mnrl_grid.compare_grid(tiny, features, cached=True), 2 * len(mnrl_grid.grid()))


def test_infonce_takes_mnrl_s_other_similarities(tiny, wiki_sentences):
    """``similarity_fct`` as MNRL takes it (dot product, ``scale=1``), on every direction set."""
    embeddings = embed_columns(tiny, mnrl_grid.column_features(tiny, wiki_sentences, 3, BATCH))
    for directions in mnrl_grid.DIRECTION_SETS:
        options = {"scale": 1.0, "similarity_fct": dot_score, "directions": directions}
        expected = MultipleNegativesRankingLoss(tiny, **options).compute_loss_from_embeddings(embeddings, None)
        ours = InfoNCELoss(tiny, **options).compute_loss_from_embeddings(embeddings)
        assert ours.item() == pytest.approx(expected.item(), rel=LOSS_TOLERANCE)
        assert InfoNCELoss(tiny, **options).get_config_dict()["similarity_fct"] == "dot_score"


def _two_process_report(tmp_path, tiny_model_one_layer, wiki_sentences, full: bool) -> dict:
    if not _has_torchrun_module():
        pytest.skip("torchrun is not available")
    sentences = tmp_path / "sentences.txt"
    sentences.write_text("\n".join(wiki_sentences[:100]) + "\n", encoding="utf-8")
    report = tmp_path / "report.json"
    _run_two_processes(
        "distributed_mnrl_check.py", tiny_model_one_layer, sentences, report, *(["full"] if full else [])
    )
    return json.loads(report.read_text())


def _assert_two_process_report(report: dict, options: int, full: bool) -> None:
    assert report["world"] == 2
    cached_shapes = mnrl_grid.SHAPES if full else ["triplets"]
    expected = [f"plain_{shape}" for shape in mnrl_grid.SHAPES] + [f"cached_{shape}" for shape in cached_shapes]
    assert set(report) == {"world", *expected}
    for name, numbers in report.items():
        if name != "world":
            _assert_equal_to_mnrl(numbers, 2 * options)


def test_two_processes_gathering_equal_mnrl(tmp_path, tiny_model_one_layer, wiki_sentences):
    """``gather_across_devices=True`` on 2 processes: loss and DDP-averaged gradients equal MNRL's, plain and
    cached (the grid's cross-section on every shape, cached on triplets; the whole grid under ``-m slow``)."""
    report = _two_process_report(tmp_path, tiny_model_one_layer, wiki_sentences, False)
    _assert_two_process_report(report, len(mnrl_grid.SAMPLE), full=False)


@pytest.mark.slow
def test_two_processes_gathering_equal_mnrl_on_the_whole_grid(tmp_path, tiny_model_one_layer, wiki_sentences):
    report = _two_process_report(tmp_path, tiny_model_one_layer, wiki_sentences, True)
    _assert_two_process_report(report, len(mnrl_grid.grid()), full=True)


# ------------------------------------------------------------------ WEINCE on every direction, by brute force


def _reference_rows(queries, documents, directions, partition_mode):
    """Each softmax's rows as the docs define them, built entry by entry: (values, is_positive, is_masked)."""
    num_anchors, num_documents = queries.shape[0], documents.shape[0]
    q, d = torch.nn.functional.normalize(queries, dim=-1), torch.nn.functional.normalize(documents, dim=-1)
    blocks = {"query_to_doc": [], "query_to_query": [], "doc_to_query": [], "doc_to_doc": []}
    for i in range(num_anchors):
        blocks["query_to_doc"].append([(q[i] @ d[j], j == i, False) for j in range(num_documents)])
        blocks["query_to_query"].append([(q[i] @ q[j], False, j == i) for j in range(num_anchors)])
        blocks["doc_to_query"].append([(d[i] @ q[j], j == i, False) for j in range(num_anchors)])
        blocks["doc_to_doc"].append([(d[i] @ d[j], False, j % num_anchors == i) for j in range(num_documents)])
    chosen = [name for name in mnrl_grid.DIRECTIONS if name in directions]
    if partition_mode == "joint":
        return [[sum((blocks[name][i] for name in chosen), []) for i in range(num_anchors)]]
    return [blocks[name] for name in chosen]


def _reference_loss(queries, documents, directions, partition_mode, config):
    losses, lambdas = [], []
    for rows in _reference_rows(queries, documents, directions, partition_mode):
        sims = torch.stack([torch.stack([value for value, _, _ in row]) for row in rows])
        positive = torch.tensor([[p for _, p, _ in row] for row in rows])
        masked = torch.tensor([[m for _, _, m in row] for row in rows])
        negatives = sims.detach().masked_fill(positive | masked, -math.inf)  # the tail statistics' entries
        stats = tail.tail_statistics(negatives, config)
        weight, _ = tail.mixing_weights(stats, config)
        beta = tail.shortfall_exponent(stats, config)
        logits = weince_logits(sims, weight, beta, 0.05).masked_fill(masked, -math.inf)
        target = torch.arange(len(rows))  # the query_to_doc positive (or, per direction, the block's own)
        losses.append(torch.nn.functional.cross_entropy(logits, target))
        lambdas.append(weight)
    return torch.stack(losses).mean(), torch.cat(lambdas)


@pytest.mark.parametrize("directions, partition_mode", [
    (("query_to_doc", "doc_to_query"), "per_direction"),
    (("query_to_doc", "doc_to_query"), "joint"),
    (mnrl_grid.DIRECTIONS, "joint"),
    (("query_to_doc", "query_to_query"), "joint"),
])  # fmt: skip
def test_weince_on_directions_is_the_documented_loss(directions, partition_mode):
    """Loss, gradients and λ of :func:`directions_loss` against a reference built entry by entry from
    ``docs/directions.md`` (float64, a config whose λ is far from 0 and 1)."""
    config = WeinceConfig(quantile=0.5, aic_margin=0.0, kappa_aic=0.05)
    generator = torch.Generator().manual_seed(1)
    queries = torch.randn(12, 8, generator=generator, dtype=torch.float64)
    documents = torch.cat([queries + 0.5 * torch.randn(queries.shape, generator=generator, dtype=torch.float64),
                           torch.randn(12, 8, generator=generator, dtype=torch.float64)])  # fmt: skip
    expected, expected_lambda = _reference_loss(queries.requires_grad_(), documents.requires_grad_(), directions,
                                                partition_mode, config)  # fmt: skip
    expected_grads = torch.autograd.grad(expected, (queries, documents))
    loss, stats = directions_loss(queries, documents, directions=directions, partition_mode=partition_mode,
                                  temperature=0.05, weince=config, return_stats=True)  # fmt: skip
    grads = torch.autograd.grad(loss, (queries, documents))
    assert 0.05 < float(stats["mixing_weight"].mean()) < 0.95  # WEINCE's blend is really exercised
    torch.testing.assert_close(stats["mixing_weight"], expected_lambda, rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(loss, expected, rtol=1e-9, atol=1e-12)
    for grad, expected_grad in zip(grads, expected_grads):
        torch.testing.assert_close(grad, expected_grad, rtol=1e-7, atol=1e-10)


# -------------------------------------------------------------------------------------------- the README


def test_readme_swap_runs_as_printed(minilm_path, monkeypatch):
    """The code block above the README's "MNRL option → ours" table: the swap line, run on the bundled MiniLM."""
    readme = (REPO_ROOT / "README.md").read_text(encoding="utf-8")
    before_table = readme[: readme.index("| MNRL option → ours")]
    code = re.findall(r"```python\n(.*?)```", before_table, re.S)[-1]  # the block right above the table
    assert "WeinceLoss(model, **options)" in code
    import sentence_transformers

    monkeypatch.setattr(
        sentence_transformers, "SentenceTransformer", lambda name, **kw: SentenceTransformer(minilm_path)
    )
    namespace: dict = {}
    exec(compile(code, "README.md", "exec"), namespace)  # noqa: S102 - the README's own example
    loss, reference = namespace["loss"], namespace["reference"]
    assert isinstance(loss, WeinceLoss) and loss.directions == reference.directions
    assert loss.partition_mode == reference.partition_mode == "per_direction"
    assert loss.scale == pytest.approx(reference.scale) and loss.similarity_fct is cos_sim
