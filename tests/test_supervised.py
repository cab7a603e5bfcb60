"""Supervised SimCSE: training files of pairs and triplets (hard negatives), end to end on SICK's real sentences.

- the trainer's step on a 2- and a 3-column batch gives the loss and gradients of a brute-force reference written
  from the definition (each anchor's row: its positive, the other rows' positives, then every hard negative), for
  InfoNCE and WEINCE (:func:`simcse_weince.weince.reference.reference_weince_loss`), plainly and with GradCache;
- on the same embeddings InfoNCE equals sentence-transformers' ``MultipleNegativesRankingLoss``;
- a 3-column run resumes exactly after a SIGKILL, and ``SentenceTransformer(output_dir)`` (with the kept MLP as a
  Dense module) reproduces its reported score;
- every malformed file ends in one line and leaves no run folder behind.
"""

from __future__ import annotations

import json
import math
import signal
import subprocess
import sys

import pytest
import torch
from train_helpers import (
    REPO_ROOT,
    assert_grads_close,
    cli_command,
    folder_score,
    logged_steps,
    subprocess_env,
    wait_for,
)

from simcse_weince.cli import main
from simcse_weince.losses.from_embeddings import ContrastiveObjective
from simcse_weince.settings import load_config
from simcse_weince.text.columns import read_table
from simcse_weince.text.config import TrainConfig, preset
from simcse_weince.text.data import PaddingCollator, load_training_data, tokenize
from simcse_weince.text.model import SimCSEModel
from simcse_weince.text.trainer import forward_backward, train
from simcse_weince.weince.loss import WeinceConfig
from simcse_weince.weince.reference import reference_weince_loss

sys.path.insert(0, str(REPO_ROOT / "scripts" / "study"))
from sick_supervised_demo import build_sick_files  # noqa: E402

ROWS = 12
CONFIG = WeinceConfig(quantile=0.3, min_tail_points=8)  # λ well above 0 on a batch this small


@pytest.fixture(scope="module")
def sick(tmp_path_factory, data_dir):
    return build_sick_files(data_dir, tmp_path_factory.mktemp("sick"))


@pytest.fixture(scope="module")
def accelerator(one_thread):
    from accelerate import Accelerator

    return Accelerator(cpu=True)


def test_sick_files_hold_entailment_pairs_and_contradiction_triplets(sick):
    pairs, triplets = read_table(sick["pairs"]), read_table(sick["triplets"])
    assert pairs.columns == ("sent0", "sent1") and len(pairs) == 1299  # SICK_train's ENTAILMENT pairs
    assert triplets.columns == ("sent0", "sent1", "hard_neg") and 200 < len(triplets) < len(pairs)
    assert all(neg != pos for pos, neg in zip(triplets.rows["sent1"], triplets.rows["hard_neg"]))


# ------------------------------------------------------------------------ the step against the definition


def _batch(model, path, rows=ROWS):
    dataset, columns, _ = load_training_data(path)
    tokenized = tokenize(dataset.select(range(rows)), model.tokenizer, 32, columns)
    return PaddingCollator(model.tokenizer.pad_token_id)([tokenized[i] for i in range(rows)]), columns


def _reference_step(model, batch, columns, loss, temperature=0.05):
    """The columns' embeddings, the definition's loss on them (float64), autograd to the weights."""
    model.zero_grad(set_to_none=True)
    width = batch["input_ids"].shape[0] // len(columns)
    views = [view.double() for view in model(**batch).split(width)]
    with torch.no_grad():  # the stacked columns are the columns: each encoded on its own gives the same vectors
        for c, view in enumerate(views):
            alone = model(**{name: value[c * width : (c + 1) * width] for name, value in batch.items()})
            torch.testing.assert_close(alone.double(), view, rtol=1e-5, atol=1e-6)
    anchors, candidates = views[0], torch.cat(views[1:])  # [positives; hard negatives]
    if loss == "weince":
        value, _ = reference_weince_loss(anchors, candidates, temperature=temperature, weince=CONFIG)
    else:  # cross-entropy of column i among all candidates, written out
        sims = torch.nn.functional.normalize(anchors, dim=1) @ torch.nn.functional.normalize(candidates, dim=1).T
        logits = sims / temperature
        value = torch.stack([torch.logsumexp(logits[i], 0) - logits[i, i] for i in range(len(anchors))]).mean()
    value.backward()
    return value.item(), {name: p.grad.clone().float() for name, p in model.named_parameters() if p.grad is not None}


def _trainer_step(model, batch, columns, loss, accelerator, mini_batch_size=None):
    model.zero_grad(set_to_none=True)
    objective = ContrastiveObjective(loss, 0.05, weince=CONFIG)
    value, _ = forward_backward(model, batch, objective, accelerator, mini_batch_size, num_columns=len(columns))
    return value.item(), {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("loss", ["infonce", "weince"])
@pytest.mark.parametrize("kind", ["pairs", "triplets"])
@pytest.mark.parametrize("mini_batch_size", [None, 5])
def test_a_batch_of_pairs_or_triplets_gives_the_loss_and_gradients_of_the_definition(
    minilm_path, sick, accelerator, loss, kind, mini_batch_size
):
    # the real MiniLM: a random tiny BERT puts every [CLS] within 1e-6 of the endpoint, where float32 logits (the
    # trainer's) and the float64 reference part by design
    model = SimCSEModel.from_pretrained(minilm_path, pooler="cls", dropout=0.0, mlp_only_train=False).train()
    batch, columns = _batch(model, sick[kind])
    assert len(columns) == (2 if kind == "pairs" else 3)
    expected_loss, expected_grads = _reference_step(model, batch, columns, loss)
    value, grads = _trainer_step(model, batch, columns, loss, accelerator, mini_batch_size)
    assert value == pytest.approx(expected_loss, rel=1e-5)
    assert "mlp.0.weight" in grads  # the head is trained too
    # the trainer's loss runs in float32, the reference in float64; a wrong candidate layout moves every gradient
    # by O(1) of the largest
    assert_grads_close(grads, expected_grads, tolerance=1e-4)


def test_the_reference_sees_the_correction(minilm_path, sick):
    """The WEINCE cases above differ from InfoNCE (λ > 0 for some anchors), or they would test InfoNCE twice."""
    from simcse_weince.weince.loss import weince_loss

    model = SimCSEModel.from_pretrained(minilm_path, pooler="cls", dropout=0.0).eval()
    batch, columns = _batch(model, sick["triplets"])
    with torch.no_grad():
        views = model(**batch).chunk(3)
        _, stats = weince_loss(views[0], torch.cat(views[1:]), temperature=0.05, weince=CONFIG, return_stats=True)
    assert stats["mixing_weight"].max() > 0.3


@pytest.mark.parametrize("hard_negatives", [False, True])
def test_infonce_equals_multiple_negatives_ranking_loss_on_the_same_embeddings(minilm, hard_negatives):
    from sentence_transformers.sentence_transformer.losses import MultipleNegativesRankingLoss

    generator = torch.Generator().manual_seed(3)
    columns = [torch.randn(16, 384, generator=generator) for _ in range(3 if hard_negatives else 2)]
    expected = MultipleNegativesRankingLoss(minilm, scale=20.0).compute_loss_from_embeddings(columns, None)
    loss, _ = ContrastiveObjective("infonce", 0.05, gather=False)(*columns)
    assert loss.item() == pytest.approx(expected.item(), rel=1e-6)


def test_hard_negatives_need_the_simcse_geometry():
    objective = ContrastiveObjective("infonce", 0.05, geometry="simclr", gather=False)
    with pytest.raises(ValueError, match="hard negatives need the simcse geometry"):
        objective(torch.randn(4, 8), torch.randn(4, 8), torch.randn(4, 8))


# ------------------------------------------------------------------------------------------- whole runs


def _flags(model, train_file, steps=8, save=3):
    return [
        "--model", str(model), "--train-file", str(train_file), "--pooler", "cls", "--batch-size", "16",
        "--max-steps", str(steps), "--eval-steps", "4", "--save-steps", str(save), "--learning-rate", "1e-3",
        "--final-tasks", "none", "--eval-max-length", "32", "--report-to", "csv", "--dropout", "0.1",
    ]  # fmt: skip


def test_a_triplet_run_resumes_exactly_after_a_kill_and_its_folder_reproduces_its_score(
    tiny_model, sick, tmp_path, data_dir, one_thread
):
    from sentence_transformers import SentenceTransformer

    flags = _flags(tiny_model, sick["triplets"])
    run_dir = tmp_path / "killed"
    # one intra-op thread here and in the killed process: float sums then run in the same order in both
    env = {**subprocess_env(), "OMP_NUM_THREADS": "1"}
    process = subprocess.Popen(cli_command("train", *flags, "--output-dir", str(run_dir)), env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    checkpoint = run_dir / "checkpoints" / "step-0000003"
    wait_for(lambda: (checkpoint / "trainer_state.json").is_file(), process, what="the checkpoint of step 3")
    assert process.poll() is None and logged_steps(run_dir) < 8, "the run finished before it could be killed"
    process.send_signal(signal.SIGKILL)
    process.communicate(timeout=60)

    config = load_config(TrainConfig, run_dir / "training_config.yaml")
    resumed = train(config, resume=True)
    reference = train(preset("paper", **{**config.to_dict(), "output_dir": str(tmp_path / "reference")}))
    assert resumed["resumed_from_step"] == 3
    assert [e["loss"] for e in resumed["history"]] == pytest.approx([e["loss"] for e in reference["history"]],
                                                                     abs=1e-6)  # fmt: skip
    assert resumed["train_columns"] == {"sent0": "anchor", "sent1": "positive", "hard_neg": "hard negative"}
    assert resumed["num_train_rows"] == len(read_table(sick["triplets"]))
    assert resumed["evaluation_pooler"] == "cls"  # supervised: the MLP is kept (SimCSE without --mlp_only_train)

    exported = SentenceTransformer(str(run_dir), device="cpu")
    assert [type(module).__name__ for module in exported] == ["Transformer", "Pooling", "Dense"]
    assert folder_score(exported, resumed, "dev", data_dir) == pytest.approx(resumed["stsb_dev_spearman"], abs=1e-6)
    card = (run_dir / "README.md").read_text(encoding="utf-8")
    assert "supervised SimCSE" in card and "`hard_neg` = hard negative" in card and "Dense" in card


def test_pairs_in_sentence_transformers_names_train_and_drop_the_mlp_when_asked(tiny_model, sick, tmp_path):
    rows = read_table(sick["pairs"]).rows
    path = tmp_path / "pairs.jsonl"
    path.write_text("".join(json.dumps({"positive": p, "anchor": a}) + "\n"
                            for a, p in zip(rows["sent0"][:64], rows["sent1"][:64])), encoding="utf-8")  # fmt: skip
    config = preset("paper", model=tiny_model, train_file=str(path), pooler="cls", batch_size=16, max_steps=2,
                    eval_steps=0, final_tasks=(), report_to=("csv",), eval_max_length=32, mlp_only_train=True,
                    output_dir=str(tmp_path / "run"))  # fmt: skip
    results = train(config)
    assert results["train_columns"] == {"anchor": "anchor", "positive": "positive"}
    assert results["evaluation_pooler"] == "cls_before_pooler" and not (tmp_path / "run" / "2_Dense").exists()
    assert all(math.isfinite(entry["loss"]) for entry in results["history"])


def test_the_paper_sup_preset_is_simcses_supervised_recipe():
    config = preset("paper-sup")
    assert (config.model, config.train_file, config.batch_size, config.learning_rate, config.num_epochs) == (
        "bert-base-uncased", "nli_for_simcse.csv", 512, 5e-5, 3)  # fmt: skip
    assert (config.max_length, config.temperature, config.eval_steps, config.pooler) == (32, 0.05, 125, "cls")
    assert config.mlp_only_train is False and config.resolved_mlp_only_train(3) is False
    assert preset("paper").resolved_mlp_only_train(1) is True and preset("paper").resolved_mlp_only_train(3) is False


# ----------------------------------------------------------------------------------------- malformed files

GOOD = "sent0,sent1,hard_neg\nA man plays.,Someone plays.,Nobody plays.\nA cat sleeps.,An animal rests.,A cat runs.\n"
MALFORMED = [
    ("missing-positive.csv", "sent0,hard_neg\na,b\n", "has no sent1 column"),
    ("unknown-column.csv", "sent0,sent1,label\na,b,c\n", "unknown column 'label'"),
    ("no-anchor.csv", "premise,hypothesis\na,b\n", "names no anchor column"),
    ("twice.csv", "sent0,sent0\na,b\n", "names column 'sent0' twice"),
    ("empty-cell.csv", GOOD + "A dog barks.,,A dog sleeps.\n", "line 4: column 'sent1' is empty"),
    ("ragged.csv", GOOD + "A dog barks.,A dog is loud.\n", "line 4: 2 fields where the header has 3"),
    ("quoting.csv", GOOD + 'A "dog" barks.,"A dog is loud.,x\n', "line 4"),
    # issue 39: an unbalanced quote that a later quote closes once silently merged lines 3-6 into one row
    ("quote-over-lines.tsv", 'anchor\tpositive\na\tb\nx\t"c\nd\te\nf\tg\nh"\ni\tj\n',
     "line 3: a quote opened here runs over 4 lines (to line 6)"),
    ("quote-over-lines.csv", 'sent0,sent1\na,b\nx,"c\nd,e"\n', "line 3: a quote opened here runs over 2 lines"),
    # issue 54: a quote left open is reported where it opened, not at the line where the reader gave up
    ("open-to-the-end.csv", 'sent0,sent1\na,b\nx,"c\nd,e\nf,g\n',
     "line 3: a quote opened here is never closed (it runs to the end of the file, line 5)"),
    ("open-to-the-end.tsv", 'anchor\tpositive\n"a\tb\nc\td\n', "line 2: a quote opened here is never closed"),
    ("open-until-a-stray-quote.csv", 'sent0,sent1\na,b\nx,"c\nd,e\n"f",g\nh,i\n',
     "line 3: a quote opened here runs to line 5, where the row cannot be read"),
    ("unterminated.jsonl", '{"anchor": "a", "positive": "b"}\n{"anchor": "c", "positive": "d}\n',
     "line 2, column 29: not JSON (Unterminated string starting at)"),
    ("header-only.tsv", "anchor\tpositive\n", "has a header (anchor,positive) but no rows"),
    ("empty.csv", "", "is empty"),
    ("not-object.jsonl", '{"anchor": "a", "positive": "b"}\n["a", "b"]\n', "line 2: a JSON list, not an object"),
    ("missing-key.jsonl", '{"anchor": "a", "positive": "b"}\n{"anchor": "c"}\n',
     "line 2: the object has no 'positive'"),
    ("not-json.jsonl", '{"anchor": "a", "positive": "b"}\n{anchor: c}\n', "line 2, column 2: not JSON"),
    ("number.jsonl", '{"anchor": "a", "positive": 3}\n', "column 'positive' holds int 3, not text"),
    # rows are counted as what they are (the message once said "sentences" for a table)
    ("too-few.csv", GOOD, "hold 2 triplets (sent0,sent1,hard_neg), fewer than one batch of 16"),
]  # fmt: skip


@pytest.mark.parametrize("name, text, expect", MALFORMED, ids=[case[0] for case in MALFORMED])
def test_a_malformed_training_file_ends_in_one_line_and_leaves_no_run_folder(
    tiny_model, tmp_path, capsys, name, text, expect
):
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    _expect_one_error_line(tiny_model, path, tmp_path, capsys, expect)


def test_a_training_table_that_is_not_utf8_ends_in_one_line(tiny_model, tmp_path, capsys):
    path = tmp_path / "latin1.csv"
    path.write_bytes(b"sent0,sent1\ncaf\xe9,coffee\n")
    _expect_one_error_line(tiny_model, path, tmp_path, capsys, "is not UTF-8 text: invalid byte 0xe9")


def _expect_one_error_line(tiny_model, path, tmp_path, capsys, expect):
    run_dir = tmp_path / "run"
    capsys.readouterr()
    code = main(["train", *_flags(tiny_model, path), "--output-dir", str(run_dir)])
    err = capsys.readouterr().err
    assert code != 0 and "Traceback" not in err
    error_lines = [line for line in err.splitlines() if "error:" in line]
    assert len(error_lines) == 1 and expect in error_lines[0], err[-2000:]
    assert not run_dir.exists(), "a failed start left a run folder behind"


def test_compare_runs_on_a_triplet_file_unchanged(tiny_model, sick, tmp_path, data_dir):
    sweep = tmp_path / "sweep"
    args = [
        "compare", "--preset", "cpu-cls", "--losses", "infonce,weince", "--seeds", "1,2", "--max-steps", "2",
        "--eval-steps", "0", "--final-tasks", "none", "--output-dir", str(sweep), "--data-dir", str(data_dir),
        "--eval-before-training", "false", "--save-steps", "0", "--report-to", "csv", "--mixed-precision", "no",
        "--model", tiny_model, "--train-file", str(sick["triplets"]), "--batch-size", "16", "--eval-max-length",
        "32",
    ]  # fmt: skip
    assert main(args) == 0
    summary = json.loads((sweep / "comparison.json").read_text())
    assert {(run["variant"], run["seed"]) for run in summary["runs"]} == {
        (variant, seed) for variant in ("infonce", "weince") for seed in (1, 2)}  # fmt: skip
    for run in summary["runs"]:
        results = json.loads((sweep / run["variant"] / f"seed-{run['seed']}" / "results.json").read_text())
        assert results["train_columns"] == {"sent0": "anchor", "sent1": "positive", "hard_neg": "hard negative"}
        assert run["stsb_test"] == pytest.approx(results["stsb_test_spearman"])
    assert summary["differences"]["weince"]["stsb_test"]["n"] == 2
    assert main(args) == 0  # a rerun reads the four finished cells: same settings, same file


def test_paper_sup_offline_without_the_nli_file_says_where_it_looked(tmp_path, capsys):
    run_dir = tmp_path / "run"
    capsys.readouterr()
    code = main(["train", "--preset", "paper-sup", "--data-dir", str(tmp_path), "--output-dir", str(run_dir)])
    err = capsys.readouterr().err
    error_lines = [line for line in err.splitlines() if "error:" in line]
    assert code != 0 and len(error_lines) == 1 and "Traceback" not in err, err[-2000:]
    assert "nli_for_simcse.csv" in error_lines[0] and str(tmp_path) in error_lines[0]
    assert not run_dir.exists()


def test_header_names_are_read_as_checked_spaces_around_them_ignored(tmp_path):
    path = tmp_path / "spaced.csv"
    path.write_text("sent1 , sent0\nSomeone plays.,A man plays.\n", encoding="utf-8")
    table = read_table(path)
    assert table.columns == ("sent0", "sent1")
    assert table.rows == {"sent0": ["A man plays."], "sent1": ["Someone plays."]}
