"""``simcse-weince vision``: SimCLR pretraining with WEINCE or InfoNCE, and frozen-feature evaluation.

    simcse-weince vision train --dataset cifar10 --backbone resnet18 --loss weince --output-dir runs/c10-weince
    simcse-weince vision train ... --resume                 # continue from the run's latest checkpoint
    simcse-weince vision eval runs/c10-weince               # -> runs/c10-weince/checkpoints/step_N/results.json

Multi-GPU: ``accelerate launch -m simcse_weince.cli vision train ...`` (``--batch-size`` is the global batch).
Only argparse is imported here; torch and torchvision load when a command runs.
"""

from __future__ import annotations

import argparse

# Kept in sync with datasets.DATASETS / backbones.BACKBONES (a test checks it) so that --help stays light.
DATASET_CHOICES = ("cifar10", "cifar100", "stl10", "imagenet32", "tiny_imagenet", "fake", "digits")
BACKBONE_CHOICES = ("resnet18", "resnet50", "vit_small")


def _beta(value: str):
    if value == "estimated":
        return value
    try:
        return float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be 'estimated' or a positive number, got {value!r}") from None


def register(subparsers) -> None:
    vision = subparsers.add_parser(
        "vision",
        help="SimCLR pretraining with WEINCE/InfoNCE on torchvision backbones; linear probe and kNN",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    commands = vision.add_subparsers(dest="vision_command", metavar="{train,eval}")
    vision.set_defaults(func=lambda args: vision.print_help() or 2)

    train = commands.add_parser("train", help="pretrain a backbone with SimCLR (WEINCE or InfoNCE)")
    train.add_argument("--dataset", choices=DATASET_CHOICES, default="cifar10")
    train.add_argument("--backbone", choices=BACKBONE_CHOICES, default="resnet18")
    train.add_argument("--loss", choices=("weince", "infonce"), default="weince")
    train.add_argument("--epochs", type=int, default=100)
    train.add_argument("--batch-size", type=int, default=256, help="global batch size (default: 256)")
    train.add_argument("--max-steps", type=int, default=None, help="stop after this many steps")
    train.add_argument("--output-dir", required=True)
    train.add_argument("--seed", type=int, default=0)
    train.add_argument(
        "--resume",
        nargs="?",
        const="latest",
        default=None,
        metavar="CHECKPOINT",
        help="continue from a checkpoint (default: the latest one in --output-dir)",
    )
    train.add_argument("--lr", type=float, default=3e-4, help="Adam learning rate (default: 3e-4)")
    train.add_argument("--weight-decay", type=float, default=0.0)
    train.add_argument("--temperature", type=float, default=0.5, help="tau (default: 0.5)")
    train.add_argument(
        "--beta",
        type=_beta,
        default="estimated",
        help="WEINCE exponent: 'estimated' (paper) or a number (1.0: code)",
    )
    train.add_argument("--extra-terms", action="store_true", help="add the authors' top-50 extra terms (spec sec. 7)")
    train.add_argument("--image-size", type=int, default=None, help="default: the data set's native size")
    train.add_argument("--stem", choices=("auto", "cifar", "imagenet"), default="auto")
    train.add_argument("--vit-layers", type=int, default=None, help="ViT depth override (default: 12)")
    train.add_argument("--projection-dim", type=int, default=64)
    train.add_argument("--train-size", type=int, default=None, help="use a fixed random subset of the images")
    train.add_argument("--mixed-precision", choices=("no", "fp16", "bf16"), default="no")
    train.add_argument("--num-workers", type=int, default=0)
    train.add_argument("--save-every", type=int, default=None, help="checkpoint every N steps (default: epochs)")
    train.add_argument("--log-every", type=int, default=10)
    train.add_argument("--data-dir", default=None, help="default: $SIMCSE_WEINCE_DATA_DIR or ~/.cache")
    train.add_argument("--no-download", action="store_true", help="never download missing data")
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


def run_train(args) -> int:
    from simcse_weince.vision.train import VisionTrainConfig, train
    from simcse_weince.weince import WeinceConfig

    config = VisionTrainConfig(
        dataset=args.dataset,
        backbone=args.backbone,
        loss=args.loss,
        output_dir=args.output_dir,
        data_dir=args.data_dir,
        download=False if args.no_download else None,
        image_size=args.image_size,
        stem=args.stem,
        vit_layers=args.vit_layers,
        projection_dim=args.projection_dim,
        epochs=args.epochs,
        batch_size=args.batch_size,
        learning_rate=args.lr,
        weight_decay=args.weight_decay,
        temperature=args.temperature,
        weince=WeinceConfig(beta=args.beta),
        extra_terms=args.extra_terms,
        max_steps=args.max_steps,
        train_size=args.train_size,
        mixed_precision=args.mixed_precision,
        num_workers=args.num_workers,
        seed=args.seed,
        save_every=args.save_every,
        log_every=args.log_every,
    )
    resume = None
    if args.resume is not None:
        resume = args.output_dir if args.resume == "latest" else args.resume
    result = train(config, resume=resume)
    print(f"trained {result['global_step']} steps; checkpoint: {result['checkpoint']}")
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
