"""Every JSON, YAML and step log the tool reads goes through one strict reader (``simcse_weince/records.py``).

The invariant: a key given twice is refused naming the key and the file (Python's json and PyYAML keep the last one
silently), a count is a non-negative integer, NaN is named NaN, and a value of the wrong type is named with its
field, the type it holds and the type expected. Each reader of the project is tried with such a file.
"""

from __future__ import annotations

import json
import logging
import math
import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simcse_weince.compare import check_cell
from simcse_weince.diagnostics.plots import lambda_series, load_training_log
from simcse_weince.records import RecordError, check_count, check_number, loads_json, loads_yaml, read_metrics_log
from simcse_weince.settings import apply_overrides, read_config_file
from simcse_weince.text import TEXT_CELLS
from simcse_weince.text.config import TrainConfig

keys = st.text(alphabet="abcdefgh_", min_size=1, max_size=6)


@settings(max_examples=60, deadline=None)
@given(st.dictionaries(keys, st.integers(-5, 5), min_size=1, max_size=6), st.data())
def test_a_key_given_twice_is_refused_in_json_and_yaml_at_any_depth(mapping, data):
    """Any mapping with one of its keys repeated (at the top or nested one level down) is refused naming that
    key; the same mapping without the repeat reads back as itself."""
    key = data.draw(st.sampled_from(sorted(mapping)))
    nested = data.draw(st.booleans())
    body = ", ".join(f'"{k}": {v}' for k, v in mapping.items()) + f', "{key}": 99'
    text = f'{{"outer": {{{body}}}}}' if nested else f"{{{body}}}"
    with pytest.raises(RecordError, match=f"results.json holds the key '{key}' twice"):
        loads_json(text, "results.json")
    lines = [f"{k}: {v}" for k, v in mapping.items()] + [f"{key}: 99"]
    yaml_text = "outer:\n" + "".join(f"  {line}\n" for line in lines) if nested else "\n".join(lines)
    with pytest.raises(RecordError, match=f"holds the key '{key}' twice in one mapping"):
        loads_yaml(yaml_text, "config.yaml")
    assert loads_json(json.dumps(mapping)) == mapping
    assert loads_yaml("\n".join(f"{k}: {v}" for k, v in mapping.items())) == mapping


def test_a_yaml_merge_may_still_be_overridden():
    """``<<: *base`` then a key of base is what a merge is for, not a duplicate."""
    text = "base: &base {seed: 1, batch_size: 8}\nrun:\n  <<: *base\n  seed: 2\n"
    assert loads_yaml(text)["run"] == {"seed": 2, "batch_size": 8}


@given(st.one_of(st.integers(max_value=-1), st.just(math.nan), st.booleans(), st.text(max_size=3), st.none()))
def test_a_count_that_is_not_a_count_is_named(value):
    with pytest.raises(RecordError) as refused:
        check_count(value, "total_steps", "results.json")
    message = str(refused.value)
    assert message.startswith("results.json: total_steps") and "fix the file" in message
    if isinstance(value, float):
        assert "got NaN" in message
    elif isinstance(value, int) and not isinstance(value, bool):
        assert f"is {value}, negative" in message
    else:
        assert "must be an integer count, got " in message


def test_nan_is_named_nan():
    with pytest.raises(RecordError, match="loss is NaN, not a number"):
        check_number(math.nan, "loss", "results.json")
    assert math.isnan(check_number(math.nan, "loss", "results.json", allow_nan=True))


def test_config_file_keys_given_twice_are_refused_not_last_wins(tmp_path):
    config = tmp_path / "config.yaml"
    config.write_text("learning_rate: 1e-5\nweince:\n  quantile: 0.3\n  quantile: 0.5\n", encoding="utf-8")
    with pytest.raises(ValueError, match=rf"config file {config} holds the key 'quantile' twice in one mapping"):
        read_config_file(config)


@pytest.mark.parametrize("field", ["final_tasks", "report_to", "directions"])
@pytest.mark.parametrize("word", ["no", "off", "yes"])
def test_a_yaml_boolean_where_a_list_is_expected_names_the_field(tmp_path, field, word):
    """``final_tasks: no`` once failed with "'bool' object is not iterable"."""
    config = tmp_path / "config.yaml"
    config.write_text(f"{field}: {word}\n", encoding="utf-8")
    with pytest.raises(ValueError) as refused:
        apply_overrides(TrainConfig(), read_config_file(config))
    assert str(refused.value).startswith(f"{field} must be a list of strings, got the boolean {word in ('yes',)}"
                                         .replace("True", "true").replace("False", "false"))  # fmt: skip
    assert "quote the word, or write none for an empty list" in str(refused.value)
    config.write_text(f"{field}: none\n" if field != "directions" else "", encoding="utf-8")
    apply_overrides(TrainConfig(), read_config_file(config))  # what the refusal says to write is accepted


# ------------------------------------------------------------------------------------------ results.json


def _finished_cell(tmp_path, monkeypatch, results_text: str) -> TrainConfig:
    monkeypatch.chdir(tmp_path)  # the cell's settings name its training file as the results do: train.txt
    Path("train.txt").write_text("".join(f"sentence {i}\n" for i in range(20)), encoding="utf-8")
    Path("cell").mkdir()
    Path("cell", "results.json").write_text(results_text, encoding="utf-8")
    return TrainConfig(train_file="train.txt", output_dir="cell")


def _results(**changes) -> dict:
    history = [{"step": 1, "loss": 2.0}, {"step": 2, "loss": 1.5}]
    results = {"config": TrainConfig(train_file="train.txt").to_dict(), "history": history,
               "total_steps": 2, "stsb_test_spearman": 31.29, "best_stsb_dev_spearman_during_training": 30.0,
               "evaluations": []}  # fmt: skip
    return {**results, **changes}


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        (json.dumps(_results())[:-1] + ', "stsb_test_spearman": 63.09}', "holds the key 'stsb_test_spearman' twice"),
        (json.dumps(_results(total_steps=-3)), "total_steps is -3, negative"),
        (json.dumps(_results(num_train_rows=float("nan"))), "num_train_rows must be an integer count, got NaN"),
        (json.dumps(_results(history=[])), "its history is empty ([]) while it records 2 steps"),
        (json.dumps(_results(history=[{"step": -5, "loss": 1.0}])), "history[0].step is -5: negative"),
        (json.dumps(_results(history=[{"step": 2}, {"step": 2}])), "history[1].step is 2: not after the step"),
        (
            json.dumps(_results(history=[{"step": 1, "lambda_mean": 0.1}, {"step": 2, "lambda_mean": float("nan")}])),
            "history[1].lambda_mean is NaN, not a number",
        ),
    ],
    ids=["duplicate-key", "negative-count", "nan-count", "empty-history", "negative-step", "repeated-step", "nan"],
)
def test_compare_never_reuses_a_results_file_it_cannot_trust(tmp_path, monkeypatch, caplog, text, problem):
    """A cell whose results.json has a key twice (compare once read the second: 31.29 -> 63.09), a negative or
    NaN count, an empty history for a run that took steps, or a negative or repeated step is not a finished
    result: the warning names the file and the problem, and the cell is trained again."""
    config = _finished_cell(tmp_path, monkeypatch, text)
    with caplog.at_level(logging.WARNING, logger="simcse_weince.compare.cells"):
        state = check_cell(config, TEXT_CELLS)
    assert state.results is None
    [warning] = [record.getMessage() for record in caplog.records if record.levelno == logging.WARNING]
    assert "results.json is not a valid result" in warning and problem in warning, warning
    assert warning.endswith("the cell is trained again")


def test_compare_reuses_a_sound_results_file(tmp_path, monkeypatch):
    state = check_cell(_finished_cell(tmp_path, monkeypatch, json.dumps(_results())), TEXT_CELLS)
    assert state.results["stsb_test_spearman"] == 31.29


# -------------------------------------------------------------------------------------------- metrics.csv


def _log(tmp_path, rows: str):
    path = tmp_path / "run" / "logs" / "metrics.csv"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("step,name,value\n" + rows, encoding="utf-8")
    return path


@pytest.mark.parametrize(
    ("rows", "problem"),
    [
        ("1,lambda_mean,0.2\n-5,lambda_mean,0.9\n", "line 3: step -5 is negative"),
        (
            "1,lambda_mean,0.2\n2,lambda_mean,0.3\n1,lambda_mean,0.9\n",
            "line 4: step 1 logs 'lambda_mean' twice (also line 2)",
        ),
        ("1.5,lambda_mean,0.2\n", "line 2: step '1.5' is not an integer"),
        ("1,lambda_mean,high\n", "line 2: lambda_mean at step 1 is 'high', not a number"),
    ],
    ids=["negative-step", "repeated-step", "fractional-step", "not-a-number"],
)
def test_a_step_log_with_a_step_that_cannot_be_is_refused(tmp_path, rows, problem):
    """``diagnose --training-log`` once plotted step -5 and the second of two rows of one step."""
    path = _log(tmp_path, rows)
    for read in (read_metrics_log, load_training_log, lambda_series):
        with pytest.raises(RecordError, match=problem.replace("(", r"\(").replace(")", r"\)")):
            read(path)


def test_an_all_nan_column_is_reported_as_nan_not_as_missing(tmp_path):
    path = _log(tmp_path, "".join(f"{step},lambda_mean,nan\n{step},loss,{1 / step}\n" for step in range(1, 5)))
    assert [row["step"] for row in load_training_log(path)] == [1, 2, 3, 4]
    with pytest.raises(ValueError, match="holds only NaN .* values in lambda_mean") as refused:
        lambda_series(path)
    assert "none of the columns" not in str(refused.value)
    with pytest.raises(ValueError, match="none of the columns"):  # a log without the statistics says so
        lambda_series(_log(tmp_path, "1,loss,2.0\n"))
    with pytest.raises(RecordError, match="step 3 twice"):  # a results.json history is held to the same rule
        load_training_log([{"step": 3, "lambda_mean": 0.1}, {"step": 3, "lambda_mean": 0.2}])


# ------------------------------------------------------------------------------- files of the training run


def test_a_json_lines_training_row_with_a_key_twice_is_refused_naming_the_line(tmp_path):
    from simcse_weince.text.columns import read_table

    path = tmp_path / "pairs.jsonl"
    rows = [{"anchor": f"sentence {i}", "positive": f"another {i}"} for i in range(4)]
    lines = [json.dumps(row) for row in rows]
    lines[2] = '{"anchor": "kept", "positive": "a pair", "anchor": "silently replaced"}'
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    with pytest.raises(ValueError, match=f"training file {path}, line 3 holds the key 'anchor' twice"):
        read_table(path)


@pytest.mark.parametrize(
    ("text", "problem"),
    [('{"max_seq_length": 128, "max_seq_length": 16}', "holds the key 'max_seq_length' twice"),
     ('{"max_seq_length": -16}', "max_seq_length is -16, negative"),
     ('{"max_seq_length": NaN}', "max_seq_length must be an integer count, got NaN")],
    ids=["duplicate", "negative", "nan"],
)  # fmt: skip
def test_a_received_sentence_transformers_config_is_read_strictly(tmp_path, text, problem):
    from simcse_weince.text.model import default_max_seq_length

    (tmp_path / "sentence_bert_config.json").write_text(text, encoding="utf-8")
    with pytest.raises(ValueError, match=re.escape(problem)):
        default_max_seq_length(str(tmp_path), tokenizer=None)
    (tmp_path / "sentence_bert_config.json").write_text('{"max_seq_length": 16}', encoding="utf-8")
    assert default_max_seq_length(str(tmp_path), tokenizer=None) == 16


def test_a_resumed_run_keeps_only_the_well_formed_rows_of_its_log_up_to_its_checkpoint(tmp_path):
    """On resume the CSV log keeps the rows up to the checkpoint's step; a row whose step is not a count (an edited
    or damaged log) is dropped rather than stopping the resume with a traceback."""
    from simcse_weince.training.tracking import make_csv_tracker

    log = tmp_path / "metrics.csv"
    rows = ["1,loss,0.5", "2,loss,0.4", "x,loss,0.3", "-1,loss,0.2", ",loss,0.1", "3,loss,0.05", "2,lr,1e-5"]
    log.write_text("step,name,value\n" + "\n".join(rows) + "\n")
    tracker = make_csv_tracker(tmp_path)
    tracker.start_step = 2
    tracker.start()
    tracker.log({"loss": 0.25}, step=3)
    tracker.finish()
    assert log.read_text().splitlines() == ["step,name,value", "1,loss,0.5", "2,loss,0.4", "2,lr,1e-5", "3,loss,0.25"]
