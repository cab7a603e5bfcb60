"""``simcse-weince train`` and ``simcse-weince push``.

Every field of :class:`simcse_weince.train.TrainConfig` is a flag (``--batch-size 32``, ``--final-tasks
stsb,sickr``, ``--max-steps none``), and so is every field of :class:`simcse_weince.WeinceConfig`, as
``--weince.quantile 0.3`` or simply ``--quantile 0.3``. Settings are applied in this order: the preset
(``paper`` by default), then ``--config FILE`` (YAML or JSON), then the flags. ``--resume`` starts from the
run's saved ``training_config.yaml`` instead of the preset.
"""

from __future__ import annotations

import argparse
import sys

TRAIN_EXAMPLES = """examples:
  simcse-weince train --preset cpu-demo                         # MiniLM on 11,914 sentences, a few minutes on a CPU
  simcse-weince train --preset cpu-demo --loss infonce --output-dir runs/demo-infonce
  accelerate launch -m simcse_weince.cli train --preset paper --mixed-precision bf16    # BERT-base, SimCSE's recipe
  simcse-weince train --preset paper --quantile 0.3 --beta 1.0 --output-dir runs/q03   # WEINCE settings
  simcse-weince train --output-dir runs/q03 --resume                                   # continue a killed run
"""


def register(subparsers) -> None:
    train_parser = subparsers.add_parser(
        "train",
        help="train a sentence encoder with unsupervised SimCSE (WEINCE or InfoNCE)",
        description=__doc__,
        epilog=TRAIN_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    from simcse_weince.train import PRESETS

    run = train_parser.add_argument_group("run")
    run.add_argument(
        "--preset",
        default=None,
        choices=list(PRESETS),
        help="paper (default: BERT-base on wiki1m), cpu-demo (MiniLM, mean pooling) or cpu-cls (MiniLM, SimCSE's cls)",
    )
    run.add_argument("--config", metavar="FILE", help="YAML/JSON file of settings (WEINCE ones under 'weince:')")
    run.add_argument(
        "--resume",
        nargs="?",
        const="latest",
        default=None,
        metavar="CHECKPOINT",
        help="continue the run in --output-dir from its newest checkpoint (or from CHECKPOINT)",
    )
    run.add_argument("--overwrite", action="store_true", help="replace an earlier run in --output-dir")
    run.add_argument("--print-config", action="store_true", help="print the resolved config and exit")
    _add_config_flags(train_parser)
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


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _add_config_flags(parser: argparse.ArgumentParser) -> None:
    """One flag per config field; values are type-checked when the config is built (see train.convert_value)."""
    from simcse_weince.train import TrainConfig
    from simcse_weince.weince import WeinceConfig

    defaults = TrainConfig().to_dict()
    group = parser.add_argument_group("training settings (defaults: the preset; the paper's are shown)")
    for field in TrainConfig.__dataclass_fields__.values():
        if field.name == "weince":
            continue
        default = defaults[field.name]
        group.add_argument(
            _flag(field.name),
            dest=f"set:{field.name}",
            default=argparse.SUPPRESS,
            metavar=field.name.upper(),
            help=f"default {','.join(default) if isinstance(default, list) else default}",
            **({"nargs": "?", "const": "true"} if field.type == "bool" else {}),
        )
    loss_group = parser.add_argument_group("WEINCE settings (also --weince.NAME; defaults: WeinceConfig)")
    for field in WeinceConfig.__dataclass_fields__.values():
        loss_group.add_argument(
            _flag(field.name),
            f"--weince.{field.name}",
            dest=f"set:weince.{field.name}",
            default=argparse.SUPPRESS,
            metavar=field.name.upper(),
            help=f"default {getattr(WeinceConfig(), field.name)}",
        )


def build_config(args: argparse.Namespace):
    """The resolved TrainConfig and the resume target: preset (or the saved run) < --config FILE < flags."""
    from pathlib import Path

    from simcse_weince.train import CONFIG_FILE, apply_overrides, load_config, preset, read_config_file

    overrides = read_config_file(args.config) if args.config else {}
    overrides.update({key.removeprefix("set:"): value for key, value in vars(args).items() if key.startswith("set:")})
    config = apply_overrides(preset(args.preset or "paper"), overrides)
    if args.resume:
        saved = Path(config.output_dir).expanduser() / CONFIG_FILE
        if saved.is_file():
            base = load_config(saved)
            config = apply_overrides(base, overrides)
            changed = [
                name for name, value in config.to_dict().items() if value != base.to_dict()[name] and name != "weince"
            ]
            changed += [
                f"weince.{name}"
                for name, value in config.to_dict()["weince"].items()
                if value != base.to_dict()["weince"][name]
            ]
            if changed:
                print(
                    f"warning: resuming with settings that differ from the saved run: {', '.join(changed)} "
                    "(the continuation is then not the uninterrupted run)",
                    file=sys.stderr,
                )
    return config


def run_train(args: argparse.Namespace) -> int:
    import yaml

    config = build_config(args)
    if args.print_config:
        print(yaml.safe_dump(config.to_dict(), sort_keys=False), end="")
        return 0
    from simcse_weince.train import train

    train(config, resume=args.resume, overwrite=args.overwrite)
    return 0


def push_folder(
    directory,
    repo_id: str,
    *,
    private: bool = False,
    token: str | None = None,
    commit_message: str = "Upload SimCSE model trained with simcse-weince",
) -> str:
    """Upload a trained model folder (without checkpoints) to the Hub; returns the commit URL.

    Raises clear RuntimeErrors when the Hub is offline, no token is available, or the upload fails.
    """
    import re
    from pathlib import Path

    from simcse_weince.paths import hub_is_offline

    folder = Path(directory)
    if not folder.is_dir():
        raise FileNotFoundError(f"model folder {folder} not found; pass the --output-dir of a `train` run")
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*(/[A-Za-z0-9][A-Za-z0-9_.-]*)?", repo_id) or ".." in repo_id:
        raise ValueError(f"invalid repository id {repo_id!r}: use NAME or OWNER/NAME (letters, digits, - _ .)")
    if not (folder / "modules.json").is_file():
        raise FileNotFoundError(
            f"{folder} is not a trained model folder (no modules.json); pass a --output-dir of `train`"
        )
    if hub_is_offline():
        raise RuntimeError("the Hugging Face Hub is offline (HF_HUB_OFFLINE is set): unset it to push")
    from huggingface_hub import HfApi, get_token
    from huggingface_hub.errors import HfHubHTTPError

    token = token or get_token()
    if not token:
        raise RuntimeError("no Hugging Face token: run `hf auth login`, set HF_TOKEN, or pass --token")
    api = HfApi(token=token)
    try:
        api.create_repo(repo_id, private=private, exist_ok=True, repo_type="model")
        commit = api.upload_folder(
            folder_path=str(folder),
            repo_id=repo_id,
            repo_type="model",
            commit_message=commit_message,
            ignore_patterns=["checkpoints/*", ".export-staging/*", "*.tmp"],
        )
    except HfHubHTTPError as error:
        raise RuntimeError(f"the Hub refused the upload to {repo_id}: {str(error).splitlines()[0]}") from error
    except Exception as error:  # connection errors (httpx / requests), timeouts
        raise RuntimeError(f"cannot reach the Hugging Face Hub to push {repo_id}: {error}") from error
    return getattr(commit, "commit_url", str(commit))


def run_push(args: argparse.Namespace) -> int:
    url = push_folder(
        args.directory,
        args.repo_id,
        private=args.private,
        token=args.token,
        commit_message=args.commit_message,
    )
    print(f"pushed {args.directory} to https://huggingface.co/{args.repo_id} ({url})")
    return 0
