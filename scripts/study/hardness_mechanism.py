"""Study 3's mechanism (docs/experiments.md, "Study 3"): where each loss puts its gradient among the similarities.

For the four variants, on 8 fixed batches of 64 training sentences of setting A (drawn with seed 20; two dropout
views each, SimCSE's positive pairs, the dropout masks drawn from a fixed seed) or of 64 (anchor, positive) rows of a
two-column table (``--train-file``, setting C's SICK pairs), with an encoder given as a model
folder (the untrained starting model, or a trained cell's exported model): the gradient of each variant's loss with
respect to every similarity s_ij, |∂L/∂s_ij| per anchor, from the same embeddings for every variant. Reported over
all anchors and over the anchors WEINCE gates (λ_i > ½; λ from the same tail statistics for every variant):

- ``positive_share``: the positive's share of the anchor's total mass;
- ``top1`` / ``top5`` / ``top20``: among the negatives, the share of their mass on the 1, 5, 20 hardest (by s_ij);
- ``effective_negatives``: exp(entropy) of the negatives' normalised mass.

The losses are written on the similarity matrix with the core's public pieces (``weince_logits``, the hardness
term's ``α · stop_grad(s_ij)``); :func:`similarity_gradients` checks that each equals the trainer's loss
(``weince_loss`` / ``infonce_loss`` on the embeddings) before its gradient is used. Writes ``mechanism.json`` and
``mechanism.png`` (mean mass against the negatives' similarity rank, one line per variant)::

    python scripts/study/hardness_mechanism.py --encoder untrained=bundled:all-MiniLM-L6-v2 \\
        --encoder trained-seed21=<grid>/cpu-cls/{variant}/seed-21/model --alphas 9,9 --output-dir results/...
"""

from __future__ import annotations

import argparse
import json
import logging
import math
from pathlib import Path

import torch

from simcse_weince.weince.loss import cosine_similarity_matrix, infonce_loss, weince_logits, weince_loss

VARIANTS = ("infonce", "weince", "infonce-hardness", "weince-hardness")
TOP = (1, 5, 20)
GATE = 0.5


def variant_losses(alphas: tuple[float, float]) -> dict[str, tuple[str, float]]:
    """variant -> (loss, α): the hardness variants at the α the pilot chose (peer's, ours)."""
    return {"infonce": ("infonce", 0.0), "weince": ("weince", 0.0),
            "infonce-hardness": ("infonce", alphas[0]), "weince-hardness": ("weince", alphas[1])}  # fmt: skip


def similarity_gradients(anchors, positives, *, loss: str, temperature: float, hardness_strength: float):
    """(∂L/∂S, S, λ) for one batch: S the A x A cosine matrix (positive on the diagonal), in float64.

    The loss is written on S; it must equal the trainer's loss on the embeddings (checked here), so the gradient is
    the one training follows (through S, the only way the embeddings enter the loss)."""
    anchors, positives = anchors.detach().double(), positives.detach().double()
    _, stats = weince_loss(anchors, positives, temperature=temperature, return_stats=True)
    mixing_weight, beta = stats["mixing_weight"], stats["beta"]
    sims = cosine_similarity_matrix(anchors, positives).detach().requires_grad_(True)
    if loss == "weince":
        logits = weince_logits(sims, mixing_weight, beta, temperature)
        reference = weince_loss(anchors, positives, temperature=temperature, hardness_strength=hardness_strength)
    else:
        logits = sims / temperature
        reference = infonce_loss(anchors, positives, temperature=temperature, hardness_strength=hardness_strength)
    if hardness_strength:
        negatives = ~torch.eye(len(sims), dtype=torch.bool)
        logits = logits + hardness_strength * sims.detach() * negatives
    value = torch.nn.functional.cross_entropy(logits, torch.arange(len(sims)))
    if not math.isclose(value.item(), reference.item(), rel_tol=1e-9, abs_tol=1e-12):
        raise RuntimeError(f"{loss} (α {hardness_strength}) on S is {value.item()}, the trainer's {reference.item()}")
    (grad,) = torch.autograd.grad(value, sims)
    return grad, sims.detach(), mixing_weight.double()


def mass_summary(grad: torch.Tensor, sims: torch.Tensor) -> dict[str, torch.Tensor]:
    """Per anchor: the positive's share, the top-k shares of the negatives' mass, exp(entropy), and the
    negatives' normalised mass by similarity rank (hardest first)."""
    mass = grad.abs()
    eye = torch.eye(len(mass), dtype=torch.bool)
    positive = mass[eye]
    negative_sims = sims.masked_fill(eye, -math.inf)
    order = negative_sims.argsort(dim=1, descending=True)[:, :-1]  # the anchor's own column sorts last
    ranked = mass.gather(1, order)
    ranked = ranked / ranked.sum(dim=1, keepdim=True).clamp_min(1e-300)
    entropy = -(ranked * ranked.clamp_min(1e-300).log()).sum(dim=1)
    summary = {"positive_share": positive / mass.sum(dim=1).clamp_min(1e-300),
               "effective_negatives": entropy.exp(), "by_rank": ranked}  # fmt: skip
    for k in TOP:
        summary[f"top{k}"] = ranked[:, :k].sum(dim=1)
    return summary


def fixed_batches(train_file: Path, *, batches: int, batch_size: int, seed: int) -> list[list[tuple[str, ...]]]:
    """Rows drawn with ``seed``: one sentence (plain text: setting A, B, D) or an (anchor, positive) pair (a table of
    two columns: setting C's SICK pairs), as the trainer reads the file."""
    from simcse_weince.text.data import load_training_data

    dataset, columns, _ = load_training_data(train_file)
    if len(columns) > 2:
        raise ValueError(f"{train_file}: {len(columns)} columns; the mechanism takes sentences or (anchor, positive)")
    generator = torch.Generator().manual_seed(seed)
    picked = torch.randperm(len(dataset), generator=generator)[: batches * batch_size].tolist()
    rows = [tuple(dataset[i][column] for column in columns) for i in picked]
    return [rows[b * batch_size : (b + 1) * batch_size] for b in range(batches)]


def encode_views(model_path: str, batches: list[list[tuple[str, ...]]], *, max_length: int, seed: int):
    """(anchors, positives) of every batch, [CLS] (the pooler every trained cell exports), dropout on as in training,
    masks from ``seed``: two dropout views of one sentence, or the pair's two sentences."""
    from transformers import AutoModel, AutoTokenizer

    from simcse_weince.paths import resolve_model_path

    path = resolve_model_path(model_path)
    tokenizer, encoder = AutoTokenizer.from_pretrained(path), AutoModel.from_pretrained(path)
    encoder.train()  # dropout on: the two views are SimCSE's positive pair

    def embed(sentences):
        inputs = tokenizer(list(sentences), padding=True, truncation=True, max_length=max_length, return_tensors="pt")
        return encoder(**inputs).last_hidden_state[:, 0]

    torch.manual_seed(seed)
    views = []
    with torch.no_grad():
        for rows in batches:
            columns = list(zip(*rows))
            views.append((embed(columns[0]), embed(columns[-1])))  # one column: the same sentences twice
    return views


def analyse(views, losses: dict[str, tuple[str, float]], temperature: float) -> dict:
    out = {}
    for variant, (loss, alpha) in losses.items():
        per_anchor, gates = [], []
        for anchors, positives in views:
            grad, sims, mixing_weight = similarity_gradients(
                anchors, positives, loss=loss, temperature=temperature, hardness_strength=alpha
            )
            per_anchor.append(mass_summary(grad, sims))
            gates.append(mixing_weight > GATE)
        merged = {name: torch.cat([summary[name] for summary in per_anchor]) for name in per_anchor[0]}
        gated = torch.cat(gates)
        groups = {"all": torch.ones_like(gated), "gated": gated}
        out[variant] = {"loss": loss, "hardness_strength": alpha, "gated_share": float(gated.double().mean())}
        for group, rows in groups.items():
            if not bool(rows.any()):
                out[variant][group] = None
                continue
            out[variant][group] = {name: float(value[rows].mean()) for name, value in merged.items()
                                   if name != "by_rank"}  # fmt: skip
            out[variant][group]["by_rank"] = merged["by_rank"][rows].mean(dim=0).tolist()
    return out


def plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    encoders = list(results)
    figure, axes = plt.subplots(1, len(encoders), figsize=(5.5 * len(encoders), 4), squeeze=False)
    for axis, encoder in zip(axes[0], encoders):
        for variant, summary in results[encoder].items():
            by_rank = summary["all"]["by_rank"]
            axis.plot(range(1, len(by_rank) + 1), by_rank, label=variant)
        axis.set(xscale="log", yscale="log", xlabel="negative's similarity rank (1 = hardest)",
                 ylabel="share of the negatives' gradient mass", title=encoder)  # fmt: skip
        axis.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--encoder", action="append", required=True,
        help="name=model folder; {variant} in the folder is replaced by each variant's name",
    )  # fmt: skip
    parser.add_argument("--alphas", required=True, help="the pilot's α: infonce-hardness,weince-hardness")
    parser.add_argument(
        "--train-file",
        default=None,
        help="setting A's sentences (default: wiki1m_head.txt), or a table of (anchor, positive) pairs",
    )
    parser.add_argument("--temperature", type=float, default=0.05)
    parser.add_argument("--max-length", type=int, default=32)
    parser.add_argument("--batches", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--seed", type=int, default=20)
    parser.add_argument("--output-dir", required=True)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    try:
        alphas = tuple(float(a) for a in args.alphas.split(","))
        assert len(alphas) == 2
    except (ValueError, AssertionError):
        parser.error(f"--alphas takes two numbers (infonce-hardness,weince-hardness), got {args.alphas!r}")
    from simcse_weince.paths import resolve_data_dir

    train_file = Path(args.train_file) if args.train_file else resolve_data_dir() / "wiki1m_head.txt"
    batches = fixed_batches(train_file, batches=args.batches, batch_size=args.batch_size, seed=args.seed)
    losses = variant_losses(alphas)
    results = {}
    for spec in args.encoder:
        name, _, folder = spec.partition("=")
        if not folder:
            parser.error(f"--encoder takes name=folder, got {spec!r}")
        if "{variant}" in folder:  # each variant's own trained encoder
            results[name] = {}
            for variant in VARIANTS:
                views = encode_views(folder.format(variant=variant), batches, max_length=args.max_length,
                                     seed=args.seed)  # fmt: skip
                results[name].update(analyse(views, {variant: losses[variant]}, args.temperature))
        else:
            views = encode_views(folder, batches, max_length=args.max_length, seed=args.seed)
            results[name] = analyse(views, losses, args.temperature)
    output_dir = Path(args.output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    (output_dir / "mechanism.json").write_text(json.dumps(results, indent=2), encoding="utf-8")
    plot(results, output_dir / "mechanism.png")
    print("| encoder | variant | anchors | positive share | top 1 | top 5 | top 20 | effective negatives |")
    print("|---|---|---|---:|---:|---:|---:|---:|")
    for encoder, by_variant in results.items():
        for variant, summary in by_variant.items():
            for group in ("all", "gated"):
                row = summary[group]
                if row is None:
                    continue
                shown = f"{group} ({summary['gated_share']:.0%} gated)" if group == "gated" else group
                print(f"| {encoder} | `{variant}` | {shown} | {row['positive_share']:.3f} | {row['top1']:.3f} | "
                      f"{row['top5']:.3f} | {row['top20']:.3f} | {row['effective_negatives']:.1f} |")  # fmt: skip


if __name__ == "__main__":
    main()
