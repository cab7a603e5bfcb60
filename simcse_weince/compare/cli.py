"""``simcse-weince compare`` (text) and ``simcse-weince vision compare``: train every variant x seed and
summarise the paired differences.

Each variant is a set of overrides of the base config (the preset, ``--config FILE`` and the flags, as for
``train``); each cell is an ordinary run in ``DIR/<variant>/seed-<s>``. Running the same command again skips the
finished cells and resumes an interrupted one (Ctrl-C or SIGTERM saves a checkpoint first); a finished cell is
reused only under the same settings and training data, checked for every cell before any trains. Results:
``DIR/comparison.json``, ``comparison.md``, ``comparison.png``.
"""

# This docstring is the description both commands show. The wiring below knows no trainer: each trainer's CLI
# module registers its own ``compare`` with add_compare_command, handing its CellKind (what differs: the config
# class, the presets, the variants, what a cell runs).

from __future__ import annotations

import argparse
import functools
from pathlib import Path

from simcse_weince.compare.cells import CellKind, load_variants
from simcse_weince.compare.sweep import compare
from simcse_weince.settings import add_config_flags, apply_overrides, overrides_from_args, read_config_file

#: the ``--output-dir`` of a sweep: not optional (one run per cell goes under it)
OUTPUT_DIR_FLAG = {
    "required": True,
    "metavar": "DIR",
    "help": "the sweep folder: DIR/<variant>/seed-<s> per run, and the comparison files",
}


def add_compare_command(subparsers, kind: CellKind, *, help: str, epilog: str) -> argparse.ArgumentParser:
    """Add the ``compare`` sub-command of ``kind``'s trainer to ``subparsers``: the sweep flags, ``--preset`` when
    the kind has presets, one flag per setting of its config, and :func:`run_compare` for ``kind`` as ``func``.
    ``help`` is its line in the trainer's command list; ``epilog`` its examples."""
    parser = subparsers.add_parser(
        "compare",
        help=help,
        description=__doc__,
        epilog=epilog,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sweep = add_sweep_flags(parser)
    if kind.presets:
        sweep.add_argument("--preset", default=None, choices=list(kind.presets),
                           help=f"the base settings (default {kind.presets[0]})")  # fmt: skip
    defaults = "the preset" if kind.presets else f"{kind.config_class.__name__}'s"
    add_config_flags(
        parser,
        kind.config_class,
        f"base settings of every run (defaults: {defaults})",
        kind.aliases,
        kind.field_choices,
        flag_options={"output_dir": OUTPUT_DIR_FLAG},
    )
    parser.set_defaults(func=functools.partial(run_compare, kind=kind))
    return parser


def add_sweep_flags(parser: argparse.ArgumentParser):
    """The flags of a sweep that are not settings (--losses, --variants-file, --seeds, --baseline, --config,
    --print-config), in the argument group it returns."""
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


def select_variants(args: argparse.Namespace, kind: CellKind) -> dict[str, dict]:
    """The variants named by --losses (all of them without it), from ``kind``'s built-ins and --variants-file."""
    known = load_variants(args.variants_file, kind.variants) if args.variants_file else dict(kind.variants)
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


def build_base_config(args: argparse.Namespace, kind: CellKind):
    """The base config: the kind's preset (``--preset``, else its first) or, for a kind without presets, its
    default config < --config FILE < flags (--seed is not allowed: --seeds sets it per run)."""
    flags = overrides_from_args(args)
    if "seed" in flags:
        raise ValueError("--seed does not apply to compare: use --seeds")
    overrides = {**(read_config_file(args.config) if args.config else {}), **flags}
    start = kind.base_config(args.preset or kind.presets[0]) if kind.presets else kind.base_config()
    return apply_overrides(start, overrides, kind.aliases)


def run_compare(args: argparse.Namespace, kind: CellKind) -> int:
    """The ``compare`` command of ``kind``'s trainer: every cell trained, read or resumed; the table printed."""
    import yaml

    variants = select_variants(args, kind)
    seeds = parse_seeds(args.seeds)
    base = build_base_config(args, kind)
    if args.baseline not in variants:
        raise ValueError(f"the baseline {args.baseline!r} is not among the variants ({', '.join(variants)}); "
                         f"add it to --losses or choose --baseline")  # fmt: skip
    if args.print_config:
        print(yaml.safe_dump({"base": base.to_dict(), "variants": variants, "seeds": seeds,
                              "baseline": args.baseline}, sort_keys=False), end="")  # fmt: skip
        return 0
    compare(base, variants, seeds, base.output_dir, kind=kind, baseline=args.baseline)
    output_dir = Path(base.output_dir).expanduser()
    print((output_dir / "comparison.md").read_text(encoding="utf-8"), end="")
    print(f"comparison in {output_dir}: comparison.json, comparison.md, comparison.png")
    return 0
