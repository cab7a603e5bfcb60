"""SimCSE's pooler names, each defined once with one meaning (torch-free: the CLIs import it for ``--help``).

The names are those of SimCSE (Gao et al., 2021; ``simcse/models.py`` and ``evaluation.py``):

* ``cls``: the [CLS] vector through a dense + tanh layer. In SimCSE's training that layer is the MLP head on top
  of the encoder; SimCSE's converter saves that head as BERT's pooler layer, so on a Hugging Face model
  ``cls`` reads ``pooler_output``.
* ``cls_before_pooler``: the [CLS] hidden state of the last layer.
* ``avg``, ``avg_first_last``, ``avg_top2``: masked means over the tokens of the last layer, of the first and
  last layers, and of the last two layers.

The trainer (:class:`~simcse_weince.text.model.SimCSEModel`) supports :data:`TRAINING_POOLERS`; STS evaluation of a
raw Hugging Face encoder (:mod:`simcse_weince.evaluation.encoders`) supports all of :data:`POOLERS`.
"""

from __future__ import annotations

#: every pooler name -> what it computes
POOLERS = {
    "cls": "[CLS] through a dense+tanh layer (training: the MLP head; a Hugging Face model: pooler_output)",
    "cls_before_pooler": "the [CLS] hidden state of the last layer",
    "avg": "mean of the last layer over non-padding tokens",
    # "first" is hidden_states[1] (the first transformer layer's output, as in BERT-whitening and SimCSE), not
    # hidden_states[0] (the embeddings)
    "avg_first_last": "mean over non-padding tokens of (first transformer layer + last layer) / 2",
    "avg_top2": "mean over non-padding tokens of (last two layers) / 2",
}

#: the poolers SimCSE's trainer supports (a tuple: error messages print it)
TRAINING_POOLERS = ("cls", "cls_before_pooler", "avg")

#: training pooler -> the pooler used to evaluate and export. Unsupervised SimCSE trains ``cls`` with the MLP
#: head and evaluates without it (SimCSE's ``--mlp_only_train``): the head is a training-only device. Supervised
#: SimCSE keeps it (``mlp_only_train=False``): its evaluation pooler is then ``cls`` itself.
EXPORT_POOLER = {name: name for name in TRAINING_POOLERS} | {"cls": "cls_before_pooler"}

#: exported pooler -> sentence-transformers' ``Pooling`` mode that computes it
SENTENCE_TRANSFORMERS_POOLING = {"cls_before_pooler": "cls", "avg": "mean", "cls": "cls"}  # cls: + a Dense (tanh)
