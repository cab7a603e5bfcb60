"""``simcse-weince vision``: SimCLR pretraining with WEINCE or InfoNCE, and frozen-feature evaluation.

    simcse-weince vision train --dataset cifar10 --backbone resnet18 --loss weince --output-dir runs/c10-weince
    simcse-weince vision train ... --resume                 # continue from the run's latest checkpoint
    simcse-weince vision eval runs/c10-weince               # -> runs/c10-weince/checkpoints/step-N/results.json
    simcse-weince vision compare --dataset digits --losses infonce,weince,untrained --output-dir runs/d-compare

Multi-GPU: ``accelerate launch -m simcse_weince.cli vision train ...`` (``--batch-size`` is the global batch).
Only argparse is imported here; torch and torchvision load when a command runs.
"""

from __future__ import annotations

import argparse

from simcse_weince.vision.config import DATASET_CHOICES

TRAIN_EXAMPLES = """examples:
  simcse-weince vision train --dataset cifar10 --loss weince --output-dir runs/c10-weince
  simcse-weince vision train --dataset digits --num-epochs 15 --batch-size 128 --quantile 0.3 --output-dir runs/d
  simcse-weince vision train --output-dir runs/c10-weince --resume        # continue a killed run
"""
COMPARE_EXAMPLES = """examples:
  simcse-weince vision compare --dataset digits --image-size 16 --batch-size 64 --num-epochs 30 \\
      --losses infonce,weince,untrained --seeds 1,2,3,4,5 --output-dir runs/digits-compare
  simcse-weince vision compare --dataset cifar10 --losses infonce,weince --output-dir runs/c10-compare   # paper
variants: infonce, weince, weince-reference (beta 1), untrained (0 epochs: the initialised backbone of each seed)
"""


def register(subparsers) -> None:
    vision = subparsers.add_parser(
        "vision",
        help="SimCLR pretraining with WEINCE/InfoNCE on torchvision backbones; linear probe and kNN",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    commands = vision.add_subparsers(dest="vision_command", metavar="{train,eval,compare}")
    vision.set_defaults(func=lambda args: vision.print_help() or 2)

    train = commands.add_parser(
        "train",
        help="pretrain a backbone with SimCLR (WEINCE or InfoNCE)",
        description="Every field of VisionTrainConfig and of WeinceConfig is a flag; settings apply in the order "
        "defaults < --config FILE < flags (--resume starts from the run's saved training_config.yaml).",
        epilog=TRAIN_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    from simcse_weince.settings import add_run_flags

    run = add_run_flags(train)
    run.add_argument(
        "--no-download", dest="set:download", action="store_const", const="false", help="same as --download false"
    )
    from simcse_weince.settings import add_config_flags
    from simcse_weince.vision.config import DEPRECATED_NAMES, FIELD_CHOICES, VisionTrainConfig

    add_config_flags(train, VisionTrainConfig, "training settings", DEPRECATED_NAMES, FIELD_CHOICES)
    train.set_defaults(func=run_train)

    evaluate = commands.add_parser("eval", help="linear probe and kNN of a checkpoint's frozen backbone")
    evaluate.add_argument("checkpoint", help="a checkpoint folder, or a run folder (its latest checkpoint)")
    evaluate.add_argument("--dataset", choices=DATASET_CHOICES, default=None, help="default: the pretraining one")
    evaluate.add_argument("--data-dir", default=None)
    evaluate.add_argument("--no-download", action="store_true")
    evaluate.add_argument("--train-size", type=int, default=None, help="subset of the labelled training images")
    evaluate.add_argument("--test-size", type=int, default=None, help="subset of the test images")
    evaluate.add_argument("--batch-size", type=int, default=256)
    evaluate.add_argument("--probe-seeds", type=int, nargs="+", default=[0, 1, 2])
    evaluate.add_argument("--probe-epochs", type=int, default=100)
    evaluate.add_argument("--knn-k", type=int, nargs="+", default=[1, 2, 5, 10, 20, 50])
    evaluate.add_argument("--knn-temperature", type=float, default=0.1)
    evaluate.add_argument("--device", default="cpu")
    evaluate.add_argument("--output", default=None, help="results.json path (default: in the checkpoint folder)")
    evaluate.set_defaults(func=run_eval)

    from simcse_weince.compare.cli import add_compare_command
    from simcse_weince.vision.cells import VISION_CELLS

    add_compare_command(
        commands,
        VISION_CELLS,
        help="pretrain variants (losses, untrained) over several seeds; kNN and linear probe, paired by seed",
        epilog=COMPARE_EXAMPLES,
    )


def build_config(args):
    """The resolved VisionTrainConfig: defaults (or the saved run, with --resume) < --config FILE < flags."""
    from simcse_weince.settings import resolve_config
    from simcse_weince.training.run_folder import config_of_record
    from simcse_weince.vision.config import DEPRECATED_NAMES, VisionTrainConfig

    return resolve_config(VisionTrainConfig(), args, DEPRECATED_NAMES, saved_file=config_of_record)


def run_train(args) -> int:
    import yaml

    config = build_config(args)
    if args.print_config:
        print(yaml.safe_dump(config.to_dict(), sort_keys=False), end="")
        return 0
    from simcse_weince.training.timing import format_time_parts
    from simcse_weince.vision.trainer import train

    result = train(config, resume=args.resume, overwrite=args.overwrite)
    print(f"trained {result['step']} steps, wall time {format_time_parts(result)}; checkpoint: {result['checkpoint']}")
    return 0


def run_eval(args) -> int:
    import json
    from pathlib import Path

    from simcse_weince.vision.evaluate import LinearProbeConfig, evaluate_checkpoint, results_markdown

    if args.probe_epochs < 1:
        raise ValueError(f"--probe-epochs must be >= 1, got {args.probe_epochs}")
    results = evaluate_checkpoint(
        args.checkpoint,
        dataset=args.dataset,
        data_dir=args.data_dir,
        download=False if args.no_download else None,
        train_size=args.train_size,
        test_size=args.test_size,
        batch_size=args.batch_size,
        probe=LinearProbeConfig(epochs=args.probe_epochs, seeds=tuple(args.probe_seeds)),
        ks=tuple(args.knn_k),
        knn_temperature=args.knn_temperature,
        device=args.device,
    )
    output = Path(args.output) if args.output else Path(results["checkpoint"]) / "results.json"
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(results, indent=2))
    table = results_markdown(results)
    output.with_suffix(".md").write_text(table)
    print(table)
    print(f"wrote {output} and {output.with_suffix('.md')}")
    return 0
