"""The authors' optional top-M extra terms, for faithful vision reproductions only. Off by default.

The method: docs/method.md#vision-the-top-m-extra-terms.

Their CIFAR-100 reproduction script adds, on top of the main loss and over the set
[positive | M = 50 hardest negatives] of every anchor (SimCLR geometry, 2N anchors):

- ``0.5 * CE`` with logits ``-beta_t * log(1 - s)``, where ``beta_t`` is a *batch-global* tail slope: a Weibull
  line ``log F_r`` on ``log delta_(r)`` through the smallest ``max(1024, 5%)`` shortfalls ``delta = 1 - s`` of all
  negatives of the batch (burn-in ``k // 20``, plotting positions ``r / (k + 1)``), accepted when its R^2 >= 0.85,
  clamped to [0.5, 16] and smoothed by an EMA (momentum 0.9, initial 4.0);
- ``0.5 * CE`` with logits ``s / tau`` over the same set.

The baseline of the paper is plain NT-Xent (no extra terms). ``beta_t`` is a training state: it is saved in
checkpoints (``state_dict``) and only updated in training mode. Within a step the EMA is updated first and the
updated value is used.

Example::

    extra = TopMExtraTerms()
    loss = weince_loss(z1, z2, temperature=0.5, geometry="simclr") + extra(z1, z2, temperature=0.5)
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass
class ExtraTermsConfig:
    """Settings of the top-M extra terms; the defaults are the authors' script."""

    num_hard: int = 50  # M, hardest negatives per anchor
    shortfall_weight: float = 0.5  # weight of the CE with logits -beta_t log(1 - s)
    softmax_weight: float = 0.5  # weight of the CE with logits s / tau
    tail_min_points: int = 1024  # the global tail holds max(tail_min_points, tail_fraction * #negatives)
    tail_fraction: float = 0.05
    min_r2: float = 0.85  # a batch slope is used only when the Weibull line fits at least this well
    beta_min: float = 0.5
    beta_max: float = 16.0
    momentum: float = 0.9
    initial_beta: float = 4.0
    eps: float = 1e-6

    def to_dict(self) -> dict:
        return asdict(self)


def global_tail_slope(
    shortfalls: torch.Tensor, *, min_points: int = 1024, fraction: float = 0.05, eps: float = 1e-6
) -> tuple[float, float]:
    """Weibull slope and R^2 of the lower tail of a set of shortfalls ``1 - s`` (any shape, pooled).

    Takes the ``k = min(n, max(min_points, round(fraction * n)))`` smallest shortfalls (floored at ``eps``), drops
    the ``k // 20`` smallest (burn-in) and regresses ``log(r / (k + 1))`` on ``log delta_(r)``. If ``F(d) ~ d^beta``
    near 0, the slope estimates beta. Returns ``(nan, 0.0)`` when fewer than 3 points remain.
    """
    values = shortfalls.detach().reshape(-1).to(torch.float64).clamp_min(eps)
    n = values.numel()
    k = min(n, max(int(min_points), round(fraction * n)))
    burn_in = k // 20
    if k - burn_in < 3:
        return math.nan, 0.0
    smallest = torch.topk(values, k, largest=False, sorted=True).values
    ranks = torch.arange(1, k + 1, dtype=torch.float64, device=values.device)
    x = smallest.log()[burn_in:]
    y = (ranks / (k + 1)).log()[burn_in:]
    x_centred, y_centred = x - x.mean(), y - y.mean()
    sxx = (x_centred**2).sum()
    if sxx <= 1e-12:
        return math.nan, 0.0
    slope = (x_centred * y_centred).sum() / sxx
    residual = y_centred - slope * x_centred
    r2 = 1.0 - (residual**2).sum() / (y_centred**2).sum().clamp_min(1e-12)
    return float(slope), float(r2)


class TopMExtraTerms(nn.Module):
    """``0.5 CE[-beta_t log(1 - s)] + 0.5 CE[s / tau]`` over [positive | M hardest negatives].

    Inputs are the two views' projections ``z1, z2`` (N x d each, SimCLR geometry, gathered across processes
    in distributed training). Returns the weighted sum of the two cross-entropies (float32).
    """

    def __init__(self, config: ExtraTermsConfig | None = None):
        super().__init__()
        self.config = config or ExtraTermsConfig()
        self.register_buffer("beta", torch.tensor(float(self.config.initial_beta), dtype=torch.float64))
        self.last_statistics: dict[str, float] = {}

    @torch.no_grad()
    def update_beta(self, negative_shortfalls: torch.Tensor) -> None:
        cfg = self.config
        slope, r2 = global_tail_slope(
            negative_shortfalls, min_points=cfg.tail_min_points, fraction=cfg.tail_fraction, eps=cfg.eps
        )
        accepted = math.isfinite(slope) and r2 >= cfg.min_r2
        if accepted:
            observed = min(max(slope, cfg.beta_min), cfg.beta_max)
            self.beta.mul_(cfg.momentum).add_((1.0 - cfg.momentum) * observed)
        self.last_statistics = {"batch_slope": slope, "batch_r2": r2, "slope_accepted": float(accepted)}

    def forward(self, z1: torch.Tensor, z2: torch.Tensor, *, temperature: float) -> torch.Tensor:
        cfg = self.config
        views = F.normalize(torch.cat([z1, z2]).float(), dim=1)
        sims = views @ views.T
        two_n = sims.shape[0]
        n = two_n // 2
        positives = torch.cat([torch.arange(n, two_n), torch.arange(0, n)]).to(sims.device)
        excluded = F.one_hot(positives, two_n).bool() | torch.eye(two_n, dtype=torch.bool, device=sims.device)
        with torch.no_grad():
            if self.training:
                self.update_beta(1.0 - sims.detach()[~excluded])
            num_hard = min(cfg.num_hard, two_n - 2)
            hardest = sims.detach().masked_fill(excluded, float("-inf")).topk(num_hard, dim=1).indices
        # column 0: the positive, then the M hardest negatives (gradients flow through s)
        selected = torch.cat([sims.gather(1, positives[:, None]), sims.gather(1, hardest)], dim=1)
        target = torch.zeros(two_n, dtype=torch.long, device=sims.device)
        shortfall_logits = -self.beta.float() * torch.log((1.0 - selected).clamp_min(cfg.eps))
        loss_shortfall = F.cross_entropy(shortfall_logits, target)
        loss_softmax = F.cross_entropy(selected / float(temperature), target)
        self.last_statistics.update(
            {
                "beta_t": float(self.beta),
                "extra_shortfall_ce": float(loss_shortfall.detach()),
                "extra_softmax_ce": float(loss_softmax.detach()),
            }
        )
        return cfg.shortfall_weight * loss_shortfall + cfg.softmax_weight * loss_softmax
