"""The ``simcse-weince`` command: one entry point, one sub-command per job.

Each sub-command lives next to the code it drives and exposes ``register(subparsers)``, which adds its parser
and sets ``func`` (imports of heavy modules happen inside ``func``, so ``--help`` stays fast).
"""

from __future__ import annotations

import argparse
import importlib
import sys

# sub-command -> module with register(subparsers)
SUBCOMMANDS = {
    "train": "simcse_weince.train_cli",
    "push": "simcse_weince.train_cli",
    "evaluate": "simcse_weince.evaluation.cli",
    "diagnose": "simcse_weince.diagnostics.cli",
    "vision": "simcse_weince.vision.cli",
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="simcse-weince",
        description="Train and evaluate sentence/image encoders with WEINCE (extreme-value corrected InfoNCE).",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    registered = set()
    for module_name in dict.fromkeys(SUBCOMMANDS.values()):
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as error:
            if error.name and module_name.startswith(error.name):
                continue  # that part of the product is not installed in this checkout
            raise
        module.register(subparsers)
        registered.add(module_name)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        result = args.func(args)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except (ValueError, FileNotFoundError, FileExistsError, RuntimeError) as error:
        # Clear one-line messages for user errors; set SIMCSE_WEINCE_DEBUG=1 for the traceback.
        import os

        if os.environ.get("SIMCSE_WEINCE_DEBUG"):
            raise
        print(f"simcse-weince {args.command}: error: {error}", file=sys.stderr)
        return 1
    return int(result or 0)


if __name__ == "__main__":
    sys.exit(main())
