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

from sentence_transformers.sentence_transformer.losses import MultipleNegativesRankingLoss
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
        raise ValueError(f"Scale must be a positive value (finite: scale = 1 / temperature), got {scale!r}")
    return 1.0 / float(scale)


def is_cosine(similarity_fct) -> bool:
    """sentence-transformers' ``cos_sim``, also as a ``functools.partial`` that binds nothing."""
    if isinstance(similarity_fct, functools.partial) and not similarity_fct.args and not similarity_fct.keywords:
        similarity_fct = similarity_fct.func
    return similarity_fct is cos_sim


def setting(name: str, doc: str, field: str | None = None) -> property:
    """An option of a loss that is the field ``field`` (default: ``name``) of its validated
    :class:`ContrastiveSettings`; assigning it validates the settings again (effective at the next call)."""
    field = field or name

    def assign(self, value) -> None:
        self._replace_settings(**{field: value})

    return property(lambda self: getattr(self.settings, field), assign, doc=doc)


def check_similarity_fct(loss: nn.Module, similarity_fct) -> None:
    """Refuse what a loss cannot compute with: a non-callable, or (WEINCE) a similarity other than cosine."""
    if not callable(similarity_fct):
        raise ValueError(f"similarity_fct must be a function of two embedding matrices, got {similarity_fct!r}")
    if loss.loss_name == "weince" and not is_cosine(similarity_fct):
        raise ValueError(
            f"{type(loss).__name__} takes cosine similarity only (similarity_fct=cos_sim), got "
            f"{similarity_fct_name(similarity_fct)!r}: its shortfall logit -log(1 - s) needs similarities bounded "
            f"by 1; use InfoNCELoss for other similarities"
        )


def warn_ignored_hardness(settings: ContrastiveSettings) -> None:
    """Say so when ``hardness_strength`` is given without a ``hardness_mode`` (MNRL ignores it then, as we do)."""
    if settings.hardness_mode is None and settings.hardness_strength > 0:
        logger.warning(
            "hardness_strength=%g is ignored with hardness_mode=None, as in MultipleNegativesRankingLoss; name a "
            "hardness_mode (in_batch_negatives: LLaVE's weighting) to apply it",
            settings.hardness_strength,
        )


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
    one column: unsupervised SimCSE) with sentence-transformers' ``MultipleNegativesRankingLoss`` options, in its
    positional order and with its defaults. A subclass names its loss (``loss_name``: ``"weince"``, ``"infonce"``)
    and sets ``statistics_by_default`` (whether WEINCE's statistics of each batch are kept). The options are validated
    into :attr:`settings` when the loss is built and whenever one is assigned (``loss.directions = ...``: the same
    checks, effective at the next call), and every batch goes through
    :func:`~simcse_weince.losses.from_embeddings.contrastive_loss` with them."""

    loss_name: str
    statistics_by_default: bool = True  # the default of the option track_statistics

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        cls.__doc__ = fill_shared_sections(cls.__doc__)

    @renamed_keywords(config="weince")
    def __init__(
        self,
        model: nn.Module,
        scale: float | None = None,
        similarity_fct: Callable[[Tensor, Tensor], Tensor] = cos_sim,
        gather_across_devices: bool = False,
        directions: Sequence[str] = DEFAULT_DIRECTIONS,
        partition_mode: str = "joint",
        hardness_mode: str | None = DEFAULT_HARDNESS_MODE,
        hardness_strength: float = 0.0,
        *,
        temperature: float | None = None,
        weince: WeinceConfig | None = None,
        track_statistics: bool | None = None,
    ) -> None:
        # MNRL's signature, then this package's own options, keyword-only (what each means: the subclass's docstring)
        super().__init__()
        if scale is not None and not isinstance(scale, bool) and isinstance(scale, (int, float)) and 0 < scale < 1:
            logger.warning(
                "scale=%g is a temperature of %g (scale = 1 / temperature, MultipleNegativesRankingLoss's second "
                "positional argument); pass temperature=%g if that is what you meant",
                scale, 1 / scale, scale,
            )  # fmt: skip
        self.model = model
        similarity_fct = cos_sim if similarity_fct is None else similarity_fct
        check_similarity_fct(self, similarity_fct)
        self._store_similarity_fct(similarity_fct)
        self.settings = ContrastiveSettings(
            loss=self.loss_name, temperature=resolve_temperature(temperature, scale),
            weince=WeinceConfig() if weince is None else weince,  # its type: ContrastiveSettings checks it
            gather=gather_across_devices, hardness_strength=hardness_strength, directions=directions,
            partition_mode=partition_mode, hardness_mode=hardness_mode,
            similarity_fct=None if is_cosine(similarity_fct) else similarity_fct,
        )  # fmt: skip
        warn_ignored_hardness(self.settings)
        self.track_statistics = self.statistics_by_default if track_statistics is None else track_statistics
        # the last batch's loss, columns and statistics, for a lazy finiteness check when the statistics are read
        # (no per-step device synchronisation)
        self._last: EmbeddingsLoss | None = None
        self._last_training = True

    def __setattr__(self, name: str, value: Any) -> None:
        # nn.Module.__setattr__ would file an nn.Module value (a similarity_fct such as nn.CosineSimilarity) under
        # _modules, bypassing the property and its checks; an option goes through its property's setter instead
        if isinstance(getattr(type(self), name, None), property):
            object.__setattr__(self, name, value)
        else:
            super().__setattr__(name, value)

    def _replace_settings(self, **changes: Any) -> None:
        """Change options: validated as when the loss is built (:class:`ContrastiveSettings`), used from the next
        call on."""
        self.settings = dataclasses.replace(self.settings, **changes)

    weince = setting("weince", "The :class:`~simcse_weince.WeinceConfig` of the mixing weight (assignable).")
    config = renamed_attribute("config", "weince")
    gather_across_devices = setting(
        "gather", "Whether embeddings are gathered from all processes (with gradient; assignable).", field="gather"
    )
    directions = setting("directions", "MNRL's similarity blocks, a tuple (assignable).")
    partition_mode = setting("partition_mode", "MNRL's ``joint`` or ``per_direction`` (assignable).")
    hardness_mode = setting("hardness_mode", "MNRL's hard-negative weighting mode (None: off; assignable).")
    hardness_strength = setting("hardness_strength", "α of the hard-negative weighting (0: off; assignable).")

    @property
    def temperature(self) -> float:
        """τ (assignable: validated again)."""
        return self.settings.temperature

    @temperature.setter
    def temperature(self, value: float) -> None:
        self._replace_settings(temperature=check_temperature(value))

    @property
    def scale(self) -> float:
        """sentence-transformers' name for 1 / temperature (assignable, as MNRL's)."""
        return 1.0 / self.temperature

    @scale.setter
    def scale(self, value: float) -> None:
        self.temperature = resolve_temperature(None, value)

    @property
    def similarity_fct(self) -> Callable[[Tensor, Tensor], Tensor]:
        """MNRL's similarity of two embedding matrices (cosine unless given; assignable: any callable MNRL takes,
        an ``nn.Module`` included, for InfoNCE; cosine only for WEINCE)."""
        return self._similarity_fct

    @similarity_fct.setter
    def similarity_fct(self, value: Callable[[Tensor, Tensor], Tensor]) -> None:
        check_similarity_fct(self, value)
        if self.track_statistics and not is_cosine(value):
            raise ValueError(
                "track_statistics computes WEINCE's tail statistics, which need cosine similarity; set "
                "track_statistics = False before another similarity_fct"
            )
        self._replace_settings(similarity_fct=None if is_cosine(value) else value)
        self._store_similarity_fct(value)

    def _store_similarity_fct(self, value) -> None:
        # an nn.Module similarity is a submodule (moved with .to(), as MNRL's attribute of that name), kept under
        # the private name the property reads; nn.Module refuses a function where a module was, so it goes first
        try:
            del self._similarity_fct
        except AttributeError:
            pass
        self._similarity_fct = value

    @property
    def track_statistics(self) -> bool:
        """Whether each batch's λ statistics are kept (assignable)."""
        return self._track_statistics

    @track_statistics.setter
    def track_statistics(self, value: bool) -> None:
        if value and self.settings.similarity_fct is not None:
            raise ValueError(
                "track_statistics computes WEINCE's tail statistics, which need cosine similarity; leave "
                "similarity_fct unset or track_statistics off"
            )
        self._track_statistics = bool(value)

    def contrastive_options(self) -> dict[str, Any]:
        """MNRL's options of this loss under MNRL's keys, with MNRL's values (what :meth:`get_config_dict`
        reports first)."""
        return {
            "scale": self.scale,
            "similarity_fct": similarity_fct_name(self.similarity_fct),
            "gather_across_devices": self.gather_across_devices,
            "directions": self.directions,
            "partition_mode": self.partition_mode,
            "hardness_mode": self.hardness_mode,
            "hardness_strength": self.hardness_strength,
        }

    @property
    def recipe_citation(self) -> str:
        """The paper of the MNRL recipe these options are (as ``MultipleNegativesRankingLoss.citation`` picks it:
        GTE's for the four directions ``joint``, Jina's for the symmetric ``per_direction``, else InfoNCE's)."""
        return MultipleNegativesRankingLoss.citation.fget(self)

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
        # the model's mode tells a training batch from an evaluation one (the trainer's eval loop sets eval mode)
        self._last_training = bool(self.model.training)
        return result.loss

    @property
    def last_batch(self) -> EmbeddingsLoss | None:
        """The last batch's detached loss, λ statistics (0-d tensors, on the device), anchors and candidates; None
        before the first step. Reading it does not synchronise the device (:attr:`last_statistics` does)."""
        return self._last

    @property
    def last_batch_training(self) -> bool:
        """Whether the last batch was a training one (the model in training mode), not an evaluation one."""
        return self._last_training

    @property
    def last_statistics(self) -> dict[str, float]:
        """The last batch's mean λ, share λ > 0.5, ρ_0, mean ΔAIC and mean β̂ (empty before the first step, and for
        InfoNCE without ``track_statistics``). Reading them synchronises the device, once; a non-finite last loss
        is reported here with the culprit rows."""
        return read_statistics(self._last)

    last_diagnostics = renamed_attribute("last_diagnostics", "last_statistics")
