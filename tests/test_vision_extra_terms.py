"""The authors' optional top-M extra terms: global tail slope, EMA of beta_t, known answers
(docs/method.md#vision-the-top-m-extra-terms)."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from simcse_weince.vision.extra_terms import ExtraTermsConfig, TopMExtraTerms, global_tail_slope


@pytest.mark.parametrize("beta", [2.0, 5.0])
def test_global_tail_slope_recovers_a_weibull_index(beta):
    # F(d) = d^beta on [0, 1]: the lower tail of the shortfalls is exactly Weibull with index beta
    uniform = torch.rand(40_000, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    slope, r2 = global_tail_slope(uniform ** (1 / beta))
    assert slope == pytest.approx(beta, rel=0.1) and r2 > 0.95


def test_global_tail_slope_degenerate_inputs():
    assert math.isnan(global_tail_slope(torch.tensor([0.1, 0.2]))[0])
    slope, r2 = global_tail_slope(torch.zeros(100))  # every shortfall floored at eps: no spread
    assert math.isnan(slope) and r2 == 0.0


def _reference(z1, z2, beta, tau, num_hard):
    """Brute force in float64: 0.5 CE[-beta log(1 - s)] + 0.5 CE[s / tau] over [positive | M hardest]."""
    z = F.normalize(torch.cat([z1, z2]).double(), dim=1)
    sims = z @ z.T
    n = len(z1)
    total = 0.0
    for i in range(2 * n):
        positive = (i + n) % (2 * n)
        negatives = sorted((j for j in range(2 * n) if j not in (i, positive)), key=lambda j: -sims[i, j])
        chosen = sims[i, [positive, *negatives[:num_hard]]]
        shortfall = -beta * torch.log(1 - chosen)
        total += 0.5 * (torch.logsumexp(shortfall, 0) - shortfall[0])
        total += 0.5 * (torch.logsumexp(chosen / tau, 0) - chosen[0] / tau)
    return total / (2 * n)


def test_known_answer_and_gradient():
    generator = torch.Generator().manual_seed(1)
    z1 = torch.randn(6, 4, generator=generator, requires_grad=True)
    z2 = torch.randn(6, 4, generator=generator, requires_grad=True)
    extra = TopMExtraTerms(ExtraTermsConfig(num_hard=3)).eval()  # eval: beta_t stays at its initial 4.0
    loss = extra(z1, z2, temperature=0.5)
    expected = _reference(z1.detach(), z2.detach(), 4.0, 0.5, 3)
    assert loss.item() == pytest.approx(expected.item(), rel=1e-5)
    loss.backward()
    assert torch.isfinite(z1.grad).all() and z1.grad.abs().sum() > 0
    # M above the number of negatives: all 2N - 2 of them
    assert TopMExtraTerms().eval()(z1, z2, temperature=0.5).item() == pytest.approx(
        _reference(z1.detach(), z2.detach(), 4.0, 0.5, 10).item(), rel=1e-5
    )


def test_beta_ema_update_rule_and_state():
    generator = torch.Generator().manual_seed(2)
    z1, z2 = torch.randn(16, 8, generator=generator), torch.randn(16, 8, generator=generator)
    extra = TopMExtraTerms(ExtraTermsConfig(min_r2=0.0)).train()  # accept any batch slope
    extra(z1, z2, temperature=0.5)
    slope = extra.last_statistics["batch_slope"]
    assert extra.beta.item() == pytest.approx(0.9 * 4.0 + 0.1 * min(max(slope, 0.5), 16.0))
    strict = TopMExtraTerms(ExtraTermsConfig(min_r2=1.01)).train()  # never accepted: beta_t stays
    strict(z1, z2, temperature=0.5)
    assert strict.beta.item() == 4.0 and strict.last_statistics["slope_accepted"] == 0.0
    restored = TopMExtraTerms()
    restored.load_state_dict(extra.state_dict())
    assert restored.beta.item() == extra.beta.item()
