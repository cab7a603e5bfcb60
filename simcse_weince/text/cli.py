"""``simcse-weince train`` and ``simcse-weince push``.

Every field of :class:`simcse_weince.text.config.TrainConfig` is a flag (``--batch-size 32``, ``--final-tasks
stsb,sickr``, ``--max-steps none``), and so is every field of :class:`simcse_weince.WeinceConfig`, as
``--weince.quantile 0.3`` or simply ``--quantile 0.3``. Settings are applied in this order: the preset
(``paper`` by default), then ``--config FILE`` (YAML or JSON), then the flags. ``--resume`` starts from the
run's saved ``training_config.yaml`` instead of the preset.
"""

from __future__ import annotations

import argparse

TRAIN_EXAMPLES = """examples:
  simcse-weince train --preset cpu-demo                         # MiniLM on 11,914 sentences, a few minutes on a CPU
  simcse-weince train --preset cpu-demo --loss infonce --output-dir runs/demo-infonce
  accelerate launch -m simcse_weince.cli train --preset paper --mixed-precision bf16    # BERT-base, SimCSE's recipe
  simcse-weince train --preset paper --quantile 0.3 --beta 1.0 --output-dir runs/q03   # WEINCE settings
  simcse-weince train --output-dir runs/q03 --resume                                   # continue a killed run
"""

COMPARE_EXAMPLES = """examples:
  simcse-weince compare --preset cpu-demo --losses infonce,weince --seeds 1,2,3 --output-dir runs/compare
  simcse-weince compare --preset paper --seeds 1,2,3,4,5 --output-dir runs/paper-compare   # every variant
  simcse-weince compare --variants-file my_variants.yaml --losses infonce,q03 --output-dir runs/q03
    # my_variants.yaml:  q03: {loss: weince, weince: {quantile: 0.3}}
"""


def register(subparsers) -> None:
    train_parser = subparsers.add_parser(
        "train",
        help="train a sentence encoder with unsupervised SimCSE (WEINCE or InfoNCE)",
        description=__doc__,
        epilog=TRAIN_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    from simcse_weince.settings import add_run_flags
    from simcse_weince.text.config import PRESETS

    add_run_flags(train_parser).add_argument(
        "--preset",
        default=None,
        choices=list(PRESETS),
        help="paper (default: BERT-base on wiki1m), cpu-demo (MiniLM, mean pooling) or cpu-cls (MiniLM, SimCSE's cls)",
    )
    from simcse_weince.settings import add_config_flags
    from simcse_weince.text.config import FIELD_CHOICES, TrainConfig

    title = "training settings (defaults: the preset; the paper's are shown)"
    add_config_flags(train_parser, TrainConfig, title, choices=FIELD_CHOICES)
    train_parser.set_defaults(func=run_train)

    push_parser = subparsers.add_parser(
        "push",
        help="upload a trained model folder to the Hugging Face Hub",
        description="Upload a folder written by `simcse-weince train` (model, README.md model card, results.json, "
        "training_config.yaml, logs; checkpoints are left out) to a model repository on the Hub.",
    )
    push_parser.add_argument("directory", metavar="DIR", help="the --output-dir of a training run")
    push_parser.add_argument("repo_id", metavar="REPO_ID", help="e.g. your-name/simcse-weince-minilm")
    push_parser.add_argument("--private", action="store_true", help="create the repository as private")
    push_parser.add_argument("--token", default=None, help="Hub token (default: HF_TOKEN or `hf auth login`)")
    push_parser.add_argument("--commit-message", default="Upload SimCSE model trained with simcse-weince")
    push_parser.set_defaults(func=run_push)


def register_compare(subparsers) -> None:
    """``simcse-weince compare``: the text variants (:data:`~simcse_weince.text.cells.TEXT_VARIANTS`) over a
    preset, one ``train`` run per cell (:data:`~simcse_weince.text.cells.TEXT_CELLS`). (This module's docstring is
    ``train``'s description, so it names only ``train`` and ``push``.)"""
    from simcse_weince.compare.cli import add_compare_command
    from simcse_weince.text.cells import TEXT_CELLS

    add_compare_command(
        subparsers,
        TEXT_CELLS,
        help="train variants (losses) over several seeds and compare them, paired by seed",
        epilog=COMPARE_EXAMPLES,
    )


def build_config(args: argparse.Namespace):
    """The resolved TrainConfig: preset (or the saved run, with --resume) < --config FILE < flags."""
    from simcse_weince.settings import resolve_config
    from simcse_weince.text.config import preset
    from simcse_weince.training.run_folder import config_of_record

    return resolve_config(preset(args.preset or "paper"), args, saved_file=config_of_record)


def run_train(args: argparse.Namespace) -> int:
    import yaml

    config = build_config(args)
    if args.print_config:
        print(yaml.safe_dump(config.to_dict(), sort_keys=False), end="")
        return 0
    from pathlib import Path

    from simcse_weince.text.results import format_summary
    from simcse_weince.text.trainer import train

    results = train(config, resume=args.resume, overwrite=args.overwrite)
    if results:  # the main process
        print(format_summary(results, Path(config.output_dir).expanduser()))
    return 0


def run_push(args: argparse.Namespace) -> int:
    from simcse_weince.hub import push_folder

    url = push_folder(
        args.directory,
        args.repo_id,
        private=args.private,
        token=args.token,
        commit_message=args.commit_message,
    )
    print(f"pushed {args.directory} to https://huggingface.co/{args.repo_id} ({url})")
    return 0
