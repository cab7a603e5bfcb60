"""A CPU demonstration of supervised SimCSE on data that is here: SICK's entailment pairs, with its contradictions
as hard negatives. **A demonstration, not SimCSE's result** (that is BERT-base on 275k NLI triplets, preset
``paper-sup``).

From ``SICK_train.txt`` (SICK's training split; the 7-task table reads only SICK's test split, STS-B is another
corpus, so no evaluated split is trained on) it writes:

- ``sick_pairs.csv`` (``sent0,sent1``): every ENTAILMENT pair, premise -> hypothesis;
- ``sick_triplets.csv`` (``sent0,sent1,hard_neg``): the entailment pairs whose premise has a CONTRADICTION in the
  split (in either direction: contradiction is symmetric), that sentence as the hard negative.

then trains the bundled all-MiniLM-L6-v2 with the ``cls`` pooler on each (SimCSE's supervised settings otherwise:
MLP kept at evaluation, tau 0.05, length 32; 3 epochs, lr 5e-5) and prints STS-B dev/test before and after::

    python scripts/study/sick_supervised_demo.py --output-dir runs/sick-demo
"""

from __future__ import annotations

import argparse
import csv
import json
import logging
from collections import defaultdict
from pathlib import Path

from simcse_weince.paths import resolve_data_dir


def build_sick_files(data_dir: Path, output_dir: Path) -> dict[str, Path]:
    """Write ``sick_pairs.csv`` and ``sick_triplets.csv`` from SICK's training split; returns their paths."""
    source = Path(data_dir) / "senteval" / "downstream" / "SICK" / "SICK_train.txt"
    with open(source, encoding="utf-8", newline="") as handle:
        rows = list(csv.DictReader(handle, delimiter="\t", quoting=csv.QUOTE_NONE))
    contradictions: dict[str, list[str]] = defaultdict(list)
    entailments = []
    for row in rows:
        first, second, label = row["sentence_A"], row["sentence_B"], row["entailment_judgment"]
        if label == "CONTRADICTION":
            contradictions[first].append(second)
            contradictions[second].append(first)
        elif label == "ENTAILMENT":
            entailments.append((first, second))
    output_dir.mkdir(parents=True, exist_ok=True)
    paths = {"pairs": output_dir / "sick_pairs.csv", "triplets": output_dir / "sick_triplets.csv"}
    with open(paths["pairs"], "w", encoding="utf-8", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["sent0", "sent1"])
        writer.writerows(entailments)
    with open(paths["triplets"], "w", encoding="utf-8", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["sent0", "sent1", "hard_neg"])
        writer.writerows((premise, hypothesis, contradictions[premise][0])
                         for premise, hypothesis in entailments if contradictions[premise])  # fmt: skip
    return paths


def base_scores(data_dir: Path) -> dict[str, float]:
    """STS-B dev/test of the untrained MiniLM's [CLS] vector (no MLP: the head is new in every run)."""
    from simcse_weince.evaluation import stsb_spearman
    from simcse_weince.text.model import SimCSEModel

    model = SimCSEModel.from_pretrained("bundled:all-MiniLM-L6-v2", pooler="cls_before_pooler")
    return {split: float(stsb_spearman(model.encode, split=split, data_dir=data_dir)) for split in ("dev", "test")}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--output-dir", default="runs/sick-demo")
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--loss", default="weince", choices=("weince", "infonce"))
    parser.add_argument("--seed", type=int, default=42)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    from simcse_weince.text import preset, train

    data_dir, output_dir = resolve_data_dir(args.data_dir), Path(args.output_dir)
    files = build_sick_files(data_dir, output_dir / "data")
    report = {"base_cls": base_scores(data_dir), "runs": {}}
    for name, batch_size in (("pairs", 64), ("triplets", 32)):
        config = preset(
            "cpu-cls", train_file=str(files[name]), loss=args.loss, seed=args.seed, batch_size=batch_size,
            learning_rate=5e-5, num_epochs=3, mixed_precision="no", eval_steps=10, save_steps=0,
            eval_before_training=False, final_tasks=(), output_dir=str(output_dir / name),
        )  # fmt: skip
        results = train(config, overwrite=True)
        report["runs"][name] = {
            key: results[key]
            for key in ("num_train_rows", "stsb_dev_spearman", "stsb_test_spearman", "best_step", "total_steps")
        }
    (output_dir / "demo.json").write_text(json.dumps(report, indent=2), encoding="utf-8")
    base = report["base_cls"]
    print(f"MiniLM [CLS], untrained: STS-B dev {base['dev']:.2f}, test {base['test']:.2f}")
    for name, run in report["runs"].items():
        print(
            f"{name}: {run['num_train_rows']} rows, STS-B dev {run['stsb_dev_spearman']:.2f}, "
            f"test {run['stsb_test_spearman']:.2f} (best step {run['best_step']} of {run['total_steps']})"
        )


if __name__ == "__main__":
    main()
