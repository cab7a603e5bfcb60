"""The text trainer's fast training forward: everything that reaches below public APIs for speed, behind one entry.

=============================  ===================================================================================
``fast_path/__init__.py``      :func:`build_training_forward` (the entry point), :class:`TrainingForward`, the
                               start-up self-check and its fallback
``fast_path/unpadded.py``      BERT's linear layers, layer norms and GELU on the real tokens only
``fast_path/onednn_linear.py`` fp32 linear layers through oneDNN (AMD CPUs)
=============================  ===================================================================================

A :class:`TrainingForward` turns a batch into training-pooler embeddings: in ``length_chunks`` length-sorted
chunks (each padded only to its own longest sentence), with the unpadded BERT layers (one shared word-embedding
lookup for all chunks) or a ``torch.compile``-d forward. :class:`~simcse_weince.text.model.SimCSEModel` calls it
in training steps and knows nothing of how it works.

Transformers' internals move between releases (5.25 added a required argument to the private mask builder that
the unpadded forward called). So :func:`build_training_forward` **checks itself by running** before the first
step: the stock forward (``encoder(**inputs)``, one padded batch) and the fast one on small fixed batches of the
shapes training will see (:func:`check_batches`: rows from 2 tokens up to the run's ``max_length``, forwards with
padding and without), in eval mode (no dropout, so no random draws), outputs and a few weight
gradients compared at fp32 tolerance (:data:`CHECK_TOLERANCE`) and, for a mixed-precision run, once more under the
run's autocast (:data:`AUTOCAST_TOLERANCE`). On an exception or a mismatch one warning names the versions and what
failed, and training continues on a plainer forward (length chunks on the encoder's own forward, else the stock
forward); ``results.json`` records which path ran and why (:attr:`TrainingForward.report`).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, replace

import torch
from torch import nn

from simcse_weince.text.fast_path.onednn_linear import resolve_onednn_linear
from simcse_weince.text.fast_path.unpadded import supports_unpadded, unpadded_bert_forward
from simcse_weince.text.model import trim_trailing_padding

logger = logging.getLogger(__name__)

#: the start-up check's tolerance, relative to the largest magnitude compared: fp32 rounding of a 6-layer encoder
#: whose kernels sum in another order (oneDNN, length chunks), with room; a wrong mask or layer moves it by >1e-2
CHECK_TOLERANCE = 1e-4
#: the outputs' tolerance under a mixed-precision run's autocast: bf16 keeps 8 bits of mantissa, so the two
#: forwards' roundings differ far more than in fp32. That pass catches what breaks only in the run's precision (an
#: error, another dtype, outputs far off); the fp32 pass catches the subtle mismatches
AUTOCAST_TOLERANCE = 2e-2
#: the autocast dtype of each mixed precision (``mixed_precision`` of a run)
AUTOCAST_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass(frozen=True)
class TrainingForward:
    """How a training step encodes a batch (options as data; :func:`build_training_forward` makes a checked one).

    Args:
        length_chunks: encode the rows in this many length-sorted chunks, each padded only to its own longest
            sentence (1: one forward over the padded batch).
        unpadded_layers: a ``BertModel``'s linear layers on the real tokens only (:mod:`.unpadded`).
        onednn_linear: with ``unpadded_layers``, fp32 linear layers through oneDNN (:mod:`.onednn_linear`).
        compiled: a ``torch.compile``-d encoder forward (excludes ``unpadded_layers``).
    """

    length_chunks: int = 1
    unpadded_layers: bool = False
    onednn_linear: bool = False
    compiled: object = None  # torch.compile(encoder.forward), or None
    report: dict | None = None  # which path runs and why (results.json's training_forward), set by the builder

    def __call__(self, encoder: nn.Module, inputs: dict, pool) -> torch.Tensor:
        """``pool(last_hidden_state, attention_mask)`` of ``inputs`` (right-padded), rows in input order."""
        if self.length_chunks > 1 and len(inputs["attention_mask"]) > 1:
            return self._length_sorted(encoder, inputs, pool)
        return pool(self.hidden_states(encoder, inputs), inputs["attention_mask"])

    def hidden_states(self, encoder: nn.Module, inputs: dict) -> torch.Tensor:
        """The encoder's last hidden state (padding positions of the unpadded forward are zero)."""
        if self.compiled is not None:
            return self.compiled(**inputs).last_hidden_state
        if self.unpadded_layers:
            return unpadded_bert_forward(encoder, **inputs, onednn_linear=self.onednn_linear)
        return encoder(**inputs).last_hidden_state

    def _length_sorted(self, encoder: nn.Module, inputs: dict, pool) -> torch.Tensor:
        order = torch.argsort(inputs["attention_mask"].sum(dim=1), descending=True, stable=True)
        if self.unpadded_layers:
            # the word embeddings looked up once for all chunks (the same vectors): their backward then fills and
            # adds the (vocabulary x width) gradient once a step instead of once a chunk (docs/performance.md)
            inputs = {**inputs, "inputs_embeds": encoder.get_input_embeddings()(inputs["input_ids"])}
            del inputs["input_ids"]
        pooled = []
        for rows in torch.tensor_split(order, min(self.length_chunks, len(order))):
            chunk = trim_trailing_padding({name: value[rows] for name, value in inputs.items()})
            pooled.append(pool(self.hidden_states(encoder, chunk), chunk["attention_mask"]))
        # back to the input order: row order[i] of the input is row i of the sorted embeddings
        return torch.cat(pooled).index_select(0, torch.argsort(order))

    def describe(self) -> str:
        """A few words for the start-up line."""
        parts = [f"{self.length_chunks} length chunk(s)"]
        if self.unpadded_layers:
            parts.append("linear layers on real tokens only" + (" (fp32 by oneDNN)" if self.onednn_linear else ""))
        if self.compiled is not None:
            parts.append("compiled forward")
        return ", ".join(parts)


STOCK = TrainingForward(report={"path": "stock", "reason": None})


def build_training_forward(
    encoder: nn.Module,
    speed,
    *,
    length_chunks: int,
    mixed_precision: str,
    max_length: int,
    device_type: str = "cpu",
) -> TrainingForward:
    """The training forward that ``speed`` (a :class:`~simcse_weince.text.config.SpeedConfig`) asks for, checked.

    ``length_chunks`` is the resolved number of chunks (``speed.length_chunks`` may say ``auto``), ``max_length``
    the longest row training will give it (tokens), ``mixed_precision`` the run's (``no``, ``bf16``, ``fp16``). The
    first candidate that passes :func:`check_training_forward` on those shapes and that precision is returned: the
    one asked for, then length chunks on the encoder's own forward, then the stock forward. Its
    :attr:`~TrainingForward.report` says which ran and why."""
    unpadded = bool(speed.unpadded_layers and not speed.compile and supports_unpadded(encoder))
    asked = TrainingForward(
        length_chunks=length_chunks,
        unpadded_layers=unpadded,
        onednn_linear=unpadded and mixed_precision == "no" and resolve_onednn_linear(speed.onednn_linear, device_type),
        compiled=torch.compile(encoder.forward, dynamic=True) if speed.compile else None,
    )
    candidates = [asked]
    if asked.unpadded_layers or asked.compiled is not None:
        candidates.append(TrainingForward(length_chunks=length_chunks))
    failures = []
    started = time.perf_counter()
    for candidate in candidates:
        failure = check_training_forward(encoder, candidate, max_length=max_length, mixed_precision=mixed_precision)
        if failure is None:
            break
        failures.append(f"{candidate.describe()}: {failure}")
    else:
        candidate = STOCK
    seconds = time.perf_counter() - started
    if failures:
        logger.warning(
            "the fast training forward failed its start-up check (%s; %s); training continues on %s",
            versions_line(), "; ".join(failures), "the stock forward" if candidate is STOCK else candidate.describe(),
        )  # fmt: skip
    path = "fast" if candidate is asked else ("stock" if candidate is STOCK else "fallback")
    report = {"path": path, "reason": "; ".join(failures) or None, "check_seconds": round(seconds, 4),
              "length_chunks": candidate.length_chunks, "unpadded_layers": candidate.unpadded_layers,
              "onednn_linear": candidate.onednn_linear, "compile": candidate.compiled is not None}  # fmt: skip
    return replace(candidate, report=report)


def versions_line() -> str:
    import transformers

    return f"transformers {transformers.__version__}, torch {torch.__version__}"


def check_batch(encoder: nn.Module, lengths=(9, 4, 7, 2, 9, 5)) -> dict:
    """A fixed, right-padded batch for ``encoder`` (no random draws): one row per entry of ``lengths`` (tokens,
    capped at the model's positions), token ids spread over the vocabulary, token types 0."""
    config = encoder.config
    positions = getattr(config, "max_position_embeddings", 512) or 512
    lengths = [max(1, min(length, positions)) for length in lengths]
    rows, width = len(lengths), max(lengths)
    vocabulary = config.vocab_size
    ids = (torch.arange(rows * width).view(rows, width) * 7919 + 101) % max(vocabulary - 1, 1) + 1
    mask = (torch.arange(width).unsqueeze(0) < torch.tensor(lengths).unsqueeze(1)).long()
    pad = getattr(config, "pad_token_id", None) or 0
    batch = {"input_ids": ids.masked_fill(mask == 0, pad), "attention_mask": mask}
    if getattr(config, "type_vocab_size", 0):
        batch["token_type_ids"] = torch.zeros_like(ids)
    device = next(encoder.parameters()).device
    return {name: value.to(device) for name, value in batch.items()}


def check_lengths(max_length: int, length_chunks: int) -> list[list[int]]:
    """The row lengths of the check's batches: rows from ``max_length`` tokens down to 2 (distinct where
    ``max_length`` allows, out of order: the forward sorts them), some forwards padded and some not.

    With length chunks, one batch of ``length_chunks + 1`` rows: the forward's first chunk holds the two longest
    rows (padded), every other chunk one row (no padding). Without, a padded batch of three rows and a batch of two
    ``max_length`` rows (no padding anywhere)."""
    longest = max(2, int(max_length))

    def spread(rows: int) -> list[int]:
        lengths = [round(longest - index * (longest - 2) / (rows - 1)) for index in range(rows)]
        return lengths[1::2] + lengths[0::2]  # second, fourth, ... then the longest, third, ...: not sorted

    if length_chunks > 1:
        return [spread(int(length_chunks) + 1)]
    return [spread(3), [longest, longest]]


def check_batches(encoder: nn.Module, max_length: int, length_chunks: int) -> list[dict]:
    """The batches :func:`check_training_forward` runs (:func:`check_lengths`, capped at the model's positions)."""
    return [check_batch(encoder, lengths) for lengths in check_lengths(max_length, length_chunks)]


def _check_pool(hidden: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """Every real token reaches the compared vectors: [CLS], the mean and the maximum over real tokens."""
    mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
    mean = (hidden * mask).sum(dim=1) / mask.sum(dim=1).clamp_min(1)
    largest = hidden.masked_fill(mask == 0, float("-inf")).amax(dim=1)
    return torch.cat([hidden[:, 0], mean, largest], dim=-1)


def check_training_forward(
    encoder: nn.Module, candidate: TrainingForward, *, max_length: int, mixed_precision: str = "no"
) -> str | None:
    """None if ``candidate`` computes what the stock forward computes on :func:`check_batches` (rows up to
    ``max_length`` tokens, padded and not; outputs and the gradients of two weight matrices, eval mode: no random
    draws) in fp32 and, for ``mixed_precision`` ``bf16`` / ``fp16``, under that autocast too; else what failed and
    where, in a few words."""
    batches = check_batches(encoder, max_length, candidate.length_chunks)
    passes = [(None, CHECK_TOLERANCE)]
    if mixed_precision in AUTOCAST_DTYPES:
        passes.append((AUTOCAST_DTYPES[mixed_precision], AUTOCAST_TOLERANCE))
    was_training = encoder.training
    encoder.eval()
    try:
        for dtype, tolerance in passes:
            for inputs in batches:
                failure = _check_one(encoder, candidate, inputs, dtype, tolerance)
                if failure is not None:
                    lengths = inputs["attention_mask"].sum(dim=1).tolist()
                    shape = f"{len(lengths)} rows of {min(lengths)}-{max(lengths)} tokens"
                    return f"{failure}, on {shape} in {mixed_precision if dtype is not None else 'fp32'}"
    finally:
        encoder.train(was_training)
    return None


def _check_one(encoder: nn.Module, candidate: TrainingForward, inputs: dict, dtype, tolerance: float) -> str | None:
    """:func:`check_training_forward` on one batch, in fp32 (``dtype`` None) or under autocast to ``dtype``."""
    weights = [p for p in encoder.parameters() if p.requires_grad and p.dim() == 2]
    weights = [weights[1], weights[-1]] if len(weights) > 1 else weights  # a layer's first and the last matrix
    device_type = inputs["input_ids"].device.type
    with torch.autocast(device_type, dtype=dtype, enabled=dtype is not None), torch.enable_grad():
        stock = _check_pool(encoder(**inputs).last_hidden_state, inputs["attention_mask"])
        try:
            fast = candidate(encoder, inputs, _check_pool)
        except Exception as error:  # noqa: BLE001 - any failure of a fast path means: use the stock one
            return f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}".rstrip(": ")
        if fast.shape != stock.shape or fast.dtype != stock.dtype:
            return (f"output of shape {tuple(fast.shape)} ({fast.dtype}), the stock forward's is "
                    f"{tuple(stock.shape)} ({stock.dtype})")  # fmt: skip
        mismatch = _relative_difference(fast, stock)
        if not mismatch <= tolerance:
            return f"outputs differ from the stock forward's by {mismatch:.2g} (tolerance {tolerance:g})"
        probe = torch.linspace(-1, 1, stock.numel(), device=stock.device).view_as(stock)
        try:
            stock_grads = torch.autograd.grad((stock.float() * probe).sum(), weights, allow_unused=True)
            fast_grads = torch.autograd.grad((fast.float() * probe).sum(), weights, allow_unused=True)
        except Exception as error:  # noqa: BLE001
            return f"backward: {type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
    for index, (expected, got) in enumerate(zip(stock_grads, fast_grads)):
        if (expected is None) != (got is None):
            return f"gradient {index} missing"
        if got is not None and not bool(torch.isfinite(got).all()):
            return f"gradient {index} is not finite"
        # under autocast a weight gradient moves by a tenth between the two forwards (bf16 rounding of every
        # token's product): only the fp32 pass compares gradients
        mismatch = 0.0 if expected is None or dtype is not None else _relative_difference(got, expected)
        if not mismatch <= tolerance:
            return f"gradients differ from the stock forward's by {mismatch:.2g}"
    return None


def _relative_difference(got: torch.Tensor, expected: torch.Tensor) -> float:
    scale = expected.detach().abs().max().clamp_min(1e-12)
    return float(((got.detach().float() - expected.detach().float()).abs().max() / scale).item())
