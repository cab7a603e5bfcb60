"""``simcse-weince train`` takes sentence-transformers' MultipleNegativesRankingLoss options (issue 53, item 5):
``--directions`` (space- or comma-separated), ``--partition-mode``, ``--hardness-mode`` and the config keys of the
same names; bad values end in one line before anything is written; the values are recorded in results.json and
the model card; ``compare`` variants set them; the vision geometry refuses them."""

from __future__ import annotations

import json
import math

import pytest
import yaml
from train_helpers import REPO_ROOT

from simcse_weince.cli import main
from simcse_weince.compare.cells import cell_configs, load_variants
from simcse_weince.hub import render_model_card
from simcse_weince.losses.from_embeddings import ContrastiveObjective
from simcse_weince.text.cells import TEXT_VARIANTS
from simcse_weince.text.config import preset
from simcse_weince.text.results import not_applied_settings

OPTIONS = ("directions", "partition_mode", "hardness_mode")


@pytest.fixture(scope="module")
def files(tmp_path_factory, wiki_sentences):
    """A sentence file, a pairs file and a triplets file of real sentences (32 rows each)."""
    root = tmp_path_factory.mktemp("files")
    rows = wiki_sentences[:96]
    (root / "sentences.txt").write_text("\n".join(rows[:32]) + "\n", encoding="utf-8")
    quoted = [f'"{text}"' for text in (row.replace('"', "'") for row in rows)]
    pairs = ["sent0,sent1"] + [f"{a},{b}" for a, b in zip(quoted[:32], quoted[32:64])]
    triplets = ["sent0,sent1,hard_neg"] + [f"{a},{b},{c}" for a, b, c in zip(quoted[:32], quoted[32:64], quoted[64:])]
    (root / "pairs.csv").write_text("\n".join(pairs) + "\n", encoding="utf-8")
    (root / "triplets.csv").write_text("\n".join(triplets) + "\n", encoding="utf-8")
    return root


def _flags(model, train_file, data_dir):
    return [
        "--model", str(model), "--train-file", str(train_file), "--pooler", "cls", "--batch-size", "8",
        "--max-steps", "2", "--eval-steps", "0", "--save-steps", "0", "--final-tasks", "none", "--eval-max-length",
        "32", "--report-to", "csv", "--mixed-precision", "no", "--data-dir", str(data_dir), "--learning-rate", "1e-3",
        "--cpu", "--final-evaluation", "false",
    ]  # fmt: skip


def _printed_config(capsys, *flags) -> dict:
    capsys.readouterr()
    assert main(["train", "--preset", "cpu-demo", *flags, "--print-config"]) == 0
    return yaml.safe_load(capsys.readouterr().out)


def test_flags_and_config_keys_set_the_options(capsys, tmp_path):
    default = _printed_config(capsys)
    assert [default[name] for name in OPTIONS] == [["query_to_doc"], "joint", None]
    flags = ["--directions", "query_to_doc", "doc_to_query", "--partition-mode", "per_direction", "--hardness-mode",
             "hard_negatives", "--hardness-strength", "5"]  # fmt: skip
    spaced = _printed_config(capsys, *flags)
    assert [spaced[name] for name in OPTIONS] == [["query_to_doc", "doc_to_query"], "per_direction", "hard_negatives"]
    commas = _printed_config(capsys, "--directions", "query_to_doc,query_to_query", "doc_to_doc")
    assert commas["directions"] == ["query_to_doc", "query_to_query", "doc_to_doc"]
    config_file = tmp_path / "options.yaml"
    config_file.write_text("directions: [query_to_doc, doc_to_query]\npartition_mode: per_direction\n"
                           "hardness_mode: all_negatives\nhardness_strength: 5\n")  # fmt: skip
    from_file = _printed_config(capsys, "--config", str(config_file))
    assert [from_file[name] for name in OPTIONS] == [["query_to_doc", "doc_to_query"], "per_direction", "all_negatives"]
    # a flag overrides the file; "none" turns the weighting off (MNRL's None)
    overridden = _printed_config(capsys, "--config", str(config_file), "--hardness-mode", "none")
    assert overridden["hardness_mode"] is None and overridden["partition_mode"] == "per_direction"


BAD_VALUES = [
    (["--directions", "query_to_doc", "doc_to_queries"], "unknown directions ['doc_to_queries']"),
    (["--directions", "doc_to_query"], "directions must include 'query_to_doc'"),
    (["--directions", "query_to_doc", "doc_to_doc", "--partition-mode", "per_direction"],
     "partition_mode='per_direction' needs every direction to hold the positive pair"),
    (["--partition-mode", "separate"], "partition_mode must be one of ('joint', 'per_direction'), got 'separate'"),
    (["--hardness-mode", "hard"], "hardness_mode must be None or one of ('in_batch_negatives', 'hard_negatives', "
                                  "'all_negatives'), got 'hard'"),
]  # fmt: skip


@pytest.mark.parametrize(("flags", "expect"), BAD_VALUES, ids=[case[1][:30] for case in BAD_VALUES])
def test_a_bad_value_ends_in_one_line_before_anything_is_written(tmp_path, capsys, flags, expect):
    run_dir = tmp_path / "run"
    capsys.readouterr()
    code = main(["train", "--preset", "cpu-demo", *flags, "--output-dir", str(run_dir)])
    err = capsys.readouterr().err
    assert code == 1 and "Traceback" not in err
    error_lines = [line for line in err.splitlines() if "error:" in line]
    assert len(error_lines) == 1 and expect in error_lines[0], err[-2000:]
    assert not run_dir.exists()
    # the config itself refuses them: --print-config (and compare, the Python API) never show a config that fails
    assert main(["train", "--preset", "cpu-demo", *flags, "--print-config"]) == 1
    assert expect in capsys.readouterr().err


def test_hard_negatives_without_a_negative_column_ends_in_one_line(
    tiny_model_one_layer, files, data_dir, tmp_path, capsys
):
    run_dir = tmp_path / "run"
    capsys.readouterr()
    flags = [*_flags(tiny_model_one_layer, files / "pairs.csv", data_dir), "--hardness-mode", "hard_negatives",
             "--hardness-strength", "5", "--output-dir", str(run_dir)]  # fmt: skip
    assert main(["train", *flags]) == 1
    err = capsys.readouterr().err
    error_lines = [line for line in err.splitlines() if "error:" in line]
    assert len(error_lines) == 1 and "hardness_mode hard_negatives weighs the hard-negative column" in error_lines[0]
    assert "pairs (sent0,sent1), without one" in error_lines[0]
    assert not run_dir.exists()


def test_the_vision_geometry_takes_only_the_defaults():
    ContrastiveObjective("weince", 0.1, geometry="simclr")  # the defaults are fine
    for options in ({"directions": ("query_to_doc", "doc_to_query")}, {"partition_mode": "per_direction"},
                    {"hardness_mode": "all_negatives", "hardness_strength": 1.0}):  # fmt: skip
        with pytest.raises(ValueError, match="are for the simcse geometry"):
            ContrastiveObjective("weince", 0.1, geometry="simclr", **options)


def test_compare_variants_set_the_options(tmp_path):
    variants_file = tmp_path / "variants.yaml"
    variants_file.write_text(
        "infonce-symmetric: {loss: infonce, directions: [query_to_doc, doc_to_query]}\n"
        "weince-gte: {directions: 'query_to_doc,query_to_query,doc_to_query,doc_to_doc'}\n"
        "bad: {partition_mode: per_direction, directions: [query_to_doc, doc_to_doc]}\n"
    )
    variants = load_variants(variants_file, TEXT_VARIANTS)
    base = preset("cpu-demo", output_dir=str(tmp_path / "sweep"))
    configs = cell_configs(base, {name: variants[name] for name in ("infonce", "infonce-symmetric", "weince-gte")},
                           [1], base.output_dir)  # fmt: skip
    assert configs["infonce", 1].directions == ("query_to_doc",)
    assert configs["infonce-symmetric", 1].directions == ("query_to_doc", "doc_to_query")
    assert len(configs["weince-gte", 1].directions) == 4
    with pytest.raises(ValueError, match="per_direction"):
        cell_configs(base, {"bad": variants["bad"]}, [1], base.output_dir)


def test_a_setting_without_effect_is_named_in_not_applied():
    config = preset("cpu-demo", hardness_mode="all_negatives")  # hardness_strength stays 0
    assert "hardness_strength=0" in not_applied_settings(config, None)["hardness_mode"]
    assert "hardness_mode" not in not_applied_settings(preset("cpu-demo", hardness_mode="all_negatives",
                                                               hardness_strength=5.0), None)  # fmt: skip


@pytest.fixture(scope="module")
def default_run(tiny_model_one_layer, files, data_dir, tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("default") / "run"
    flags = _flags(tiny_model_one_layer, files / "triplets.csv", data_dir)
    assert main(["train", *flags, "--output-dir", str(run_dir)]) == 0
    return json.loads((run_dir / "results.json").read_text())


def test_results_and_card_record_the_options(default_run):
    assert [default_run["config"][name] for name in OPTIONS] == [["query_to_doc"], "joint", None]
    card = render_model_card(default_run)
    loss_line = next(line for line in card.splitlines() if line.startswith("- **Loss:**"))
    assert "directions" not in loss_line and "hardness" not in loss_line  # the plain loss says nothing more
    options = {"directions": ["query_to_doc", "doc_to_query"], "partition_mode": "per_direction",
               "hardness_mode": "hard_negatives", "hardness_strength": 5.0}  # fmt: skip
    card = render_model_card({**default_run, "config": {**default_run["config"], **options}})
    loss_line = next(line for line in card.splitlines() if line.startswith("- **Loss:**"))
    assert ("directions `query_to_doc`, `doc_to_query`; partition mode `per_direction`; hardness weighting "
            "`hard_negatives` with strength 5") in loss_line  # fmt: skip
    # a run of an earlier release: no option keys; its hardness_strength was in-batch weighting
    earlier = {key: value for key, value in default_run["config"].items() if key not in OPTIONS}
    card = render_model_card({**default_run, "config": {**earlier, "hardness_strength": 9.0}})
    assert "hardness weighting `in_batch_negatives` with strength 9" in card


@pytest.mark.parametrize(
    ("train_file", "options"),
    [
        ("triplets.csv", {"directions": ["query_to_doc", "doc_to_query"], "partition_mode": "per_direction"}),
        ("sentences.txt", {"directions": "query_to_doc,doc_to_query", "hardness_mode": "all_negatives",
                           "hardness_strength": 5.0}),
    ],
    ids=["triplets", "one-column"],
)  # fmt: skip
def test_a_run_with_the_options_trains_and_records_them(
    tiny_model_one_layer, files, data_dir, tmp_path, default_run, train_file, options
):
    from simcse_weince.text.trainer import train

    # the Python API (the flags are tested above)
    run_dir = tmp_path / "run"
    settings = dict(default_run["config"], train_file=str(files / train_file), output_dir=str(run_dir))
    results = train(preset("paper", **{**settings, **options}))
    assert results["config"]["directions"] == ["query_to_doc", "doc_to_query"]
    card = (run_dir / "README.md").read_text()
    assert "directions `query_to_doc`, `doc_to_query`" in card
    assert all(math.isfinite(entry["loss"]) for entry in results["history"])
    if train_file == "triplets.csv":  # default_run's data, seed and settings but the directions: another loss
        assert "partition mode `per_direction`" in card
        assert results["history"][0]["loss"] != default_run["history"][0]["loss"]
    else:
        assert "hardness weighting `all_negatives` with strength 5" in card


def test_archived_runs_read_as_they_were_recorded(tmp_path):
    """``hardness_mode``'s default is MNRL's None (a strength alone weighs nothing), and the built-in variants that
    weigh negatives name their mode. A run recorded before the key existed, whose ``hardness_strength`` weighed the
    in-batch negatives, reads as it was recorded: its training_config.yaml and its results.json (what ``compare``
    checks a reused cell against) give in_batch_negatives, and the built-in variant of that name is that config."""
    from simcse_weince.compare.cells import _recorded_config
    from simcse_weince.settings import load_config, save_config
    from simcse_weince.text.cells import TEXT_CELLS
    from simcse_weince.text.config import TrainConfig

    archived = REPO_ROOT / "results" / "study" / "cpu-cls"
    hardness = archived / "infonce-hardness" / "seed-3"
    assert "hardness_mode" not in (hardness / "training_config.yaml").read_text(encoding="utf-8")
    recorded = load_config(TrainConfig, hardness / "training_config.yaml")
    assert (recorded.hardness_mode, recorded.hardness_strength) == ("in_batch_negatives", 9.0)
    from_results = _recorded_config(recorded, json.loads((hardness / "results.json").read_text())["config"], TEXT_CELLS)
    assert from_results.hardness_mode == "in_batch_negatives"
    variant = preset("cpu-cls", **TEXT_VARIANTS["infonce-hardness"])
    assert (variant.hardness_mode, variant.hardness_strength) == (recorded.hardness_mode, recorded.hardness_strength)
    # a run without hardness keeps the new default (no difference to report when compare reuses it)
    plain = load_config(TrainConfig, archived / "weince" / "seed-3" / "training_config.yaml")
    assert plain.hardness_mode is None and plain.hardness_strength == 0.0
    # a config saved now records its mode, None included, and reads back as it was
    saved = tmp_path / "training_config.yaml"
    save_config(preset("cpu-demo", hardness_strength=9.0), saved)
    assert load_config(TrainConfig, saved).hardness_mode is None
    assert preset("cpu-demo").hardness_mode is None
