"""Does WEINCE's per-anchor AIC gate tell Weibull-type tails from Gumbel-type ones at the batch sizes we train with?

Draws rows of negative similarities from known distributions, some in the Gumbel domain (Gaussian, an exponential
tail; both far from the endpoint 1) and some in the Weibull domain (shortfalls 1 - s with a power-law law near 0,
uniform), computes the tail statistics (docs/method.md#tail-statistics: the k hardest negatives, Weibull and Gumbel
lines, ΔAIC) exactly as the loss does, and prints per distribution the mean ΔAIC, the share of anchors whose AIC
gate is open (ΔAIC > m, λ^AIC > ½) and the mean β̂. A gate that discriminates would open for the Weibull rows and
stay shut for the Gumbel ones.

    python scripts/study/aic_gate_null.py                  # batch 64: 63 negatives, a tail of 32 points
    python scripts/study/aic_gate_null.py --negatives 255  # batch 256
"""

from __future__ import annotations

import argparse

import torch

from simcse_weince import WeinceConfig
from simcse_weince.weince.loss import tail_statistics


def distributions(rows: int, negatives: int) -> dict[str, tuple[str, torch.Tensor]]:
    shape = (rows, negatives)
    return {
        "Gaussian, mean 0.4, sd 0.1": ("Gumbel", 0.4 + 0.1 * torch.randn(shape)),
        "Gaussian, mean 0, sd 0.05": ("Gumbel", 0.05 * torch.randn(shape)),
        "exponential tail, 0.3 + Exp(scale 0.05)": ("Gumbel", 0.3 + 0.05 * torch.empty(shape).exponential_()),
        "shortfall 0.5 U^(1/2) (Weibull, β = 2)": ("Weibull", 1 - 0.5 * torch.rand(shape).sqrt()),
        "shortfall 0.5 U^(1/4) (Weibull, β = 4)": ("Weibull", 1 - 0.5 * torch.rand(shape).pow(0.25)),
        "uniform on [-1, 1] (Weibull, β = 1)": ("Weibull", 2 * torch.rand(shape) - 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--negatives", type=int, default=63, help="negatives per anchor (batch size - 1)")
    parser.add_argument("--rows", type=int, default=4000, help="anchors drawn per distribution")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.manual_seed(args.seed)
    weince = WeinceConfig()
    print(f"{args.negatives} negatives per anchor, {args.rows} anchors per distribution, AIC margin m = "
          f"{weince.aic_margin}\n")  # fmt: skip
    print("| negatives drawn from | domain | mean ΔAIC | AIC gate open (ΔAIC > m) | mean β̂ |")
    print("|---|---|---:|---:|---:|")
    for name, (domain, similarities) in distributions(args.rows, args.negatives).items():
        stats = tail_statistics(similarities.clamp(max=1.0).double(), weince, num_negatives=args.negatives)
        delta_aic = stats.delta_aic
        open_share = (delta_aic > weince.aic_margin).double().mean().item()
        print(f"| {name} | {domain} | {delta_aic.mean().item():.1f} | {100 * open_share:.1f}% | "
              f"{stats.beta_hat.mean().item():.2f} |")  # fmt: skip


if __name__ == "__main__":
    main()
