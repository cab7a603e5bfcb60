"""The ``simcse-weince`` command: one entry point, one sub-command per job.

Each sub-command lives next to the code it drives and exposes ``register(subparsers)`` (or the function
:data:`SUBCOMMANDS` names), which adds its parser and sets ``func`` (imports of heavy modules happen inside
``func``, so ``--help`` stays fast).
"""

from __future__ import annotations

import argparse
import importlib
import sys

# sub-command -> "module" with register(subparsers), or "module:function"; registered in this order (the order of
# ``--help``), each function once. A trainer registers its own ``compare`` (simcse_weince.compare.cli's machinery
# with its CellKind): text's here, ``vision compare`` inside ``vision``.
SUBCOMMANDS = {
    "train": "simcse_weince.text.cli",
    "push": "simcse_weince.text.cli",
    "evaluate": "simcse_weince.evaluation.cli",
    "diagnose": "simcse_weince.diagnostics.cli",
    "vision": "simcse_weince.vision.cli",
    "compare": "simcse_weince.text.cli:register_compare",
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="simcse-weince",
        description="Train and evaluate sentence/image encoders with WEINCE (extreme-value corrected InfoNCE).",
        epilog="Errors print one line; add --debug (anywhere) for the full traceback.",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for target in dict.fromkeys(SUBCOMMANDS.values()):
        module_name, _, function = target.partition(":")
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as error:
            if error.name and module_name.startswith(error.name):
                continue  # that part of the product is not installed in this checkout
            raise
        getattr(module, function or "register")(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run a sub-command; returns the exit code: 0, 1 for an error (one line on stderr), 2 for bad usage, 130 for
    Ctrl-C and 143 for SIGTERM (128 + the signal's number; a training loop saves a checkpoint first).

    ``--debug`` (anywhere on the command line) or SIMCSE_WEINCE_DEBUG=1 shows the traceback instead.
    """
    import os

    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv or bool(os.environ.get("SIMCSE_WEINCE_DEBUG"))
    argv = [arg for arg in argv if arg != "--debug"]
    _show_library_warnings()
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    from simcse_weince.training.signals import exit_code, sigterm_interrupts

    try:
        with sigterm_interrupts():  # batch schedulers stop jobs with SIGTERM: handled as Ctrl-C
            result = args.func(args)
    except KeyboardInterrupt as interruption:  # Ctrl-C or SIGTERM; a training loop saved a checkpoint first
        code = exit_code(interruption)
        print("interrupted" + (f" by {interruption}" if code != 130 else ""), file=sys.stderr)
        return code
    except Exception as error:
        if debug:
            raise
        print(f"simcse-weince {args.command}: error: {error_line(error)}", file=sys.stderr)
        return 1
    return int(result or 0)


def _show_library_warnings() -> None:
    """The library logs through ``logging``; the CLI decides what reaches the terminal: its progress messages
    (INFO) as plain lines and its warnings as ``warning: ...`` lines, on stderr (stdout holds the results)."""
    import logging

    class StderrHandler(logging.Handler):
        def emit(self, record):
            print(self.format(record), file=sys.stderr)

    class Formatter(logging.Formatter):
        def format(self, record):
            message = record.getMessage()
            return f"warning: {message}" if record.levelno >= logging.WARNING else message

    logger = logging.getLogger("simcse_weince")
    if not any(type(handler).__name__ == "StderrHandler" for handler in logger.handlers):
        handler = StderrHandler()
        handler.setFormatter(Formatter())
        handler.setLevel(logging.INFO)
        logger.addHandler(handler)
        if logger.level == logging.NOTSET or logger.level > logging.INFO:
            logger.setLevel(logging.INFO)


#: exceptions whose message is written for the user; any other one is named by its type
USER_ERRORS = (ValueError, TypeError, FileNotFoundError, FileExistsError, NotADirectoryError, PermissionError)


def error_line(error: BaseException) -> str:
    """One line for an exception: its message (user errors) or its type and message, with the hint to use
    --debug for anything that looks like a bug."""
    text = " ".join(part.strip() for part in str(error).splitlines() if part.strip()) or type(error).__name__
    if isinstance(error, (*USER_ERRORS, RuntimeError)):
        return text
    if isinstance(error, OSError):
        return f"{type(error).__name__}: {text}"
    return f"{type(error).__name__}: {text} (rerun with --debug for the traceback)"


if __name__ == "__main__":
    sys.exit(main())
