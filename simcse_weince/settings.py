"""Run settings as dataclasses, read from YAML/JSON files and command-line flags: shared by every trainer.

A trainer's config is a dataclass whose nested sections are dataclass fields: ``weince`` holds a
:class:`~simcse_weince.WeinceConfig`, the text trainer's ``speed`` its fast path. Settings are applied as flat
overrides (``{"batch_size": 32, "weince.quantile": 0.3}``; a section's field may also be given by its short name,
``quantile``), each converted to the field's type, so a CLI string, a YAML value and a Python
value go through one path. :func:`add_config_flags` makes one flag per field (``--batch-size``,
``--weince.quantile`` / ``--quantile``); :func:`overrides_from_args` collects the flags that were given.

Nothing here imports torch: ``simcse-weince --help`` builds every flag from these dataclasses.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import types
import typing
from pathlib import Path

from simcse_weince.records import read_json, read_yaml, type_name
from simcse_weince.validation import describe_type

logger = logging.getLogger(__name__)

CONFIG_FILE = "training_config.yaml"  # a run's resolved config; its presence marks a folder as one of our runs
LOSSES = ("weince", "infonce")  # the contrastive objectives every trainer offers
REPORT_TO = ("csv", "tensorboard")  # the trackers every trainer offers
# sentence-transformers' MultipleNegativesRankingLoss options that the text trainer takes (the losses' surface;
# check_contrastive_options in losses/from_embeddings.py holds the rules)
DIRECTIONS = ("query_to_doc", "query_to_query", "doc_to_query", "doc_to_doc")
PARTITION_MODES = ("joint", "per_direction")
HARDNESS_MODES = ("in_batch_negatives", "hard_negatives", "all_negatives")  # or None: in_batch_negatives if α > 0


def convert_value(value, hint, name: str = "value"):
    """Turn ``value`` (a CLI string or a YAML/JSON value) into the type ``hint`` of a config field."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        is_none = value is None or (isinstance(value, str) and value.strip().lower() in ("none", "null"))
        if is_none and type(None) in args:
            return None
        for option in [arg for arg in args if arg is not type(None)]:
            try:
                return convert_value(value, option, name)
            except (TypeError, ValueError):
                continue
        raise ValueError(f"{name} must be {describe_type(hint)}, got {value!r}")
    if origin is typing.Literal:
        if value in args:
            return value
        raise ValueError(f"{name} must be one of {args}, got {value!r}")
    if origin is tuple:
        if not isinstance(value, (list, tuple, str)):  # a YAML boolean (``report_to: off``) or a number
            raise ValueError(f"{name} must be {describe_type(hint)}, got {wrong_type(value)}")
        if isinstance(value, (list, tuple)) and all(isinstance(item, str) for item in value):
            value = ",".join(value)  # a flag's space-separated values may hold commas too: "a b,c"
        if isinstance(value, str) and value.strip().lower() in ("none", "null"):
            return ()
        if isinstance(value, str):
            value = [part.strip() for part in value.split(",") if part.strip()]
        return tuple(convert_value(item, args[0], name) for item in value)
    if hint is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.strip().lower() in ("1", "true", "yes", "on"):
            return True
        if isinstance(value, str) and value.strip().lower() in ("0", "false", "no", "off"):
            return False
        raise ValueError(f"{name} must be true or false, got {value!r}")
    if hint is int:
        if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
            raise ValueError(f"{name} must be an integer, got {value!r}")
        try:
            return int(value)
        except (TypeError, ValueError):
            raise ValueError(f"{name} must be an integer, got {value!r}") from None
    if hint is float:
        if isinstance(value, bool):
            raise ValueError(f"{name} must be a number, got {value!r}")
        try:
            return float(value)
        except (TypeError, ValueError):
            raise ValueError(f"{name} must be a number, got {value!r}") from None
    if hint is str:
        if isinstance(value, os.PathLike):
            value = os.fspath(value)
        if not isinstance(value, str):
            raise ValueError(f"{name} must be a string, got {wrong_type(value)}")
        return value
    return value


def wrong_type(value) -> str:
    """How a refusal names a value of the wrong type read from a file or a flag; a boolean where none is expected
    was most often a YAML word (``no``, ``off``, ``yes``, ``on`` are read as booleans)."""
    if isinstance(value, bool):
        return (f"the boolean {str(value).lower()} (YAML reads no/off/yes/on as booleans: quote the word, or "
                f"write none for an empty list)")  # fmt: skip
    return f"{type_name(value)} ({value!r})"


def config_sections(cls) -> dict[str, type]:
    """The nested sections of a config class: each field whose type is a dataclass (``weince``: the loss's
    :class:`~simcse_weince.WeinceConfig`; the text trainer's ``speed``), by field name."""
    hints = typing.get_type_hints(cls)
    fields = dataclasses.fields(cls)
    return {field.name: hints[field.name] for field in fields if dataclasses.is_dataclass(hints[field.name])}


def flatten_overrides(values: dict, prefix: str = "", sections=None) -> dict:
    """``{"weince": {"quantile": 0.3}}`` -> ``{"weince.quantile": 0.3}`` (config files may nest or use dots).
    ``sections``: the config class's (:func:`config_sections`); None, where the class is not known yet (a config or
    variants file read before its trainer is chosen): every top-level mapping, checked against the class's own
    sections when :func:`apply_overrides` applies them (no config field holds a mapping)."""
    flat = {}
    for key, value in values.items():
        key = str(key).replace("-", "_")
        if not prefix and (sections is None or key in sections) and isinstance(value, dict):
            flat.update(flatten_overrides(value, prefix=f"{key}."))
        else:
            flat[prefix + key] = value
    return flat


def apply_overrides(config, overrides: dict, aliases: dict[str, str] | None = None):
    """A new config of ``config``'s class with ``overrides`` (flat, ``<section>.<field>`` for a nested section)
    applied and type-checked. A section's field may also be given by its short name (``quantile`` =
    ``weince.quantile``, ``length_chunks`` = ``speed.length_chunks``). ``aliases`` maps deprecated setting names to
    current ones (a warning names the new one)."""
    cls = type(config)
    config_types, sections = typing.get_type_hints(cls), config_sections(cls)
    section_types = {name: typing.get_type_hints(section) for name, section in sections.items()}
    short_names = {field: name for name, hints in section_types.items() for field in hints}
    values = {name: value for name, value in config.to_dict().items() if name not in sections}
    section_values = {name: dataclasses.asdict(getattr(config, name)) for name in sections}
    for key, value in flatten_overrides(overrides, sections=tuple(sections)).items():
        if aliases and key in aliases:
            logger.warning("the setting %r is deprecated; it is now %r", key, aliases[key])
            key = aliases[key]
        section, _, name = key.partition(".")
        if name and section in sections:
            if name not in section_types[section]:
                known = ", ".join(section_types[section])
                label = "WEINCE" if section == "weince" else section
                raise ValueError(f"unknown {label} setting {name!r}; known: {known}")
            section_values[section][name] = convert_value(value, section_types[section][name], key)
        elif key in config_types and key not in sections:
            values[key] = convert_value(value, config_types[key], key)
        elif key in short_names:  # the short form: quantile = weince.quantile
            section = short_names[key]
            section_values[section][key] = convert_value(value, section_types[section][key], key)
        else:
            raise ValueError(f"unknown config setting {key!r}; known: {', '.join(config_types)}")
    return cls(**values, **{name: sections[name](**section_values[name]) for name in sections})


def changed_settings(config, base) -> list[str]:
    """The names of the settings in which ``config`` differs from ``base`` (``<section>.<field>`` in a section)."""
    new, old, sections = config.to_dict(), base.to_dict(), config_sections(type(config))
    changed = [name for name, value in new.items() if name not in sections and value != old[name]]
    for section in sections:
        changed += [f"{section}.{name}" for name, value in new[section].items() if value != old[section][name]]
    return changed


def read_config_file(path: str | os.PathLike) -> dict:
    """Flat overrides from a YAML or JSON file (keys are TrainConfig fields, WEINCE fields under ``weince``)."""
    path = Path(path)
    # a key given twice is refused, naming it: the readers of JSON and YAML keep the last one without a word
    values = read_json(path, "config file") if path.suffix == ".json" else read_yaml(path, "config file")
    if values is None:
        return {}
    if not isinstance(values, dict):
        raise ValueError(f"config file {path} must hold a mapping of settings, got {type(values).__name__}")  # noqa: TRY004
    return flatten_overrides(values)


def save_config(config, path: Path) -> None:
    """The resolved config as YAML (``training_config.yaml`` in a run folder)."""
    import yaml

    path.write_text(yaml.safe_dump(config.to_dict(), sort_keys=False), encoding="utf-8")


def load_config(cls, path: Path, aliases: dict[str, str] | None = None):
    """A config of class ``cls`` from a YAML/JSON file of settings (as :func:`save_config` writes), read as it meant
    when it was written (``cls.read_recorded``, where the class has one)."""
    return apply_overrides(cls(), recorded_settings(cls, read_config_file(path)), aliases)


def recorded_settings(cls, values: dict) -> dict:
    """Recorded settings of a config class ``cls``, with what a file written before a setting existed meant by
    its absence (``cls.read_recorded(values)``; as they are for a class without one)."""
    read_recorded = getattr(cls, "read_recorded", None)
    return read_recorded(values) if read_recorded is not None else values


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _flag_arity(hint) -> dict:
    """argparse options by a field's type: a bool flag alone means true; a tuple takes one or more values
    (``--directions query_to_doc doc_to_query`` or ``--directions query_to_doc,doc_to_query``)."""
    if hint is bool:
        return {"nargs": "?", "const": "true"}
    return {"nargs": "+"} if typing.get_origin(hint) is tuple else {}


def add_config_flags(
    parser: argparse.ArgumentParser,
    cls,
    title: str,
    aliases: dict[str, str] | None = None,
    choices: dict[str, tuple] | None = None,
    *,
    flag_options: dict[str, dict] | None = None,
) -> None:
    """One flag per field of ``cls`` and of each section (``--quantile`` = ``--weince.quantile``).

    Values stay strings here; they are converted and checked when the config is built (:func:`apply_overrides`),
    so a flag, a config file and the Python API share one set of rules. A flag that is not given is absent from
    the namespace (the preset or the file decides). ``aliases`` adds deprecated flag names (old -> field), hidden
    from the help; ``choices`` names the allowed values of some fields in their help. ``flag_options`` changes
    the ``add_argument`` options of some fields' flags (field -> options), e.g. ``{"output_dir": {"required":
    True}}`` for a command that cannot run without it.
    """
    defaults = cls().to_dict()
    hints, sections = typing.get_type_hints(cls), config_sections(cls)
    flag_options = flag_options or {}
    flagged = {field.name for field in dataclasses.fields(cls) if field.name not in sections}
    unknown = sorted(set(flag_options) - flagged)
    if unknown:
        raise ValueError(f"flag_options names no field of {cls.__name__}: {', '.join(unknown)}")
    group = parser.add_argument_group(title)
    for field in dataclasses.fields(cls):
        if field.name in sections:
            continue
        default = defaults[field.name]
        shown = ",".join(map(str, default)) if isinstance(default, list) else default
        options = {
            "dest": f"set:{field.name}",
            "default": argparse.SUPPRESS,
            "metavar": field.name.upper(),
            "help": (f"choices: {', '.join(map(str, choices[field.name]))}; " if field.name in (choices or {}) else "")
            + f"default {shown}",
            **_flag_arity(hints[field.name]),
        }
        group.add_argument(_flag(field.name), **{**options, **flag_options.get(field.name, {})})
    for old, new in (aliases or {}).items():  # the old name goes through apply_overrides, which warns
        group.add_argument(
            _flag(old),
            dest=f"set:{old}",
            default=argparse.SUPPRESS,
            metavar=new.upper(),
            help=argparse.SUPPRESS,  # deprecated: apply_overrides warns and names the new flag
            **({"nargs": "?", "const": "true"} if hints[new] is bool else {}),
        )
    for section, section_cls in sections.items():
        label = "WEINCE settings" if section == "weince" else f"{section} settings"
        section_group = parser.add_argument_group(f"{label} (also --{section}.NAME; defaults: {section_cls.__name__})")
        section_hints, section_defaults = typing.get_type_hints(section_cls), section_cls()
        for field in dataclasses.fields(section_cls):
            section_group.add_argument(
                _flag(field.name),
                f"--{section}.{field.name}",
                f"--{section}.{field.name.replace('_', '-')}",
                dest=f"set:{section}.{field.name}",
                default=argparse.SUPPRESS,
                metavar=field.name.upper(),
                help=f"default {getattr(section_defaults, field.name)}",
                **({"nargs": "?", "const": "true"} if section_hints[field.name] is bool else {}),
            )


def overrides_from_args(args: argparse.Namespace) -> dict:
    """The settings given as flags (by :func:`add_config_flags`), flat."""
    return {key.removeprefix("set:"): value for key, value in vars(args).items() if key.startswith("set:")}


def add_run_flags(parser: argparse.ArgumentParser):
    """The flags of a training command that are not settings: --config, --resume, --overwrite, --print-config, in
    the argument group it returns (``add_argument`` on it adds a command's own)."""
    run = parser.add_argument_group("run")
    run.add_argument(
        "--config", metavar="FILE", help="YAML/JSON file of settings (sections under 'weince:' and 'speed:')"
    )
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
    return run


def resolve_config(base, args: argparse.Namespace, aliases: dict[str, str] | None = None, saved_file=None):
    """The config a training command runs: ``base`` < ``--config FILE`` < flags. With ``--resume``, the run's saved
    ``training_config.yaml`` replaces ``base`` (a warning names the settings the flags change); ``saved_file``: the
    output folder -> that file (the run folder's :func:`~simcse_weince.training.run_folder.config_of_record`)."""
    overrides = read_config_file(args.config) if args.config else {}
    overrides.update(overrides_from_args(args))
    config = apply_overrides(base, overrides, aliases)
    saved = (saved_file or (lambda folder: Path(folder).expanduser() / CONFIG_FILE))(config.output_dir)
    if args.resume and saved.is_file():
        # the folder the saved config was read from is the run's, however it is spelt now (".", "R/", "../R")
        saved_config = apply_overrides(load_config(type(base), saved, aliases), {"output_dir": config.output_dir})
        config = apply_overrides(saved_config, overrides, aliases)
        check_resume_settings(config, saved_config, saved)
    return config


#: the settings a resumed run may change: how long it runs, what it logs, saves and evaluates, where its data lie
#: (the data's fingerprint is checked), the workers and the speed options (the same computation, checked at start)
RESUMABLE_SETTINGS = frozenset({
    "max_steps", "num_epochs", "save_steps", "save_total_limit", "logging_steps", "report_to", "num_workers",
    "output_dir", "data_dir", "download", "eval_steps", "eval_before_training", "eval_batch_size", "final_tasks",
    "final_evaluation", "mini_batch_size",
})  # fmt: skip
RESUMABLE_SECTIONS = ("speed",)


def check_resume_settings(config, saved_config, saved_file: Path) -> None:
    """``--resume`` continues the saved run: a setting that defines what the run computes (data, model, loss,
    batch, schedule, precision, seed) may not change; one that does refuses in a line naming each difference and
    what may change. The settings that may change are named in a warning."""
    changed = changed_settings(config, saved_config)
    fixed = [name for name in changed
             if name not in RESUMABLE_SETTINGS and name.split(".")[0] not in RESUMABLE_SECTIONS]  # fmt: skip
    if fixed:
        shown = ", ".join(f"{name}: {setting_text(saved_config, name)} != {setting_text(config, name)}"
                          for name in fixed)  # fmt: skip
        may_change = ", ".join(f"--{name.replace('_', '-')}" for name in sorted(RESUMABLE_SETTINGS)
                               if hasattr(config, name))  # fmt: skip
        raise ValueError(
            f"--resume continues the run saved in {saved_file.parent} with its own settings, and these differ: "
            f"{shown}. On resume only {may_change} and the speed options may change (e.g. a larger --max-steps); "
            f"for other settings start a new run (another --output-dir, or --overwrite)"
        )
    if changed:
        logger.warning(
            "resuming with settings that differ from the saved run: %s (the continuation is then not the "
            "uninterrupted run)",
            ", ".join(changed),
        )


def setting_text(config, name: str) -> str:
    """A setting's value as the refusals show it (``<section>.<field>`` for a section's; lists as ``a,b``)."""
    value = config
    for part in name.split("."):
        value = getattr(value, part)
    return ",".join(map(str, value)) if isinstance(value, (list, tuple)) else str(value)
