"""BERT's forward with its linear layers on the real tokens only (training's lever against padding).

A padded batch runs every linear layer, layer norm and GELU on its padding too, and those are most of a step on a
CPU (docs/performance.md). :func:`unpadded_bert_forward` keeps the hidden states as one row per *real* token and
pads only where the computation needs a rectangle: attention (per sentence) and the dropout masks. The masks are
drawn at the padded shape, in the order Hugging Face's forward draws them, and the real tokens' rows are kept, so
a training step consumes the same random stream and applies the same masks as the padded forward (its step losses
agree to fp32 rounding; ``tests/test_unpadded.py``). The weights are the model's own modules: checkpoints, export
and evaluation are unchanged.

Only a plain bidirectional ``BertModel`` with absolute positions qualifies (:func:`supports_unpadded`); any other
encoder runs its own forward. Inputs must be right-padded (as the trainer's collator pads). The trainer reaches
this only through :func:`simcse_weince.text.fast_path.build_training_forward`, which checks it by running.
"""

from __future__ import annotations

import torch
from torch import nn

from simcse_weince.text.fast_path.onednn_linear import linear

#: the linear layers' row count is rounded up to a multiple of this, with padding tokens' rows (which the padded
#: forward computes too): oneDNN builds and caches a kernel per row count, and the real-token count of a chunk is
#: new almost every step (docs/performance.md#memory)
ROW_MULTIPLE = 64


def supports_unpadded(encoder: nn.Module) -> bool:
    """True for a Hugging Face ``BertModel`` this forward reproduces: an encoder (no decoder, no cross-attention)
    with absolute positions, GELU-style activations and no feed-forward chunking."""
    try:
        from transformers import BertModel
    except ImportError:  # pragma: no cover - transformers is a dependency
        return False
    config = getattr(encoder, "config", None)
    return (
        type(encoder) is BertModel
        and not config.is_decoder
        and not getattr(config, "add_cross_attention", False)
        and getattr(config, "position_embedding_type", "absolute") == "absolute"
        and not getattr(config, "chunk_size_feed_forward", 0)
        # a piece this forward reads (not a public API: fast_path's start-up check catches what a release changes)
        and all(hasattr(layer.attention.self, "scaling") for layer in encoder.encoder.layer)
    )


def _dropout(rows: torch.Tensor, real: torch.Tensor, padded_shape: tuple, dropout: nn.Dropout) -> torch.Tensor:
    """``dropout`` applied to the real tokens' ``rows`` with the mask the padded tensor would have drawn.

    torch's CPU dropout draws ``bernoulli_(1 - p)`` over the whole (padded) input, scales it by 1 / (1 - p) and
    multiplies; drawing the same noise at the padded shape and keeping the real rows applies the same mask and
    leaves the random stream where the padded forward leaves it."""
    p = dropout.p
    if not dropout.training or p == 0:
        return rows
    if p == 1:
        return rows * 0
    noise = torch.empty((*padded_shape, rows.shape[-1]), dtype=rows.dtype, device=rows.device).bernoulli_(1 - p)
    noise.div_(1 - p)
    return rows * noise.view(-1, rows.shape[-1]).index_select(0, real)


def _computed_rows(attention_mask: torch.Tensor) -> tuple[torch.Tensor, int]:
    """The rows the layers compute (index into batch x length): every real token, then padding positions up to a
    multiple of :data:`ROW_MULTIPLE` (as many as there are); and the number of real tokens, which come first."""
    flat = attention_mask.reshape(-1)
    real = flat.nonzero().squeeze(1)
    extra = -len(real) % ROW_MULTIPLE
    return torch.cat([real, (flat == 0).nonzero().squeeze(1)[:extra]]) if extra else real, len(real)


def _pad(rows: torch.Tensor, real: torch.Tensor, padded_shape: tuple) -> torch.Tensor:
    """The real tokens' ``rows`` back in a zero-padded (batch, length, width) tensor."""
    padded = rows.new_zeros((padded_shape[0] * padded_shape[1], rows.shape[-1]))
    return padded.index_copy(0, real, rows).view(*padded_shape, rows.shape[-1])


def unpadded_bert_forward(
    encoder: nn.Module,
    input_ids=None,
    *,
    attention_mask: torch.Tensor,
    token_type_ids=None,
    inputs_embeds=None,
    onednn_linear: bool = False,
) -> torch.Tensor:
    """``encoder(input_ids, attention_mask, token_type_ids).last_hidden_state``, computed with the linear layers,
    layer norms and activations on the real tokens only. Padding positions of the result are zero.
    ``inputs_embeds`` (the word embeddings of ``input_ids``, looked up by the caller) may replace ``input_ids``.
    ``onednn_linear``: fp32 linear layers through oneDNN (:mod:`simcse_weince.text.fast_path.onednn_linear`)."""
    from transformers import masking_utils
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
    from transformers.models.bert.modeling_bert import eager_attention_forward

    def dense(layer: nn.Module, tokens: torch.Tensor) -> torch.Tensor:
        return linear(layer, tokens, onednn=onednn_linear)

    padded_shape = tuple(attention_mask.shape)
    real, real_count = _computed_rows(attention_mask)  # row indices in (batch * length): the real tokens first
    # the embeddings at the padded shape: gathers and one layer norm, and their dropout draws its mask there
    embeddings = encoder.embeddings(input_ids=input_ids, token_type_ids=token_type_ids, inputs_embeds=inputs_embeds)
    # transformers' public mask builder, as BertModel builds its mask; positional, because its second argument is
    # input_embeds in 5.0 and inputs_embeds in 5.25 (the private BertModel._create_attention_masks took a new
    # required argument in 5.25)
    mask = masking_utils.create_bidirectional_mask(encoder.config, embeddings, attention_mask)
    hidden = embeddings.reshape(-1, embeddings.shape[-1]).index_select(0, real)
    # as BertSelfAttention picks it (5.0 indexes the registry; later releases call get_interface, same result)
    implementation = encoder.config._attn_implementation
    attention = eager_attention_forward if implementation == "eager" else ALL_ATTENTION_FUNCTIONS[implementation]
    for layer in encoder.encoder.layer:
        self_attention = layer.attention.self
        heads = (*padded_shape, -1, self_attention.attention_head_size)
        query, key, value = (
            _pad(dense(projection, hidden), real, padded_shape).view(heads).transpose(1, 2)
            for projection in (self_attention.query, self_attention.key, self_attention.value)
        )
        context, _ = attention(
            self_attention, query, key, value, mask,
            dropout=self_attention.dropout.p if self_attention.training else 0.0, scaling=self_attention.scaling,
        )  # fmt: skip
        context = context.reshape(-1, self_attention.all_head_size).index_select(0, real)
        output = layer.attention.output
        attended = dense(output.dense, context)
        hidden = output.LayerNorm(_dropout(attended, real, padded_shape, output.dropout) + hidden)
        intermediate = layer.intermediate.intermediate_act_fn(dense(layer.intermediate.dense, hidden))
        output = layer.output
        projected = dense(output.dense, intermediate)
        hidden = output.LayerNorm(_dropout(projected, real, padded_shape, output.dropout) + hidden)
    return _pad(hidden[:real_count], real[:real_count], padded_shape)
