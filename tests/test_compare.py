"""`simcse-weince compare`: the paired statistics against scipy, and a real (tiny) sweep that is killed and rerun."""

from __future__ import annotations

import json
import math
import signal
import subprocess

import pytest
from train_helpers import cli_command, subprocess_env, wait_for, write_train_file

from simcse_weince.cli import main
from simcse_weince.compare import check_cell, compare, load_variants, paired_difference
from simcse_weince.text import TEXT_CELLS, TEXT_VARIANTS

scipy_stats = pytest.importorskip("scipy.stats")


# --- paired_difference ------------------------------------------------------------------------------------------


def test_paired_difference_matches_scipy():
    values = [81.2, 80.1, 82.7, 79.9, 81.0, 83.3]
    baseline = [80.0, 80.5, 81.1, 79.9, 80.2, 81.0]
    result = paired_difference(values, baseline)
    differences = [a - b for a, b in zip(values, baseline)]
    assert result["n"] == 6
    assert result["mean"] == pytest.approx(sum(differences) / 6)
    assert (result["wins"], result["ties"], result["losses"]) == (4, 1, 1)
    interval = scipy_stats.ttest_rel(values, baseline).confidence_interval(0.95)
    assert result["ci95"] == pytest.approx([interval.low, interval.high])
    assert result["wilcoxon_p"] == pytest.approx(scipy_stats.wilcoxon(values, baseline).pvalue)


def test_paired_difference_exact_wilcoxon_and_t_interval_by_hand():
    result = paired_difference([2.0, 4.0, 6.0, 8.0, 10.0], [1.0, 2.0, 3.0, 4.0, 5.0])  # differences 1..5
    assert result["wilcoxon_p"] == pytest.approx(2 / 32)  # all 5 positive: exact two-sided p = 2 * 0.5**5
    half_width = scipy_stats.t.ppf(0.975, 4) * math.sqrt(2.5) / math.sqrt(5)
    assert result["ci95"] == pytest.approx([3 - half_width, 3 + half_width])
    assert (result["wins"], result["ties"], result["losses"]) == (5, 0, 0)


def test_paired_difference_degenerate_cases():
    empty = paired_difference([], [])
    assert empty["n"] == 0 and empty["mean"] is None and empty["ci95"] is None and empty["wilcoxon_p"] is None
    one = paired_difference([81.0], [80.0])
    assert one["n"] == 1 and one["mean"] == 1.0 and one["ci95"] is None and one["wilcoxon_p"] is None
    same = paired_difference([80.0, 81.0, 82.0], [80.0, 81.0, 82.0])  # every difference zero
    assert same["ci95"] == [0.0, 0.0] and same["wilcoxon_p"] is None and same["ties"] == 3
    single_nonzero = paired_difference([80.0, 81.0, 82.5], [80.0, 81.0, 82.0])
    assert single_nonzero["wilcoxon_p"] is None and (single_nonzero["wins"], single_nonzero["ties"]) == (1, 2)
    constant = paired_difference([2.0, 3.0, 4.0], [1.0, 2.0, 3.0])  # no spread: the interval is the point
    assert constant["ci95"] == [1.0, 1.0]
    assert constant["wilcoxon_p"] == pytest.approx(scipy_stats.wilcoxon([1.0, 1.0, 1.0]).pvalue)
    missing = paired_difference([81.0, None, 83.0], [80.0, 80.0, None])  # a pair with a None is left out
    assert missing["n"] == 1 and missing["mean"] == 1.0


# --- variants and the command line --------------------------------------------------------------------------------


def test_load_variants_merges_a_yaml_file(tmp_path):
    path = tmp_path / "variants.yaml"
    path.write_text("q03: {loss: weince, weince: {quantile: 0.3}}\ninfonce: {loss: infonce, temperature: 0.1}\n")
    variants = load_variants(path, TEXT_VARIANTS)
    assert variants["q03"] == {"loss": "weince", "weince.quantile": 0.3}
    assert variants["infonce"] == {"loss": "infonce", "temperature": 0.1}
    assert variants["weince"] == TEXT_VARIANTS["weince"]


def test_unknown_variant_is_one_clear_line(tmp_path, capsys):
    assert main(["compare", "--losses", "infonce,nope", "--output-dir", str(tmp_path)]) == 1
    error = capsys.readouterr().err.strip()
    assert len(error.splitlines()) == 1
    assert "nope" in error and "known: infonce, weince" in error


@pytest.mark.parametrize("name", ["../escaped", "/tmp/absolute", "a/b", ".hidden", ".."])
def test_a_variant_name_that_would_leave_the_sweep_folder_is_refused(tmp_path, capsys, name):
    # issue 39: a variant's name becomes a folder; one outside the sweep folder must not be written
    variants = tmp_path / "variants.yaml"
    variants.write_text(json.dumps({name: {"loss": "weince"}}))
    sweep = tmp_path / "deep" / "sweep"
    code = main(["compare", "--variants-file", str(variants), "--losses", f"infonce,{name}", "--seeds", "1",
                 "--output-dir", str(sweep)])  # fmt: skip
    assert code == 1
    error = capsys.readouterr().err.strip()
    assert len(error.splitlines()) == 1 and "cannot be a folder name" in error and "Traceback" not in error, error
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["variants.yaml"]  # nothing written anywhere


@pytest.mark.parametrize("command", [["compare"], ["vision", "compare"]])
def test_each_compare_command_needs_its_sweep_folder(command, capsys):
    with pytest.raises(SystemExit) as exited:
        main([*command, "--losses", "infonce", "--print-config"])
    assert exited.value.code == 2
    assert "the following arguments are required: --output-dir" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main([*command, "--help"])
    shown = " ".join(capsys.readouterr().out.split())
    assert "--output-dir DIR the sweep folder: DIR/<variant>/seed-<s> per run, and the comparison files" in shown


def test_each_trainer_registers_its_compare_with_its_cells(tmp_path, capsys):
    """``compare`` starts from the text preset and sweeps the text variants, ``vision compare`` from
    VisionTrainConfig's defaults over the vision variants: each trainer's CLI hands its CellKind."""
    import yaml

    from simcse_weince.vision import VISION_CELLS, VISION_VARIANTS

    sweep = str(tmp_path / "sweep")
    assert main(["compare", "--preset", "cpu-demo", "--seeds", "1,2", "--output-dir", sweep, "--print-config"]) == 0
    text = yaml.safe_load(capsys.readouterr().out)
    assert text["variants"] == TEXT_VARIANTS and text["seeds"] == [1, 2]
    assert text["base"] == TEXT_CELLS.base_config("cpu-demo", output_dir=sweep).to_dict()
    assert main(["vision", "compare", "--image-size", "16", "--output-dir", sweep, "--print-config"]) == 0
    vision = yaml.safe_load(capsys.readouterr().out)
    assert vision["variants"] == VISION_VARIANTS and "untrained" in vision["variants"]
    expected = VISION_CELLS.base_config()
    assert vision["base"] == {**expected.to_dict(), "image_size": 16, "output_dir": sweep}
    assert not (tmp_path / "sweep").exists()


def test_a_new_kind_of_cell_gets_a_compare_command_without_changes_to_compare(tmp_path, capsys):
    """The command-line machinery is trainer-agnostic: a CellKind with no presets, its own defaults and variants
    becomes a ``compare`` command (its defaults named after its config class) through add_compare_command alone."""
    import argparse
    import dataclasses

    import yaml

    from simcse_weince.compare.cli import add_compare_command
    from simcse_weince.text import preset

    kind = dataclasses.replace(
        TEXT_CELLS, name="demo", presets=(), base_config=lambda: preset("cpu-demo", batch_size=16),
        variants={"infonce": {"loss": "infonce"}, "hot": {"loss": "infonce", "temperature": 0.1}},
    )  # fmt: skip
    parser = argparse.ArgumentParser(prog="demo")
    command = add_compare_command(parser.add_subparsers(dest="command"), kind, help="demo sweeps", epilog="")
    assert "base settings of every run (defaults: TrainConfig's):" in command.format_help()
    args = parser.parse_args(["compare", "--losses", "hot,infonce", "--output-dir", str(tmp_path), "--print-config"])
    assert args.func(args) == 0
    printed = yaml.safe_load(capsys.readouterr().out)
    assert printed["variants"] == {"hot": kind.variants["hot"], "infonce": kind.variants["infonce"]}
    assert printed["base"]["batch_size"] == 16 and printed["base"]["output_dir"] == str(tmp_path)
    with pytest.raises(SystemExit):
        parser.parse_args(["compare", "--preset", "paper", "--output-dir", str(tmp_path)])  # a kind without presets
    assert "unrecognized arguments: --preset" in capsys.readouterr().err


def test_add_config_flags_refuses_options_for_a_field_it_does_not_have():
    import argparse

    from simcse_weince.settings import add_config_flags

    with pytest.raises(ValueError, match=r"^flag_options names no field of TrainConfig: output_folder$"):
        add_config_flags(argparse.ArgumentParser(), TEXT_CELLS.config_class, "t", flag_options={"output_folder": {}})


# --- the kinds of cell: handed to compare by their trainer packages ----------------------------------------------


def test_compare_refuses_a_base_config_of_another_kind(tmp_path):
    from simcse_weince.vision.config import VisionTrainConfig

    with pytest.raises(TypeError, match=r"^compare\(kind=TEXT_CELLS\) needs a TrainConfig, got VisionTrainConfig$"):
        compare(VisionTrainConfig(), {"infonce": {"loss": "infonce"}}, [1], tmp_path / "sweep", kind=TEXT_CELLS)
    with pytest.raises(TypeError, match=r"check_cell\(kind=TEXT_CELLS\) needs a TrainConfig"):
        check_cell(VisionTrainConfig(output_dir=str(tmp_path / "cell")), TEXT_CELLS)
    with pytest.raises(TypeError, match="kind"):  # no default kind: the caller says which
        compare(TEXT_CELLS.config_class(), {"infonce": {"loss": "infonce"}}, [1], tmp_path / "sweep")
    assert not (tmp_path / "sweep").exists()


def test_the_cell_kinds_are_their_trainer_packages():
    from simcse_weince import text, vision
    from simcse_weince.vision.config import DEPRECATED_NAMES, VisionTrainConfig

    assert text.TEXT_CELLS.config_class is text.TrainConfig and text.TEXT_CELLS.variants is text.TEXT_VARIANTS
    assert text.TEXT_CELLS.aliases is None and "weince-hardness" in text.TEXT_VARIANTS
    assert vision.VISION_CELLS.config_class is VisionTrainConfig and vision.VISION_CELLS.aliases is DEPRECATED_NAMES
    assert vision.VISION_CELLS.variants is vision.VISION_VARIANTS and "untrained" in vision.VISION_VARIANTS
    # what each one's compare command starts from: the text presets (paper first), VisionTrainConfig's defaults
    assert text.TEXT_CELLS.base_config is text.preset and text.TEXT_CELLS.presets == tuple(text.PRESETS)
    assert text.TEXT_CELLS.presets[0] == "paper" and vision.VISION_CELLS.presets == ()
    assert vision.VISION_CELLS.base_config is VisionTrainConfig


def test_importing_compare_loads_no_trainer_package():
    """compare's machinery is handed its cells (CellKind): importing it loads neither text nor vision, which import
    compare.cells (issue 38; tests/test_import_graph.py reads the imports themselves)."""
    import sys

    code = (
        "import sys, simcse_weince.compare; "
        "print(sorted(m for m in sys.modules if m.startswith(('simcse_weince.text', 'simcse_weince.vision'))))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


# --- a real sweep: killed after its first finished run, then the same command again ------------------------------


def _cells(root):
    return {(v, s): root / v / f"seed-{s}" for v in ("infonce", "weince") for s in (1, 2)}


def test_compare_sweep_killed_and_rerun_skips_finished_runs(tiny_model, tmp_path, data_dir):
    # MiniLM's STS-B evaluations take minutes per run on 2 cores; a 2-layer 32-wide BERT keeps the same code path
    model = tiny_model
    train_file = write_train_file(tmp_path / "train.txt", data_dir, lines=200)
    sweep = tmp_path / "sweep"
    args = [
        "compare", "--preset", "cpu-demo", "--losses", "infonce,weince", "--seeds", "1,2", "--max-steps", "4",
        "--eval-steps", "2", "--final-tasks", "stsb", "--output-dir", str(sweep), "--data-dir", str(data_dir),
        "--eval-before-training", "false", "--save-steps", "2", "--report-to", "csv", "--mixed-precision", "no",
        "--model", str(model), "--pooler", "cls", "--train-file", str(train_file), "--batch-size", "16",
        "--eval-max-length", "32", "--learning-rate", "1e-3",
    ]  # fmt: skip
    cells = _cells(sweep)
    first, second = cells["infonce", 1], cells["weince", 1]  # cells run seed by seed
    with open(tmp_path / "stderr.txt", "w") as stderr:
        process = subprocess.Popen(cli_command(*args), env=subprocess_env(), stdout=subprocess.DEVNULL, stderr=stderr)
        try:
            wait_for(
                lambda: (first / "results.json").is_file() and (second / "training_config.yaml").is_file(),
                _ProcessWithLog(process, tmp_path / "stderr.txt"),
                what="the first run to finish and the second to start",
            )
        finally:
            process.send_signal(signal.SIGKILL)
            process.wait(timeout=60)
    finished = {cell: (path / "results.json").stat().st_mtime_ns for cell, path in cells.items()
                if (path / "results.json").is_file()}  # fmt: skip
    assert ("infonce", 1) in finished
    assert not (sweep / "comparison.json").exists()

    assert main(args) == 0
    for cell, mtime in finished.items():  # read, not retrained
        assert (cells[cell] / "results.json").stat().st_mtime_ns == mtime, cell
    summary = json.loads((sweep / "comparison.json").read_text())
    assert {(run["variant"], run["seed"]) for run in summary["runs"]} == set(cells)
    for run in summary["runs"]:
        assert run["stsb_test"] is not None and run["stsb_dev"] is not None and run["sts_avg"] is not None
        results = json.loads((cells[run["variant"], run["seed"]] / "results.json").read_text())
        assert results["config"]["seed"] == run["seed"]
        assert [e["step"] for e in results["evaluations"]] == [2, 4]
    weince = summary["differences"]["weince"]["stsb_test"]
    assert weince["n"] == 2 and weince["wins"] + weince["ties"] + weince["losses"] == 2
    assert summary["per_variant"]["infonce"]["stsb_test"]["n"] == 2
    assert summary["wall_time_seconds"] > 0 and "git_commit" in summary
    table = (sweep / "comparison.md").read_text()
    assert table.startswith("| variant |") and "| weince | 2 |" in table
    assert (sweep / "comparison.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # the λ statistics of the WEINCE cells, averaged over the two seeds at each of the 4 steps; none for InfoNCE
    assert set(summary["lambda_curves"]) == {"weince"}
    assert [row["step"] for row in summary["lambda_curves"]["weince"]] == [1, 2, 3, 4]
    histories = [json.loads((cells["weince", seed] / "results.json").read_text())["history"] for seed in (1, 2)]
    expected = (histories[0][2]["lambda_mean"] + histories[1][2]["lambda_mean"]) / 2
    assert summary["lambda_curves"]["weince"][2]["lambda_mean"] == pytest.approx(expected, rel=1e-12)
    assert (sweep / "comparison_lambda.png").stat().st_size > 5_000
    # every cell records the commit that trained it; a re-summary at another commit reads it and never rewrites it
    from simcse_weince.provenance import git_commit

    assert {run["training_commit"] for run in summary["runs"]} == {git_commit()}
    older = cells["weince", 2] / "results.json"
    results = json.loads(older.read_text())
    results["versions"]["git_commit"] = "0" * 40  # as if trained at an earlier commit
    older.write_text(json.dumps(results))
    assert main(args) == 0
    assert json.loads(older.read_text())["versions"]["git_commit"] == "0" * 40
    commits = {(run["variant"], run["seed"]): run["training_commit"]
               for run in json.loads((sweep / "comparison.json").read_text())["runs"]}  # fmt: skip
    assert commits.pop(("weince", 2)) == "0" * 40 and set(commits.values()) == {git_commit()}


class _ProcessWithLog:
    """``wait_for`` reads a failed run's stderr from ``process.stderr``; here stderr goes to a file."""

    def __init__(self, process, log_path):
        self._process, self._log_path = process, log_path

    def poll(self):
        return self._process.poll()

    @property
    def returncode(self):
        return self._process.returncode

    @property
    def stderr(self):
        return open(self._log_path)  # noqa: SIM115

    def kill(self):
        self._process.kill()


def test_seed_averaged_lambda_averages_each_step_over_the_seeds_that_logged_it(tmp_path):
    from simcse_weince.compare import plot_lambda_over_training, seed_averaged_lambda

    histories = {
        ("weince", 1): [{"step": 1, "loss": 2.0, "lambda_mean": 0.2, "beta_hat_mean": 3.0},
                        {"step": 2, "loss": 1.0, "lambda_mean": 0.4, "beta_hat_mean": 5.0}],
        ("weince", 2): [{"step": 1, "loss": 2.5, "lambda_mean": 0.6, "beta_hat_mean": 1.0}],
        ("infonce", 1): [],
    }  # fmt: skip
    averaged = seed_averaged_lambda(histories)
    assert set(averaged) == {"weince"}
    first, second = averaged["weince"]
    assert first == {"step": 1, "seeds": 2, "lambda_mean": pytest.approx(0.4), "beta_hat_mean": pytest.approx(2.0)}
    assert second == {"step": 2, "seeds": 1, "lambda_mean": 0.4, "beta_hat_mean": 5.0}  # loss is not a λ statistic
    plot_lambda_over_training(averaged, tmp_path / "lambda.png")
    assert (tmp_path / "lambda.png").read_bytes()[:4] == b"\x89PNG"


def test_archived_scores_outside_their_scale_are_not_results(tmp_path):
    """Issue 54 class 9: a correlation x100 lies within ±100, an accuracy x100 within 0-100 (the dev curve too)."""
    pytest.importorskip("torchvision")
    from simcse_weince.compare.cells import _invalid_result
    from simcse_weince.text.config import TrainConfig
    from simcse_weince.vision import VISION_CELLS
    from simcse_weince.vision.config import VisionTrainConfig

    curve = [{"step": 1, "stsb_dev_spearman": 99.5}]
    text = {"config": TrainConfig().to_dict(), "history": [], "stsb_test_spearman": -100.0,
            "best_stsb_dev_spearman_during_training": 100, "evaluations": curve}  # fmt: skip
    assert _invalid_result(text, TrainConfig(), TEXT_CELLS) is None  # the ends of the scale are scores
    edited = {**text, "evaluations": [{"step": 1, "stsb_dev_spearman": 100.01}]}
    assert _invalid_result(edited, TrainConfig(), TEXT_CELLS) == (
        "evaluations[0].stsb_dev_spearman is 100.01, outside the range of a correlation x100 (-100 to 100)"
    )
    accuracies = {"knn_accuracy": {"20": 0.5, "1": 0.25}, "linear_accuracy": {"mean": 0.75}}
    vision = {"config": VisionTrainConfig().to_dict(), "history": [], "evaluation": accuracies}
    assert _invalid_result(vision, VisionTrainConfig(), VISION_CELLS) is None
    vision["evaluation"] = {**accuracies, "knn_accuracy": {"20": 1.5, "1": -0.25}}  # a fraction x100 twice
    assert _invalid_result(vision, VisionTrainConfig(), VISION_CELLS) == (
        "its knn@20 (kNN@20) is 150.0, outside the range of an accuracy x100 (0 to 100)"
    )


def test_study_report_refuses_an_archived_score_outside_its_scale(tmp_path):
    from simcse_weince.compare import format_markdown, summarize
    from simcse_weince.compare.report import study_report

    runs = [{"variant": v, "seed": s, "stsb_dev": 80.0, "stsb_test": 75.0 + s, "sts_avg": 70.0}
            for v in ("infonce", "weince") for s in (1, 2)]  # fmt: skip
    runs[3]["stsb_test"] = 12345.0  # an edited cell
    metrics = {"stsb_dev": "STS-B dev (best)", "stsb_test": "STS-B test", "sts_avg": "STS avg"}
    summary = {"baseline": "infonce", "seeds": [1, 2], "runs": runs, "metrics": metrics,
               **summarize(runs, "infonce", tuple(metrics))}  # fmt: skip
    (tmp_path / "comparison.json").write_text(json.dumps(summary))
    (tmp_path / "comparison.md").write_text(format_markdown(summary))
    with pytest.raises(ValueError, match=r"comparison.json: run 'weince' seed 2: its stsb_test \(STS-B test\) is "
                                         r"12345.0, outside the range of a correlation x100"):  # fmt: skip
        study_report(tmp_path)
    summary["task"] = "vision"  # a vision summary's accuracies x100: a negative one was not measured
    runs[3]["stsb_test"] = -0.5
    (tmp_path / "comparison.json").write_text(json.dumps(summary))
    with pytest.raises(ValueError, match=r"is -0.5, outside the range of an accuracy x100 \(0 to 100\)"):
        study_report(tmp_path)
    # a summary written since issue 55 records its kind's scale (and table note), which the check uses
    summary.pop("task")
    summary["score_scale"] = {"name": "a score of this test", "low": 0.0, "high": 90.0}
    runs[3]["stsb_test"] = 95.0
    (tmp_path / "comparison.json").write_text(json.dumps(summary))
    with pytest.raises(
        ValueError, match=r"run 'weince' seed 2: .* is 95.0, outside the range of a score of this test \(0 to 90\)"
    ):
        study_report(tmp_path)
