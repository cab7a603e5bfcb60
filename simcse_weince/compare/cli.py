"""``simcse-weince compare`` (text) and ``simcse-weince vision compare``: train every variant x seed and
summarise the paired differences.

Each variant is a set of overrides of the base config (the preset, ``--config FILE`` and the flags, as for
``train``); each cell is an ordinary run in ``DIR/<variant>/seed-<s>``. Running the same command again skips the
finished cells and resumes an interrupted one (Ctrl-C or SIGTERM saves a checkpoint first); a finished cell is
reused only under the same settings and training data, checked for every cell before any trains. Results:
``DIR/comparison.json``, ``comparison.md``, ``comparison.png``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from simcse_weince.compare.cells import CellKind, load_variants
from simcse_weince.compare.sweep import compare
from simcse_weince.settings import add_config_flags, apply_overrides, overrides_from_args, read_config_file
from simcse_weince.text.cells import TEXT_CELLS
from simcse_weince.text.config import FIELD_CHOICES, PRESETS, TrainConfig, preset

# simcse_weince.vision is imported where ``vision compare`` needs it: that command exists only when the vision
# command is registered (simcse_weince.cli leaves out a part of the product that is not installed)

COMPARE_EXAMPLES = """examples:
  simcse-weince compare --preset cpu-demo --losses infonce,weince --seeds 1,2,3 --output-dir runs/compare
  simcse-weince compare --preset paper --seeds 1,2,3,4,5 --output-dir runs/paper-compare   # every variant
  simcse-weince compare --variants-file my_variants.yaml --losses infonce,q03 --output-dir runs/q03
    # my_variants.yaml:  q03: {loss: weince, weince: {quantile: 0.3}}
"""
VISION_COMPARE_EXAMPLES = """examples:
  simcse-weince vision compare --dataset digits --image-size 16 --batch-size 64 --num-epochs 30 \\
      --losses infonce,weince,untrained --seeds 1,2,3,4,5 --output-dir runs/digits-compare
  simcse-weince vision compare --dataset cifar10 --losses infonce,weince --output-dir runs/c10-compare   # paper
variants: infonce, weince, weince-reference (beta 1), untrained (0 epochs: the initialised backbone of each seed)
"""


def register(subparsers) -> None:
    """``simcse-weince compare`` (text variants over a preset) and, when the ``vision`` command is registered,
    ``simcse-weince vision compare``."""
    parser = subparsers.add_parser(
        "compare",
        help="train variants (losses) over several seeds and compare them, paired by seed",
        description=__doc__,
        epilog=COMPARE_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sweep = add_sweep_flags(parser)
    sweep.add_argument("--preset", default=None, choices=list(PRESETS), help="the base settings (default paper)")
    finish_parser(parser, TrainConfig, FIELD_CHOICES, task="text")
    vision = subparsers.choices.get("vision")
    if vision is not None:  # the vision command keeps its sub-commands in .commands (simcse_weince.vision.cli)
        register_vision(vision.commands)


def register_vision(subparsers) -> None:
    """``simcse-weince vision compare``: SimCLR variants (and the untrained backbone) over a data set."""
    from simcse_weince.vision.config import DEPRECATED_NAMES, VisionTrainConfig
    from simcse_weince.vision.config import FIELD_CHOICES as VISION_FIELD_CHOICES

    parser = subparsers.add_parser(
        "compare",
        help="pretrain variants (losses, untrained) over several seeds; kNN and linear probe, paired by seed",
        description=__doc__,
        epilog=VISION_COMPARE_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_sweep_flags(parser)
    finish_parser(parser, VisionTrainConfig, VISION_FIELD_CHOICES, task="vision", aliases=DEPRECATED_NAMES)


def add_sweep_flags(parser: argparse.ArgumentParser) -> argparse._ArgumentGroup:
    sweep = parser.add_argument_group("comparison")
    sweep.add_argument("--losses", default=None, metavar="NAMES",
                       help="comma-separated variant names (default: every built-in variant)")  # fmt: skip
    sweep.add_argument("--variants-file", default=None, metavar="FILE",
                       help="YAML of extra variants: name -> settings, merged over the built-in ones")  # fmt: skip
    sweep.add_argument(
        "--seeds", default="1,2,3,4,5", metavar="SEEDS", help="comma-separated seeds (default 1,2,3,4,5)"
    )
    sweep.add_argument("--baseline", default="infonce", metavar="NAME", help="the variant compared against")
    sweep.add_argument("--config", metavar="FILE", help="YAML/JSON file of base settings (WEINCE ones under 'weince:')")
    sweep.add_argument("--print-config", action="store_true", help="print the base config and the variants, and exit")
    return sweep


def finish_parser(parser, config_class, choices, *, task: str, aliases=None) -> None:
    defaults = "the preset" if task == "text" else "VisionTrainConfig's"
    add_config_flags(parser, config_class, f"base settings of every run (defaults: {defaults})", aliases, choices)
    for action in parser._actions:  # the sweep folder is not optional (one run per cell goes under it)
        if action.dest == "set:output_dir":
            action.required = True
            action.metavar = "DIR"
            action.help = "the sweep folder: DIR/<variant>/seed-<s> per run, and the comparison files"
    parser.set_defaults(func=run_compare, compare_task=task)


def is_vision(args: argparse.Namespace) -> bool:
    """Whether the parsed command is ``vision compare`` (``compare`` alone is the text sweep)."""
    return getattr(args, "compare_task", "text") == "vision"


def cell_kind(args: argparse.Namespace) -> CellKind:
    """The kind of cell the parsed command sweeps: VISION_CELLS for ``vision compare``, TEXT_CELLS for ``compare``
    (this wiring is the one place of compare that knows the trainer packages)."""
    if is_vision(args):
        from simcse_weince.vision.cells import VISION_CELLS

        return VISION_CELLS
    return TEXT_CELLS


def select_variants(args: argparse.Namespace) -> dict[str, dict]:
    """The variants named by --losses (all of them without it), from the built-ins and --variants-file."""
    builtins = cell_kind(args).variants
    known = load_variants(args.variants_file, builtins) if args.variants_file else dict(builtins)
    if args.losses is None:
        return known
    names = [name.strip() for name in args.losses.split(",") if name.strip()]
    unknown = [name for name in names if name not in known]
    if unknown:
        raise ValueError(f"unknown variant(s) {', '.join(unknown)}; known: {', '.join(known)}")
    if not names:
        raise ValueError(f"--losses names no variant; known: {', '.join(known)}")
    return {name: known[name] for name in names}


def parse_seeds(text: str) -> list[int]:
    """The seeds of ``--seeds 1,2,3``, every one checked before any cell trains (an empty item is a typo, not a
    separator to skip)."""
    parts = [part.strip() for part in text.split(",")]
    if "" in parts:
        raise ValueError(f"--seeds {text!r} has an empty item (item {parts.index('') + 1}); give comma-separated "
                         f"integers, e.g. 1,2,3")  # fmt: skip
    try:
        seeds = [int(part) for part in parts]
    except ValueError:
        raise ValueError(f"--seeds must be comma-separated integers, got {text!r}") from None
    negative = [seed for seed in seeds if seed < 0]
    if negative:
        raise ValueError(f"--seeds must be integers >= 0, got {negative[0]} in {text!r}")
    if len(set(seeds)) != len(seeds):
        raise ValueError(f"--seeds must name each seed once, got {text!r}")
    return seeds


def build_base_config(args: argparse.Namespace):
    """The base config: text, the preset (vision, the defaults) < --config FILE < flags (--seed is not allowed:
    --seeds sets it per run)."""
    flags = overrides_from_args(args)
    if "seed" in flags:
        raise ValueError("--seed does not apply to compare: use --seeds")
    overrides = {**(read_config_file(args.config) if args.config else {}), **flags}
    if is_vision(args):
        kind = cell_kind(args)
        return apply_overrides(kind.config_class(), overrides, kind.aliases)
    return apply_overrides(preset(args.preset or "paper"), overrides)


def run_compare(args: argparse.Namespace) -> int:
    import yaml

    variants = select_variants(args)
    seeds = parse_seeds(args.seeds)
    base = build_base_config(args)
    if args.baseline not in variants:
        raise ValueError(f"the baseline {args.baseline!r} is not among the variants ({', '.join(variants)}); "
                         f"add it to --losses or choose --baseline")  # fmt: skip
    if args.print_config:
        print(yaml.safe_dump({"base": base.to_dict(), "variants": variants, "seeds": seeds,
                              "baseline": args.baseline}, sort_keys=False), end="")  # fmt: skip
        return 0
    compare(base, variants, seeds, base.output_dir, kind=cell_kind(args), baseline=args.baseline)
    output_dir = Path(base.output_dir).expanduser()
    print((output_dir / "comparison.md").read_text(encoding="utf-8"), end="")
    print(f"comparison in {output_dir}: comparison.json, comparison.md, comparison.png")
    return 0
