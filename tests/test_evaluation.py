"""STS evaluation without the real encoder: loaders on the real files, hand-computed aggregations, clear errors,
the 🤗 evaluate module, SimCSE's poolers on a tiny BERT, and the CLI end to end on that tiny model."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from train_helpers import make_tiny_model

from simcse_weince.evaluation import (
    AGGREGATIONS,
    METRIC_PATH,
    STSData,
    as_encoder,
    evaluate_sts,
    format_sts_table,
    load_sts_task,
    load_stsb,
    sts_correlations,
    stsb_spearman,
)
from simcse_weince.evaluation.data import SENTEVAL_STS_SUBSETS

# ----------------------------------------------------------------------------------------------------------------
# Loaders on the real files

# SentEval's pair counts (SimCSE's logs): STS12-16 after dropping empty gold lines, STS-B test, SICK test.
SENTEVAL_SIZES = {
    "sts12": {"MSRpar": 750, "MSRvid": 750, "SMTeuroparl": 459, "surprise.OnWN": 750, "surprise.SMTnews": 399},
    "sts13": {"FNWN": 189, "headlines": 750, "OnWN": 561},
    "sts14": {"deft-forum": 450, "deft-news": 300, "headlines": 750, "images": 750, "OnWN": 750, "tweet-news": 750},
    "sts15": {"answers-forums": 375, "answers-students": 750, "belief": 375, "headlines": 750, "images": 750},
    "sts16": {"answer-answer": 254, "headlines": 249, "plagiarism": 230, "postediting": 244, "question-question": 209},
    "stsb": {"stsb": 1379},
    "sickr": {"sickr": 4927},
}


@pytest.mark.parametrize("task", list(SENTEVAL_SIZES))
def test_senteval_loaders_read_every_pair_sentevals_way(task, data_dir):
    data = load_sts_task(task, data_dir=data_dir)
    assert {name: data.subsets.count(name) for name in data.subset_names} == SENTEVAL_SIZES[task]
    assert len(data.sentences1) == len(data.sentences2) == len(data.scores) == sum(SENTEVAL_SIZES[task].values())
    low, high = (1.0, 5.0) if task == "sickr" else (0.0, 5.0)
    assert all(low <= score <= high for score in data.scores)
    # SimCSE's batcher sees ' '.join(line.split()): no tabs, no double or edge spaces
    for sentence in data.sentences1[:200] + data.sentences2[-200:]:
        assert sentence == " ".join(sentence.split())


def _senteval_sts_transcription(folder: Path, subsets: list[str]):
    """SentEval's STSEval.loadFile, transcribed (numpy masks and all), as the reference for our loader."""
    pairs = []
    for dataset in subsets:
        sent1, sent2 = zip(
            *[
                line.split("\t")
                for line in open(folder / f"STS.input.{dataset}.txt", encoding="utf8").read().splitlines()
            ]
        )
        raw_scores = np.array(open(folder / f"STS.gs.{dataset}.txt", encoding="utf8").read().splitlines())
        not_empty_idx = raw_scores != ""
        gs_scores = [float(x) for x in raw_scores[not_empty_idx]]
        sent1 = np.array([s.split() for s in sent1], dtype=object)[not_empty_idx]
        sent2 = np.array([s.split() for s in sent2], dtype=object)[not_empty_idx]
        pairs += [(dataset, " ".join(a), " ".join(b), g) for a, b, g in zip(sent1, sent2, gs_scores)]
    return sorted(pairs)


@pytest.mark.parametrize("task", ["sts15", "sts16"])  # the two years with unannotated (empty gold) pairs
def test_sts_loader_equals_a_transcription_of_senteval(task, data_dir):
    folder, subsets = SENTEVAL_STS_SUBSETS[task]
    data = load_sts_task(task, data_dir=data_dir)
    ours = sorted(zip(data.subsets, data.sentences1, data.sentences2, data.scores))
    assert ours == _senteval_sts_transcription(data_dir / "senteval" / "downstream" / folder, subsets)


def test_stsbenchmark_and_sick_splits(data_dir):
    assert [len(load_sts_task("stsb", split, data_dir)) for split in ("train", "dev", "test")] == [5749, 1500, 1379]
    assert [len(load_sts_task("sickr", split, data_dir)) for split in ("train", "dev", "test")] == [4500, 500, 4927]
    sick = load_sts_task("SICK-R", "test", data_dir)  # aliases; header skipped, CRLF stripped
    assert sick.sentences1[0] == "There is no boy playing outdoors and there is no man smiling"
    assert sick.scores[:2] == [3.3, 3.7]
    stsb = load_sts_task("STSBenchmark", "test", data_dir)
    assert (stsb.sentences1[0], stsb.sentences2[0], stsb.scores[0]) == (
        "a girl is styling her hair .",
        "a girl is brushing her hair .",
        2.5,
    )


def test_raw_stsb_loader(data_dir):
    sizes = {split: len(load_stsb(split, data_dir)) for split in ("train", "dev", "test")}
    assert sizes == {"train": 5749, "dev": 1500, "test": 1379}
    test = load_stsb("test", data_dir)
    assert (test.sentences1[0], test.sentences2[0], test.scores[0]) == (
        "A girl is styling her hair.",
        "A girl is brushing her hair.",
        2.5,
    )
    # lines with extra trailing source fields keep their sentences in columns 5-6 (quoting disabled)
    assert all("\t" not in s and "http" not in s for s in test.sentences2)
    assert min(test.scores) == 0.0 and max(test.scores) == 5.0


# ----------------------------------------------------------------------------------------------------------------
# Hand-made SentEval tree: empty gold lines, malformed lines, missing files


def _write_sts13(root: Path, files: dict[str, tuple[str, str]]) -> Path:
    folder = root / "senteval" / "downstream" / "STS" / "STS13-en-test"
    folder.mkdir(parents=True)
    for subset, (inputs, gold) in files.items():
        (folder / f"STS.input.{subset}.txt").write_text(inputs, encoding="utf-8")
        (folder / f"STS.gs.{subset}.txt").write_text(gold, encoding="utf-8")
    return folder


GOOD_STS13 = {
    "FNWN": ("a  cat\tthe cat \nx\ty\nfoo\tbar\n", "4.0\n\n 2.5\n"),  # second pair unannotated -> dropped
    "headlines": ("one\ttwo\nthree\tfour\n", "1\n0\n"),
    "OnWN": ("p\tq\nr\ts\n", "5.000\n3\n"),
}


def test_sts_loader_skips_empty_gold_and_normalises_whitespace(tmp_path):
    _write_sts13(tmp_path, GOOD_STS13)
    data = load_sts_task("sts13", data_dir=tmp_path)
    assert data.sentences1 == ["a cat", "foo", "one", "three", "p", "r"]
    assert data.sentences2 == ["the cat", "bar", "two", "four", "q", "s"]
    assert data.scores == [4.0, 2.5, 1.0, 0.0, 5.0, 3.0]
    assert data.subsets == ["FNWN", "FNWN", "headlines", "headlines", "OnWN", "OnWN"]


@pytest.mark.parametrize(
    "subset, inputs, gold, message",
    [
        ("FNWN", "a\tb\nc\td\n", "1\n", "must align line by line"),
        ("FNWN", "a b\nc\td\n", "1\n2\n", "STS.input.FNWN.txt:1: expected two tab-separated"),
        ("FNWN", "a\tb\nc\td\n", "1\nhigh\n", "STS.gs.FNWN.txt:2: gold score 'high' is not a number"),
        ("FNWN", "a\tb\nc\td\n", "1\nnan\n", "not finite"),
        # a gold file whose scores are off the scale (an edited cell, another file's column)
        ("FNWN", "a\tb\nc\td\n", "1\n12345\n", r"STS.gs.FNWN.txt:2: gold score '12345' is outside the 0-5 scale"),
        ("FNWN", "a\tb\nc\td\n", "-0.5\n1\n", r"STS.gs.FNWN.txt:1: gold score '-0.5' is outside the 0-5 scale"),
    ],
)
def test_malformed_sts_files_are_named_with_line_numbers(tmp_path, subset, inputs, gold, message):
    _write_sts13(tmp_path, {**GOOD_STS13, subset: (inputs, gold)})
    with pytest.raises(ValueError, match=message):
        load_sts_task("sts13", data_dir=tmp_path)


def test_missing_subset_file_is_named(tmp_path):
    folder = _write_sts13(tmp_path, GOOD_STS13)
    (folder / "STS.gs.OnWN.txt").unlink()
    with pytest.raises(FileNotFoundError, match=r"STS\.gs\.OnWN\.txt.*SIMCSE_WEINCE_DATA_DIR"):
        load_sts_task("sts13", data_dir=tmp_path)


def test_missing_data_offline_names_the_path_and_the_variable(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("SIMCSE_WEINCE_DATA_DIR", str(tmp_path / "nowhere"))
    with pytest.raises(FileNotFoundError, match=r"nowhere.*STS12-en-test.*SIMCSE_WEINCE_DATA_DIR"):
        load_sts_task("sts12")
    with pytest.raises(FileNotFoundError, match=r"stsbenchmark.*sts-dev\.csv.*SIMCSE_WEINCE_DATA_DIR"):
        load_stsb("dev")


def test_malformed_stsb_and_sick_lines(tmp_path):
    raw = tmp_path / "stsbenchmark"
    raw.mkdir()
    (raw / "sts-dev.csv").write_text('g\tf\t2012\t1\t3.0\tA "quoted.\tB.\ng\tf\t2012\t2\t4.0\tonly one\n')
    with pytest.raises(ValueError, match=r"sts-dev\.csv:2: expected at least 7 tab-separated fields"):
        load_stsb("dev", tmp_path)
    (raw / "sts-dev.csv").write_text('g\tf\t2012\t1\t3.0\tA "quoted.\tB.\n\ng\tf\t2012\t2\t4.0\tC\tD\textra\n')
    data = load_stsb("dev", tmp_path)  # quotes kept literally, blank line skipped, extra fields ignored
    assert data.sentences1 == ['A "quoted.', "C"] and data.scores == [3.0, 4.0]

    sick = tmp_path / "senteval" / "downstream" / "SICK"
    sick.mkdir(parents=True)
    (sick / "SICK_trial.txt").write_text("1\ta\tb\t3.0\tNEUTRAL\n")
    with pytest.raises(ValueError, match="expected SICK's header"):
        load_sts_task("sickr", "dev", tmp_path)
    (sick / "SICK_trial.txt").write_text("pair_ID\tsentence_A\tsentence_B\trelatedness_score\n1\ta\tb\tx\n")
    with pytest.raises(ValueError, match=r"SICK_trial\.txt:2: gold score 'x'"):
        load_sts_task("sickr", "dev", tmp_path)
    (raw / "sts-dev.csv").write_text("g\tf\t2012\t1\t3.0\tA.\tB.\ng\tf\t2012\t2\t50\tC\tD\n")
    with pytest.raises(ValueError, match=r"sts-dev\.csv:2: gold score '50' is outside the 0-5 scale"):
        load_stsb("dev", tmp_path)


def test_bad_arguments_are_value_errors(data_dir):
    with pytest.raises(ValueError, match="unknown STS task"):
        load_sts_task("sts17", data_dir=data_dir)
    with pytest.raises(ValueError, match="only a test split"):
        load_sts_task("sts12", "dev", data_dir)
    with pytest.raises(ValueError, match="unknown split"):
        load_stsb("validation", data_dir)
    with pytest.raises(ValueError, match="unknown aggregation"):
        evaluate_sts(lambda s: np.ones((len(s), 2)), tasks=["sts13"], aggregation="median", data_dir=data_dir)
    with pytest.raises(ValueError, match="unknown pooler"):
        as_encoder("some/model", pooler="max")
    with pytest.raises(ValueError, match="same length"):
        STSData(["a"], ["b", "c"], [1.0])


# ----------------------------------------------------------------------------------------------------------------
# Aggregations on a hand-made example (correlations computed by hand)

# subset a: predictions rank 1,2,3 vs gold rank 1,3,2     -> d = 0,-1,1;    rho = 1 - 6*2/(3*(9-1))   = 0.5
# subset b: predictions rank 1,2,3,4 vs gold rank 1,2,4,3 -> d = 0,0,-1,1;  rho = 1 - 6*2/(4*(16-1))  = 0.8
PREDICTIONS = [1.0, 2.0, 3.0, 10.0, 20.0, 30.0, 40.0]
GOLD = [1.0, 3.0, 2.0, 1.0, 2.0, 4.0, 3.0]
SUBSETS = ["a", "a", "a", "b", "b", "b", "b"]


def _hand_all_spearman() -> float:
    # Concatenation: prediction ranks 1..7; gold 1,3,2,1,2,4,3 has ties -> average ranks
    # (1 -> ranks 1,2 -> 1.5; 2 -> 3,4 -> 3.5; 3 -> 5,6 -> 5.5; 4 -> 7). Spearman = Pearson of the ranks.
    prediction_ranks = [1, 2, 3, 4, 5, 6, 7]
    gold_ranks = [1.5, 5.5, 3.5, 1.5, 3.5, 7.0, 5.5]
    mean = 4.0  # both rank vectors average (1 + 7) / 2
    covariance = sum((p - mean) * (g - mean) for p, g in zip(prediction_ranks, gold_ranks))  # 15
    spread_p = sum((p - mean) ** 2 for p in prediction_ranks)  # 28
    spread_g = sum((g - mean) ** 2 for g in gold_ranks)  # 26.5
    assert (covariance, spread_p, spread_g) == (15.0, 28.0, 26.5)
    return covariance / math.sqrt(spread_p * spread_g)


def test_three_aggregations_match_hand_computation():
    report = sts_correlations(PREDICTIONS, GOLD, SUBSETS)
    assert report["subsets"]["a"] == pytest.approx({"spearman": 0.5, "pearson": 0.5, "n": 3})
    # pearson b: predictions centred -15,-5,5,15, gold centred -1.5,-.5,1.5,.5 -> 40 / sqrt(500 * 5) = 0.8
    assert report["subsets"]["b"] == pytest.approx({"spearman": 0.8, "pearson": 0.8, "n": 4})
    assert report["spearman"]["mean"] == pytest.approx((0.5 + 0.8) / 2, abs=1e-12)
    assert report["spearman"]["wmean"] == pytest.approx((3 * 0.5 + 4 * 0.8) / 7, abs=1e-12)
    assert report["spearman"]["all"] == pytest.approx(_hand_all_spearman(), abs=1e-12)
    assert report["spearman"]["all"] == pytest.approx(15 / math.sqrt(742), abs=1e-12)
    assert report["pearson"]["wmean"] == pytest.approx(4.7 / 7, abs=1e-12)
    assert report["n"] == 7 and set(AGGREGATIONS) == {"all", "mean", "wmean"}


def test_evaluate_sts_uses_the_chosen_aggregation_for_sts_years_only(tmp_path):
    _write_sts13(tmp_path, GOOD_STS13)
    stsb = tmp_path / "senteval" / "downstream" / "STS" / "STSBenchmark"
    stsb.mkdir(parents=True)
    (stsb / "sts-test.csv").write_text("".join(f"g\tf\ty\t{i}\t{i}.0\ts{i}\tt{i}\n" for i in range(4)))

    # A deterministic toy encoder: 2-d vectors whose angle depends on the characters of the sentence.
    def toy(sentences):
        return np.array([[1.0, (sum(map(ord, s)) % 13) / 5.0] for s in sentences], dtype=np.float32)

    results = {
        agg: evaluate_sts(toy, tasks=["sts13", "stsb"], aggregation=agg, data_dir=tmp_path) for agg in AGGREGATIONS
    }
    for agg in AGGREGATIONS:
        details = results[agg]["details"]["tasks"]["sts13"]
        assert results[agg]["sts13"] == pytest.approx(details["spearman"][agg])
        assert results[agg]["stsb"] == pytest.approx(results["all"]["stsb"])  # one subset: aggregation moot
        assert results[agg]["avg"] == pytest.approx((results[agg]["sts13"] + results[agg]["stsb"]) / 2)
        assert set(details["subsets"]) == {"FNWN", "headlines", "OnWN"}


def test_format_sts_table_averages_like_simcse():
    results = {"sts12": 70.004, "sts13": 80.006, "stsb": 75.0, "avg": 0.0}
    table = format_sts_table(results)
    header, rule, row = table.splitlines()
    assert [cell.strip() for cell in header.strip("|").split("|")] == ["STS12", "STS13", "STS-B", "Avg."]
    # SimCSE averages the printed numbers: (70.00 + 80.01 + 75.00) / 3 = 75.0033 -> 75.00
    assert [cell.strip() for cell in row.strip("|").split("|")] == ["70.00", "80.01", "75.00", "75.00"]


# ----------------------------------------------------------------------------------------------------------------
# 🤗 evaluate metric module


def test_evaluate_metric_module_loads_offline_and_matches(monkeypatch, tmp_path):
    import evaluate

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    metric = evaluate.load(METRIC_PATH, cache_dir=str(tmp_path))
    for aggregation in AGGREGATIONS:
        result = metric.compute(predictions=PREDICTIONS, references=GOLD, subsets=SUBSETS, aggregation=aggregation)
        expected = sts_correlations(PREDICTIONS, GOLD, SUBSETS)
        assert result["spearman"] == pytest.approx(100 * expected["spearman"][aggregation], abs=1e-9)
        assert result["pearson"] == pytest.approx(100 * expected["pearson"][aggregation], abs=1e-9)
    assert result["subsets"]["a"]["spearman"] == pytest.approx(50.0)
    assert metric.compute(predictions=[0.1, 0.2, 0.3], references=[1, 2, 3])["spearman"] == pytest.approx(100.0)


# ----------------------------------------------------------------------------------------------------------------
# SimCSE's poolers on a tiny BERT; the CLI end to end on it


@pytest.fixture(scope="module")
def tiny_bert_dir(tmp_path_factory):
    # 3 layers, so that avg_first_last and avg_top2 pool different layers
    return make_tiny_model(tmp_path_factory.mktemp("tiny-bert"), num_hidden_layers=3)


def _reference_pool(model, tokenizer, sentence: str, pooler: str):
    """SimCSE's evaluation.py batcher for a single sentence (no padding involved)."""
    import torch

    batch = tokenizer([sentence], return_tensors="pt", padding=True)
    with torch.no_grad():
        out = model(**batch, output_hidden_states=True, return_dict=True)
    hidden = out.hidden_states
    return {
        "cls": out.pooler_output[0],
        "cls_before_pooler": out.last_hidden_state[0, 0],
        "avg": out.last_hidden_state[0].mean(0),
        "avg_first_last": ((hidden[1] + hidden[-1]) / 2.0)[0].mean(0),
        "avg_top2": ((hidden[-1] + hidden[-2]) / 2.0)[0].mean(0),
    }[pooler]


@pytest.mark.parametrize("pooler", ["cls", "cls_before_pooler", "avg", "avg_first_last", "avg_top2"])
def test_hf_poolers_match_simcse_batcher_and_ignore_padding(tiny_bert_dir, pooler):
    import torch
    from transformers import AutoModel, AutoTokenizer

    model, tokenizer = AutoModel.from_pretrained(tiny_bert_dir), AutoTokenizer.from_pretrained(tiny_bert_dir)
    model.train()  # the encoder must switch to eval (no dropout) and restore the mode
    sentences = ["a man plays a guitar .", "hi", "the quick brown fox jumps over the lazy dog near the river bank ."]
    encode = as_encoder((model, tokenizer), pooler=pooler, batch_size=2, device="cpu", show_progress_bar=False)
    embeddings = encode(sentences)
    assert model.training
    model.eval()
    for row, sentence in enumerate(sentences):
        torch.testing.assert_close(
            embeddings[row], _reference_pool(model, tokenizer, sentence, pooler), atol=1e-5, rtol=1e-5
        )


def test_as_encoder_accepts_callables_paths_and_sentence_transformers(tiny_bert_dir):
    import torch
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Pooling, Transformer

    def constant(sentences):
        return np.ones((len(sentences), 3))

    assert as_encoder(constant) is constant
    with pytest.raises(ValueError, match="tokenizer"):
        from transformers import AutoModel

        as_encoder(AutoModel.from_pretrained(tiny_bert_dir))
    sentences = ["one sentence .", "another , longer sentence here ."]
    from_path = as_encoder(str(tiny_bert_dir), pooler="avg", show_progress_bar=False, device="cpu")(sentences)
    st_model = SentenceTransformer(modules=[Transformer(str(tiny_bert_dir)), Pooling(32, "mean")], device="cpu")
    from_st = as_encoder(st_model, show_progress_bar=False)(sentences)
    via_st_hf = as_encoder(st_model, pooler="avg", show_progress_bar=False, device="cpu")(sentences)
    torch.testing.assert_close(from_st, from_path, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(via_st_hf, from_path, atol=1e-5, rtol=1e-5)


def test_batches_follow_token_counts_not_characters(minilm):
    from simcse_weince.evaluation.encoders import length_sorted_batches

    tokenizer = minilm.tokenizer
    # character and token orders disagree here: one long word is few tokens, many short words are many
    sentences = ["a b c d e f g h", "hi", "extraordinarily", "the cat sat on the mat", "x y", "ok then"]
    tokens = [len(ids) for ids in tokenizer(sentences)["input_ids"]]
    batches = length_sorted_batches(sentences, 4, tokenizer)
    order = [index for batch in batches for index in batch]
    assert sorted(order) == list(range(len(sentences))) and [len(batch) for batch in batches] == [4, 2]
    assert order == sorted(range(len(sentences)), key=lambda index: -tokens[index])
    by_characters = [index for batch in length_sorted_batches(sentences, 4) for index in batch]
    assert by_characters == sorted(range(len(sentences)), key=lambda index: -len(sentences[index])) != order
    # truncation is counted as the encoding will truncate
    assert length_sorted_batches(sentences, 2, tokenizer, max_length=3)[0] == [0, 1]  # all tie at 3: input order
    assert length_sorted_batches([], 8, tokenizer) == []


def test_token_sorted_batches_carry_almost_no_padding_on_sts(minilm, data_dir):
    from simcse_weince.evaluation.encoders import length_sorted_batches

    data = load_stsb("dev", data_dir=data_dir)
    sentences = list(dict.fromkeys(data.sentences1 + data.sentences2))
    tokens = [len(ids) for ids in minilm.tokenizer(sentences)["input_ids"]]

    def positions(batches):  # what a forward pass encodes: every batch padded to its longest sentence
        return sum(len(batch) * max(tokens[index] for index in batch) for batch in batches)

    by_tokens = positions(length_sorted_batches(sentences, 64, minilm.tokenizer))
    by_characters = positions(length_sorted_batches(sentences, 64))
    # STS-B dev, batches of 64: 1.04x the real tokens by tokens, 1.42x by characters (1.37x more positions)
    assert sum(tokens) <= by_tokens <= 1.05 * sum(tokens) and by_characters > 1.25 * by_tokens


def test_sentence_transformer_encoder_returns_input_order_across_its_own_batches(minilm):
    import torch

    sentences = ["hi", "a man is playing a large guitar on a stage tonight .", "extraordinarily", "a b c d e", "ok"]
    ours = as_encoder(minilm, batch_size=2, show_progress_bar=False)(sentences)
    torch.testing.assert_close(ours, minilm.encode(sentences, convert_to_tensor=True).cpu(), atol=1e-5, rtol=1e-5)
    assert ours.dtype == torch.float32 and as_encoder(minilm, show_progress_bar=False)([]).shape[0] == 0


def test_stsb_spearman_with_a_callable(data_dir):
    # Embedding = (gold-free) letter counts: a deterministic callable, scored on raw STS-B dev. Nine features keep
    # exact cosine ties rare (with 3 length features, float32 rounding broke ties differently: 0.012 apart).
    def lengths(sentences):
        return np.array([[s.lower().count(c) for c in "etaoinsrh"] + [1.0] for s in sentences], dtype=np.float32)

    value = stsb_spearman(lengths, split="dev", data_dir=data_dir)
    # an independent computation: the raw file split on tabs, cosines in numpy, Spearman from scipy
    from scipy.stats import spearmanr

    rows = [line.split("\t") for line in (data_dir / "stsbenchmark" / "sts-dev.csv").read_text("utf-8").splitlines()]
    rows = [row for row in rows if len(row) >= 7]
    assert len(rows) == 1500
    first, second = lengths([row[5] for row in rows]), lengths([row[6] for row in rows])
    cosines = (first * second).sum(1) / np.linalg.norm(first, axis=1) / np.linalg.norm(second, axis=1)
    expected = 100 * spearmanr(cosines, [float(row[4]) for row in rows]).statistic
    assert value == pytest.approx(expected, abs=1e-4)  # measured 1e-5 apart (float32 cosines)
    assert abs(value) > 1.0  # the length features carry some signal: a constant encoder would give NaN / 0


def test_cli_end_to_end_on_a_tiny_model(tiny_bert_dir, data_dir, tmp_path, capsys):
    from simcse_weince.cli import main

    output = tmp_path / "out" / "sts.json"
    code = main(
        [
            "evaluate",
            str(tiny_bert_dir),
            "--pooler",
            "cls_before_pooler",
            "--tasks",
            "sts13,stsb-raw",
            "--data-dir",
            str(data_dir),
            "--output",
            str(output),
            "--no-progress",
            "--device",
            "cpu",
        ]
    )
    assert code == 0
    printed = capsys.readouterr().out
    results = json.loads(output.read_text())
    assert {"sts13", "avg", "stsb_raw", "details"} <= set(results)
    assert results["avg"] == results["sts13"]
    assert results["details"]["config"]["pooler"] == "cls_before_pooler"
    assert set(results["details"]["tasks"]["sts13"]["subsets"]) == {"FNWN", "headlines", "OnWN"}
    assert "| STS13 |  Avg. |" in printed and "STS-B (original, test)" in printed
    assert f"{results['sts13']:.2f}" in printed
    # same numbers through the library (same sentences -> same batches -> identical embeddings)
    direct = evaluate_sts(
        str(tiny_bert_dir),
        tasks=["sts13"],
        pooler="cls_before_pooler",
        data_dir=data_dir,
        device="cpu",
        show_progress_bar=False,
    )
    assert direct["sts13"] == pytest.approx(results["sts13"], abs=1e-9)


def test_cli_user_errors_exit_1_with_one_line(tmp_path, capsys, monkeypatch):
    from simcse_weince.cli import main

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert main(["evaluate", "whatever", "--pooler", "avg", "--tasks", "sts99"]) == 1
    assert "unknown STS task 'sts99'" in capsys.readouterr().err
    assert main(["evaluate", "x", "--output", str(tmp_path)]) == 1
    assert "is a folder" in capsys.readouterr().err


def test_dev_split_defaults_to_stsb_and_sickr(data_dir):
    def toy(sentences):
        return np.array([[1.0, (sum(map(ord, s)) % 13) / 5.0] for s in sentences], dtype=np.float32)

    results = evaluate_sts(toy, split="dev", data_dir=data_dir)
    assert [key for key in results if key != "details"] == ["stsb", "sickr", "avg"]
    assert results["details"]["tasks"]["sickr"]["n"] == 500 and results["details"]["split"] == "dev"


def test_missing_senteval_files_are_downloaded_when_online(tmp_path, monkeypatch):
    """The download path, with the Hub replaced by a local senteval.tar of SimCSE's layout."""
    import tarfile

    import huggingface_hub

    source = tmp_path / "source"
    _write_sts13(source / "SentEval" / "data", GOOD_STS13)  # -> SentEval/data/senteval/downstream/STS/...
    tar_path = tmp_path / "senteval.tar"
    with tarfile.open(tar_path, "w") as archive:
        archive.add(source / "SentEval" / "data" / "senteval" / "downstream", arcname="downstream")
    requested = []

    def fake_download(repo_id, filename, repo_type=None, **kwargs):
        requested.append((repo_id, filename, repo_type))
        return str(tar_path)

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", fake_download)
    for name in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.delenv(name, raising=False)
    target = tmp_path / "data"
    data = load_sts_task("sts13", data_dir=target)
    assert requested == [("princeton-nlp/datasets-for-simcse", "senteval.tar", "dataset")]
    assert len(data) == 6 and (target / "senteval" / "downstream" / "STS" / "STS13-en-test").is_dir()


def test_missing_raw_stsb_is_read_from_the_hub_dataset_when_online(tmp_path, monkeypatch):
    import datasets

    def fake_load_dataset(name, split):
        assert (name, split) == ("sentence-transformers/stsb", "validation")
        return datasets.Dataset.from_dict({"sentence1": ["a", "b"], "sentence2": ["c", "d"], "score": [0.76, 1.0]})

    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    for name in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.delenv(name, raising=False)
    data = load_stsb("dev", data_dir=tmp_path)
    assert data.scores == [3.8, 5.0] and data.sentences1 == ["a", "b"]
