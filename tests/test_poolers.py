"""SimCSE's pooler names, defined once (simcse_weince.poolers) and shared by the trainer's encoder and evaluation."""

from __future__ import annotations

import subprocess
import sys

import pytest

from simcse_weince import poolers
from simcse_weince.poolers import EXPORT_POOLER, POOLERS, SENTENCE_TRANSFORMERS_POOLING, TRAINING_POOLERS


def test_the_vocabulary_imports_without_torch():
    """The CLIs read the names for --help; neither poolers.py nor the evaluate sub-command may import torch."""
    code = (
        "import sys, simcse_weince.poolers, simcse_weince.evaluation.cli; "
        "assert 'torch' not in sys.modules, 'torch imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_the_trainer_and_evaluation_use_the_same_tables():
    from simcse_weince import evaluation, hub
    from simcse_weince.evaluation import cli, encoders
    from simcse_weince.text import config
    from simcse_weince.text import model as modeling

    assert encoders.POOLERS is POOLERS and evaluation.POOLERS is POOLERS
    assert cli.POOLER_CHOICES == tuple(POOLERS)
    assert modeling.TRAINING_POOLERS is TRAINING_POOLERS
    assert modeling.EXPORT_POOLER is EXPORT_POOLER and config.TRAINING_POOLERS is TRAINING_POOLERS
    assert modeling.SENTENCE_TRANSFORMERS_POOLING is SENTENCE_TRANSFORMERS_POOLING
    # no second table under another meaning
    assert not hasattr(modeling, "POOLERS") and not hasattr(modeling, "EVALUATION_POOLER")
    with pytest.raises(ValueError, match="unknown pooler 'avg_top2'"):  # the trainer's config, before any loading
        config.TrainConfig(pooler="avg_top2")
    import inspect

    assert "EXPORT_POOLER" in inspect.getsource(hub.render_model_card)


def test_the_tables_agree():
    assert list(POOLERS) == ["cls", "cls_before_pooler", "avg", "avg_first_last", "avg_top2"]
    assert all(isinstance(description, str) and description for description in POOLERS.values())
    assert TRAINING_POOLERS == ("cls", "cls_before_pooler", "avg")
    # SimCSE's --mlp_only_train: cls trains with the MLP head and is exported without it; the others unchanged
    assert EXPORT_POOLER == {"cls": "cls_before_pooler", "cls_before_pooler": "cls_before_pooler", "avg": "avg"}
    assert set(EXPORT_POOLER.values()) <= set(SENTENCE_TRANSFORMERS_POOLING) <= set(POOLERS)
    # cls itself is exported by supervised runs (mlp_only_train=False): Pooling(cls) followed by the MLP as a Dense
    assert SENTENCE_TRANSFORMERS_POOLING == {"cls_before_pooler": "cls", "avg": "mean", "cls": "cls"}
    assert poolers.__doc__ and "pooler_output" in POOLERS["cls"]


def test_errors_list_the_poolers_each_side_supports():
    from simcse_weince.evaluation.encoders import HFEncoder, as_encoder
    from simcse_weince.text.model import SimCSEModel

    with pytest.raises(ValueError, match="unknown pooler 'avg_top2'") as error:
        SimCSEModel(encoder=None, tokenizer=None, pooler="avg_top2")  # checked before the encoder is used
    assert str(TRAINING_POOLERS) in str(error.value)
    with pytest.raises(ValueError, match="unknown pooler 'max'; choose from cls, cls_before_pooler, avg, avg_first"):
        HFEncoder(model=None, tokenizer=None, pooler="max")
    with pytest.raises(ValueError, match="avg_top2"):
        as_encoder("some/model", pooler="max")
