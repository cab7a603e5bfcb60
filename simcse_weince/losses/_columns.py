"""What :class:`~simcse_weince.WeinceLoss` and :class:`~simcse_weince.InfoNCELoss` share: their state and
``forward`` (:class:`ColumnsLoss`: text columns -> embeddings -> :func:`~simcse_weince.losses.from_embeddings.
loss_from_embeddings`, the path the trainers' objective takes too), the temperature check, and the lazy
finiteness check of a loss."""

from __future__ import annotations

import dataclasses
import functools
import logging
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from sentence_transformers.util import cos_sim, similarity_fct_name
from torch import Tensor, nn

from simcse_weince import compat
from simcse_weince.deprecation import renamed_attribute, renamed_keywords
from simcse_weince.losses.from_embeddings import (
    DEFAULT_DIRECTIONS,
    DEFAULT_HARDNESS_MODE,
    ContrastiveSettings,
    EmbeddingsLoss,
    contrastive_loss,
    read_statistics,
)
from simcse_weince.weince.loss import WeinceConfig

logger = logging.getLogger(__name__)

DEFAULT_TEMPERATURE = 0.05  # SimCSE's; MNRL's scale=20


def check_temperature(temperature) -> float:
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or not temperature > 0:
        raise ValueError(f"temperature must be a positive number, got {temperature!r}")
    return float(temperature)


def resolve_temperature(temperature, scale) -> float:
    """τ from ``temperature`` or from sentence-transformers' spelling ``scale`` = 1 / τ (one or the other)."""
    if temperature is not None and scale is not None:
        raise ValueError(
            f"give temperature or scale (= 1 / temperature), not both; got temperature={temperature!r}, scale={scale!r}"
        )
    if scale is None:
        return check_temperature(DEFAULT_TEMPERATURE if temperature is None else temperature)
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not scale > 0 or scale == float("inf"):
        raise ValueError(f"scale must be a finite positive number, got {scale!r}")
    return 1.0 / float(scale)


def is_cosine(similarity_fct) -> bool:
    """sentence-transformers' ``cos_sim``, also as a ``functools.partial`` that binds nothing."""
    if isinstance(similarity_fct, functools.partial) and not similarity_fct.args and not similarity_fct.keywords:
        similarity_fct = similarity_fct.func
    return similarity_fct is cos_sim


def setting(name: str, doc: str) -> property:
    """A read-only attribute of a loss that is a field of its validated :class:`ContrastiveSettings`."""
    return property(lambda self: getattr(self.settings, name), doc=doc)


#: the Inputs section every loss of this package shares; a loss's docstring holds ``{inputs}`` in its place
INPUTS_SECTION = """\
Inputs:
    +-------------------------------------------------+--------+
    | Inputs                                          | Labels |
    +=================================================+========+
    | (anchor,) single sentences: unsupervised SimCSE | none   |
    +-------------------------------------------------+--------+
    | (anchor, positive) pairs                        | none   |
    +-------------------------------------------------+--------+
    | (anchor, positive, negative_1, ..., negative_n) | none   |
    +-------------------------------------------------+--------+"""


def fill_shared_sections(docstring: str | None) -> str | None:
    """``docstring`` with its ``{inputs}`` line replaced by :data:`INPUTS_SECTION`, indented as that line is."""
    if docstring is None or "{inputs}" not in docstring:
        return docstring
    lines = []
    for line in docstring.splitlines():
        indent = line[: len(line) - len(line.lstrip())]
        shared = INPUTS_SECTION.splitlines() if line.strip() == "{inputs}" else None
        lines.extend([indent + row for row in shared] if shared else [line])
    return "\n".join(lines)


def embed_columns(model: nn.Module, sentence_features: list[dict[str, Tensor]]) -> list[Tensor]:
    """Embed every column; one column means unsupervised SimCSE: the same text twice, two dropout masks."""
    if len(sentence_features) == 1:
        # The duplicated column goes through the encoder in one forward pass of 2N rows, as SimCSE does;
        # dropout draws independent masks for the two copies.
        sentence_features = [sentence_features[0], sentence_features[0]]
        return compat.embed_columns(model, sentence_features, separate_first=False)
    return compat.embed_columns(model, sentence_features)


class ColumnsLoss(nn.Module):
    """A contrastive loss over text columns (column 0 anchors, column 1 positives, further columns hard negatives;
    one column: unsupervised SimCSE) with sentence-transformers' ``MultipleNegativesRankingLoss`` options. A
    subclass names its loss (``loss_name``: ``"weince"``, ``"infonce"``) and sets ``track_statistics`` (whether
    WEINCE's statistics of each batch are kept). The options are validated once, into :attr:`settings`, and every
    batch goes through :func:`~simcse_weince.losses.from_embeddings.contrastive_loss` with them."""

    loss_name: str
    track_statistics: bool = True  # the default of the option of that name

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        cls.__doc__ = fill_shared_sections(cls.__doc__)

    @renamed_keywords(config="weince")
    def __init__(
        self,
        model: nn.Module,
        temperature: float | None = None,
        *,
        scale: float | None = None,
        weince: WeinceConfig | None = None,
        similarity_fct: Callable[[Tensor, Tensor], Tensor] = cos_sim,
        gather_across_devices: bool = False,
        directions: Sequence[str] = DEFAULT_DIRECTIONS,
        partition_mode: str = "joint",
        hardness_mode: str | None = DEFAULT_HARDNESS_MODE,
        hardness_strength: float = 0.0,
        track_statistics: bool | None = None,
    ) -> None:
        # one signature for every loss of this package (what each option means: the subclass's docstring)
        super().__init__()
        if self.loss_name == "weince" and similarity_fct is not None and not is_cosine(similarity_fct):
            raise ValueError(
                f"{type(self).__name__} takes cosine similarity only (similarity_fct=cos_sim), got "
                f"{getattr(similarity_fct, '__name__', similarity_fct)!r}: its shortfall logit -log(1 - s) needs "
                f"similarities bounded by 1; use InfoNCELoss for other similarities"
            )
        temperature = resolve_temperature(temperature, scale)
        self.model = model
        weince = WeinceConfig() if weince is None else weince  # its type: ContrastiveSettings checks it
        similarity_fct = cos_sim if similarity_fct is None else similarity_fct
        if not callable(similarity_fct):
            raise ValueError(f"similarity_fct must be a function of two embedding matrices, got {similarity_fct!r}")
        self._similarity_fct = similarity_fct
        self.settings = ContrastiveSettings(
            loss=self.loss_name, temperature=temperature, weince=weince, gather=gather_across_devices,
            hardness_strength=hardness_strength, directions=directions, partition_mode=partition_mode,
            hardness_mode=hardness_mode, similarity_fct=None if is_cosine(similarity_fct) else similarity_fct,
        )  # fmt: skip
        if hardness_mode is None and hardness_strength > 0:
            logger.warning(
                "hardness_strength=%g is ignored with hardness_mode=None (as in MultipleNegativesRankingLoss); "
                "leave hardness_mode unset (in_batch_negatives) or name a mode to apply it",
                hardness_strength,
            )
        if track_statistics is not None:
            self.track_statistics = bool(track_statistics)
        if self.track_statistics and self.settings.similarity_fct is not None:
            raise ValueError(
                "track_statistics computes WEINCE's tail statistics, which need cosine similarity; leave "
                "similarity_fct unset or track_statistics off"
            )
        # the last batch's loss, columns and statistics, for a lazy finiteness check when the statistics are read
        # (no per-step device synchronisation)
        self._last: EmbeddingsLoss | None = None

    weince = setting("weince", "The :class:`~simcse_weince.WeinceConfig` of the mixing weight.")
    config = renamed_attribute("config", "weince")
    gather_across_devices = setting("gather", "Whether embeddings are gathered from all processes (with gradient).")
    directions = setting("directions", "MNRL's similarity blocks, a tuple.")
    partition_mode = setting("partition_mode", "MNRL's ``joint`` or ``per_direction``.")
    hardness_mode = setting("hardness_mode", "MNRL's hard-negative weighting mode (None: off).")
    hardness_strength = setting("hardness_strength", "α of the hard-negative weighting (0: off).")

    @property
    def temperature(self) -> float:
        """τ (assignable: validated again)."""
        return self.settings.temperature

    @temperature.setter
    def temperature(self, value: float) -> None:
        self.settings = dataclasses.replace(self.settings, temperature=check_temperature(value))

    @property
    def scale(self) -> float:
        """sentence-transformers' name for 1 / temperature (assignable, as MNRL's)."""
        return 1.0 / self.temperature

    @scale.setter
    def scale(self, value: float) -> None:
        self.temperature = resolve_temperature(None, value)

    @property
    def similarity_fct(self) -> Callable[[Tensor, Tensor], Tensor]:
        """MNRL's similarity of two embedding matrices (cosine unless given)."""
        return self._similarity_fct

    def contrastive_options(self) -> dict[str, Any]:
        """MNRL's options of this loss, as :meth:`get_config_dict` reports them."""
        return {
            "temperature": self.temperature,
            "similarity_fct": similarity_fct_name(self.similarity_fct),
            "gather_across_devices": self.gather_across_devices,
            "directions": self.directions,
            "partition_mode": self.partition_mode,
            "hardness_mode": self.hardness_mode,
            "hardness_strength": self.hardness_strength,
        }

    def forward(self, sentence_features: Iterable[dict[str, Tensor]], labels: Tensor | None = None) -> Tensor:
        sentence_features = list(sentence_features)
        if not sentence_features:
            raise ValueError(f"{type(self).__name__} needs at least one text column, got none")
        return self.compute_loss_from_embeddings(embed_columns(self.model, sentence_features), labels)

    def compute_loss_from_embeddings(self, embeddings: list[Tensor], labels: Tensor | None = None) -> Tensor:
        """Loss from per-column embeddings: column 0 are anchors, column 1 positives, further columns negatives."""
        result = contrastive_loss(embeddings, self.settings, statistics=self.track_statistics)
        self._last = EmbeddingsLoss(result.loss.detach(), result.statistics, result.anchors.detach(),
                                    result.candidates.detach())  # fmt: skip
        return result.loss

    @property
    def last_batch(self) -> EmbeddingsLoss | None:
        """The last batch's detached loss, λ statistics (0-d tensors, on the device), anchors and candidates; None
        before the first step. Reading it does not synchronise the device (:attr:`last_statistics` does)."""
        return self._last

    @property
    def last_statistics(self) -> dict[str, float]:
        """The last batch's mean λ, share λ > 0.5, ρ_0, mean ΔAIC and mean β̂ (empty before the first step, and for
        InfoNCE without ``track_statistics``). Reading them synchronises the device, once; a non-finite last loss
        is reported here with the culprit rows."""
        return read_statistics(self._last)

    last_diagnostics = renamed_attribute("last_diagnostics", "last_statistics")
