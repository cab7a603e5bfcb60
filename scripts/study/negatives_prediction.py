"""Study 2's prediction (docs/experiments.md): what WEINCE's statistics look like at 63, 255 and 1,023 negatives,
on the *untrained* ``cpu-cls`` encoder, before any comparison run.

Training geometry: the trainer's own model (MiniLM, [CLS] + the MLP head of seed 0, dropout on), two dropout views
of the first ``--sentences`` training sentences in the trainer's shuffled order, cut into contrastive batches of
each size; every batch goes through ``weince_loss(..., return_stats=True)``, exactly as a training step's loss
would, without a gradient. Printed and written per batch size: the share of anchors whose AIC gate is open
(ΔAIC above the margin), mean ΔAIC, mean and median β̂, mean λ, the share of λ > ½, ρ₀, the tail size k and the
InfoNCE and WEINCE losses of the untrained encoder. ``simcse-weince diagnose`` then adds the offline view (POT's ξ̂
of the negative similarities, the k-sweep) on the same encoder's evaluation embeddings, saved here as a
SentenceTransformer folder:

    OMP_NUM_THREADS=1 python scripts/study/negatives_prediction.py --output-dir runs/study/negatives-prediction
    simcse-weince diagnose runs/study/negatives-prediction/untrained-cpu-cls --data wiki1m_head.txt --pot --k-sweep \
        --batch-size 1024 --output-dir runs/study/negatives-prediction/diagnose
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from simcse_weince.text.config import preset
from simcse_weince.text.data import load_sentences, resolve_train_file
from simcse_weince.text.model import SimCSEModel
from simcse_weince.weince.loss import WeinceConfig, infonce_loss, weince_loss
from simcse_weince.weince.tail import _tail_size

BATCH_SIZES = (64, 256, 1024)


@torch.no_grad()
def training_embeddings(model: SimCSEModel, sentences: list[str], chunk: int = 64) -> tuple[torch.Tensor, ...]:
    """Two dropout views of each sentence through the trainer's model (training pooler: [CLS] + MLP head)."""
    config = preset("cpu-cls")
    model.train()
    first, second = [], []
    for start in range(0, len(sentences), chunk):
        inputs = model.tokenizer(sentences[start : start + chunk], padding=True, truncation=True,
                                 max_length=config.max_length, return_tensors="pt")  # fmt: skip
        views = model(inputs["input_ids"], inputs["attention_mask"], inputs.get("token_type_ids"), num_views=2)
        first.append(views[0])
        second.append(views[1])
    return torch.cat(first), torch.cat(second)


def batch_statistics(first: torch.Tensor, second: torch.Tensor, batch_size: int, weince: WeinceConfig) -> dict:
    """WEINCE's per-anchor statistics over every full batch of ``batch_size`` rows, pooled over anchors."""
    keys = ("delta_aic", "beta_hat", "mixing_weight", "rho")
    pooled: dict[str, list] = {key: [] for key in keys}
    rho0, losses, infonce = [], [], []
    for start in range(0, len(first) - batch_size + 1, batch_size):
        anchors, candidates = first[start : start + batch_size], second[start : start + batch_size]
        loss, stats = weince_loss(anchors, candidates, temperature=0.05, weince=weince, return_stats=True)
        for key in keys:
            pooled[key].append(stats[key])
        rho0.append(float(stats["rho0"]))
        losses.append(float(loss))
        infonce.append(float(infonce_loss(anchors, candidates, temperature=0.05)))
    values = {key: torch.cat(parts).double() for key, parts in pooled.items()}
    return {
        "batch_size": batch_size,
        "negatives_per_anchor": batch_size - 1,
        "tail_size_k": _tail_size(batch_size - 1, weince),
        "batches": len(losses),
        "anchors": int(values["rho"].numel()),
        "aic_gate_open_share": float((values["delta_aic"] > weince.aic_margin).double().mean()),
        "delta_aic_mean": float(values["delta_aic"].mean()),
        "beta_hat_mean": float(values["beta_hat"].mean()),
        "beta_hat_median": float(values["beta_hat"].median()),
        "lambda_mean": float(values["mixing_weight"].mean()),
        "lambda_above_half": float((values["mixing_weight"] > 0.5).double().mean()),
        "rho0_mean": sum(rho0) / len(rho0),
        "weince_loss": sum(losses) / len(losses),
        "infonce_loss": sum(infonce) / len(infonce),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--output-dir", default="runs/study/negatives-prediction")
    parser.add_argument("--sentences", type=int, default=4096, help="4 batches of 1,024, 16 of 256, 64 of 64")
    parser.add_argument("--seed", type=int, default=0, help="not a study seed")
    args = parser.parse_args()

    output_dir = Path(args.output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    sentences = load_sentences(resolve_train_file(preset("cpu-cls")))[0]["text"]
    order = torch.randperm(len(sentences), generator=torch.Generator().manual_seed(args.seed))[: args.sentences]
    torch.manual_seed(args.seed)  # the MLP head's initialisation, as the trainer seeds it
    model = SimCSEModel.from_pretrained(preset("cpu-cls").model, pooler="cls")
    # the untrained encoder as evaluation sees it ([CLS], no MLP), for `simcse-weince diagnose`
    model.save_sentence_transformer(output_dir / "untrained-cpu-cls")
    first, second = training_embeddings(model, [sentences[i] for i in order.tolist()])
    rows = [batch_statistics(first, second, batch, WeinceConfig()) for batch in BATCH_SIZES]
    (output_dir / "prediction.json").write_text(json.dumps({"seed": args.seed, "rows": rows}, indent=2))
    columns = ("negatives_per_anchor", "tail_size_k", "aic_gate_open_share", "delta_aic_mean", "beta_hat_mean",
               "beta_hat_median", "lambda_mean", "lambda_above_half", "rho0_mean", "infonce_loss",
               "weince_loss")  # fmt: skip
    print("| " + " | ".join(columns) + " |")
    print("|" + "---:|" * len(columns))
    for row in rows:
        print("| " + " | ".join(f"{row[c]:.3f}" if isinstance(row[c], float) else str(row[c]) for c in columns) + " |")


if __name__ == "__main__":
    main()
