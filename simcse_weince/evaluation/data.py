"""STS data: the original STS Benchmark and the SentEval layout that SimCSE evaluates on.

Two families of loaders, kept apart on purpose because they feed different numbers:

* :func:`load_stsb` reads the ORIGINAL STS Benchmark (``<data_dir>/stsbenchmark/sts-<split>.csv``: raw,
  untokenised text). This is what sentence-transformers' model cards report and what the trainer uses for
  model selection (``stsb_dev_spearman``).
* :func:`load_sts_task` reads SentEval's copies (``<data_dir>/senteval/downstream/...``: Moses-tokenised,
  lower-cased for STS12-16) exactly as SentEval (SimCSE's fork) reads them, so that the 7-task table matches
  SimCSE's ``evaluation.py --mode test`` digit for digit.

Every parsing choice that could move a digit is commented where it is made. Missing files are downloaded when
the Hub is reachable (SimCSE's ``senteval.tar``; the ``sentence-transformers/stsb`` dataset), otherwise a
:class:`FileNotFoundError` names the missing path and the ``SIMCSE_WEINCE_DATA_DIR`` variable.

Example::

    from simcse_weince.evaluation import load_stsb, load_sts_task

    dev = load_stsb("dev")                       # 1,500 raw pairs, scores 0-5
    sts12 = load_sts_task("sts12")               # 3,108 pairs in 5 subsets
    print(len(sts12), sts12.subset_names)
"""

from __future__ import annotations

import csv
import math
import shutil
import tarfile
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from simcse_weince.paths import DATA_DIR_ENV, hub_is_offline, resolve_data_dir

# SentEval's task folders and subset lists (senteval/sts.py, STS12Eval ... STS16Eval), in SentEval's order.
# STS13's SMT subset is absent on purpose: its input text is licensed separately and SentEval never reads it.
SENTEVAL_STS_SUBSETS: dict[str, tuple[str, list[str]]] = {
    "sts12": ("STS/STS12-en-test", ["MSRpar", "MSRvid", "SMTeuroparl", "surprise.OnWN", "surprise.SMTnews"]),
    "sts13": ("STS/STS13-en-test", ["FNWN", "headlines", "OnWN"]),
    "sts14": ("STS/STS14-en-test", ["deft-forum", "deft-news", "headlines", "images", "OnWN", "tweet-news"]),
    "sts15": ("STS/STS15-en-test", ["answers-forums", "answers-students", "belief", "headlines", "images"]),
    "sts16": ("STS/STS16-en-test", ["answer-answer", "headlines", "plagiarism", "postediting", "question-question"]),
}
# STSBenchmarkEval / SICKRelatednessEval file names per split (SICK's dev split is its "trial" file).
SENTEVAL_SPLIT_FILES: dict[str, dict[str, str]] = {
    "stsb": {
        "train": "STS/STSBenchmark/sts-train.csv",
        "dev": "STS/STSBenchmark/sts-dev.csv",
        "test": "STS/STSBenchmark/sts-test.csv",
    },
    "sickr": {"train": "SICK/SICK_train.txt", "dev": "SICK/SICK_trial.txt", "test": "SICK/SICK_test_annotated.txt"},
}
STS_TASKS = ("sts12", "sts13", "sts14", "sts15", "sts16", "stsb", "sickr")
SPLITS = ("train", "dev", "test")
# Every gold score of STS12-16, STS-B and SICK-R (1-5) lies on this scale.
GOLD_SCORE_RANGE = (0.0, 5.0)
# Names people use for the same tasks (SentEval's class-style names, the paper's column titles).
TASK_ALIASES = {
    "stsbenchmark": "stsb",
    "sts-b": "stsb",
    "sts_b": "stsb",
    "sick": "sickr",
    "sick-r": "sickr",
    "sick_r": "sickr",
    "sickrelatedness": "sickr",
}

# Where the data come from when the files are missing and the Hub is reachable.
SENTEVAL_HUB_REPO = "princeton-nlp/datasets-for-simcse"  # SimCSE's data/download_senteval.sh fetches this tar
SENTEVAL_HUB_FILE = "senteval.tar"
STSB_HUB_DATASET = "sentence-transformers/stsb"  # stores score / 5; splits train / validation / test


@dataclass
class STSData:
    """Sentence pairs with gold similarity scores.

    Attributes:
        sentences1, sentences2: the two sides of each pair.
        scores: gold similarity per pair, on the file's own scale (0-5 for STS, 1-5 for SICK).
        subsets: the subset (SentEval dataset) each pair belongs to; a single name for STS-B / SICK-R.
        name: the task name (``"stsb-raw"``, ``"sts12"``, ...), for messages.
    """

    sentences1: list[str]
    sentences2: list[str]
    scores: list[float]
    subsets: list[str] = field(default_factory=list)
    name: str = ""

    def __post_init__(self):
        if not self.subsets:
            self.subsets = [self.name or "all"] * len(self.scores)
        lengths = {len(self.sentences1), len(self.sentences2), len(self.scores), len(self.subsets)}
        if len(lengths) != 1:
            raise ValueError(
                f"STSData {self.name!r}: sentences1, sentences2, scores and subsets must have the same length, "
                f"got {len(self.sentences1)}, {len(self.sentences2)}, {len(self.scores)}, {len(self.subsets)}"
            )

    def __len__(self) -> int:
        return len(self.scores)

    @property
    def subset_names(self) -> list[str]:
        """Subset names in order of first appearance (SentEval's order)."""
        return list(dict.fromkeys(self.subsets))


# ----------------------------------------------------------------------------------------------------------------
# Locating and downloading


def _missing_message(path: Path, what: str, hint: str) -> str:
    return (
        f"{what} not found: {path} is missing. Point --data-dir or the {DATA_DIR_ENV} environment variable at a "
        f"folder that holds it ({hint}); with the Hugging Face Hub reachable (HF_HUB_OFFLINE unset) it is "
        f"downloaded automatically."
    )


def download_senteval(data_dir: str | Path | None = None) -> Path:
    """Download SimCSE's ``senteval.tar`` and unpack its ``downstream/`` folder into ``<data_dir>/senteval/``.

    Returns the ``<data_dir>/senteval/downstream`` folder.
    """
    from huggingface_hub import hf_hub_download

    root = resolve_data_dir(data_dir)
    target = root / "senteval" / "downstream"
    tar_path = hf_hub_download(SENTEVAL_HUB_REPO, SENTEVAL_HUB_FILE, repo_type="dataset")
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp, tarfile.open(tar_path) as archive:
        try:
            archive.extractall(tmp, filter="data")  # refuse absolute paths / links out of the folder
        except TypeError:  # Python without extraction filters
            archive.extractall(tmp)
        # The tar's top-level layout is not part of any contract: find the folder that holds STS/STS1*-en-test.
        sts = next((p for p in Path(tmp).rglob("STS") if p.is_dir() and any(p.glob("STS1*-en-test"))), None)
        if sts is None:
            raise FileNotFoundError(f"{tar_path} does not contain SentEval's STS/STS12-en-test ... folders")
        downstream = sts.parent
        target.mkdir(parents=True, exist_ok=True)
        for item in downstream.iterdir():
            destination = target / item.name
            if not destination.exists():
                shutil.move(str(item), str(destination))
    return target


def _senteval_path(relative: str, data_dir, what: str) -> Path:
    """``<data_dir>/senteval/downstream/<relative>``, downloading SentEval's data when it is missing."""
    path = resolve_data_dir(data_dir) / "senteval" / "downstream" / relative
    if path.exists():
        return path
    hint = "senteval/downstream/STS/... and senteval/downstream/SICK/..., as in SimCSE's senteval.tar"
    if hub_is_offline():
        raise FileNotFoundError(_missing_message(path, what, hint))
    try:
        download_senteval(data_dir)
    except Exception as error:  # network, auth, disk: report it together with the offline alternative
        raise FileNotFoundError(_missing_message(path, what, hint) + f" The download failed: {error}") from error
    if not path.exists():
        raise FileNotFoundError(_missing_message(path, what, hint) + " (not in the downloaded senteval.tar either)")
    return path


def _read_text(path: Path) -> str:
    # SentEval opens every file with io.open(..., encoding='utf8'): universal newlines ("\r\n" -> "\n") and
    # strict UTF-8. Its batcher's bytes->utf-8 branch is a Python 2 relic; on Python 3 the text is already str.
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as error:
        raise ValueError(f"{path}: not valid UTF-8 ({error})") from error


def _parse_score(text: str, path: Path, line_number: int) -> float:
    # float() like SentEval (it tolerates surrounding whitespace), but reject what SentEval would turn into a
    # silent NaN correlation.
    try:
        score = float(text)
    except ValueError:
        raise ValueError(f"{path}:{line_number}: gold score {text!r} is not a number") from None
    if not math.isfinite(score):
        raise ValueError(f"{path}:{line_number}: gold score {text!r} is not finite")
    low, high = GOLD_SCORE_RANGE
    if not low <= score <= high:  # a shifted column or an edited cell: it would move every correlation silently
        raise ValueError(f"{path}:{line_number}: gold score {text!r} is outside the {low:g}-{high:g} scale")
    return score


def _senteval_tokens(sentence: str) -> str:
    # SentEval stores each sentence as sentence.split() (any run of whitespace, leading/trailing removed) and
    # SimCSE's batcher gives the model ' '.join(tokens). Doing the same here hands every encoder the exact text
    # SimCSE's encoder sees.
    return " ".join(sentence.split())


def _normalise_task(task: str) -> str:
    name = task.strip().lower()
    name = TASK_ALIASES.get(name, name)
    if name not in STS_TASKS:
        raise ValueError(f"unknown STS task {task!r}; choose from {', '.join(STS_TASKS)}")
    return name


def _check_split(split: str) -> str:
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; choose from {', '.join(SPLITS)}")
    return split


# ----------------------------------------------------------------------------------------------------------------
# The original STS Benchmark


def load_stsb(split: str = "test", data_dir: str | Path | None = None) -> STSData:
    """The original STS Benchmark: raw sentence pairs with gold scores 0-5.

    Reads ``<data_dir>/stsbenchmark/sts-<split>.csv`` (tab-separated: genre, file, year, id, score, sentence1,
    sentence2; a few lines carry extra trailing source fields, ignored). When the file is missing and the Hub is
    reachable, reads the ``sentence-transformers/stsb`` dataset instead (its score/5 is scaled back to 0-5).

    Args:
        split: ``"train"`` (5,749 pairs), ``"dev"`` (1,500) or ``"test"`` (1,379).
        data_dir: data folder (default: ``$SIMCSE_WEINCE_DATA_DIR``, then ``~/.cache/simcse_weince/data``).
    """
    _check_split(split)
    path = resolve_data_dir(data_dir) / "stsbenchmark" / f"sts-{split}.csv"
    if not path.exists():
        if hub_is_offline():
            raise FileNotFoundError(_missing_message(path, "STS Benchmark", "stsbenchmark/sts-{train,dev,test}.csv"))
        return _load_stsb_from_hub(split, path)

    sentences1, sentences2, scores = [], [], []
    with path.open(encoding="utf-8", newline="") as file:
        # Quoting disabled: sentences contain unbalanced '"' that a quoting reader would glue across lines.
        reader = csv.reader(file, delimiter="\t", quoting=csv.QUOTE_NONE)
        try:
            for row in reader:
                if not any(cell.strip() for cell in row):
                    continue  # blank line
                if len(row) < 7:
                    raise ValueError(
                        f"{path}:{reader.line_num}: expected at least 7 tab-separated fields "
                        f"(genre, file, year, id, score, sentence1, sentence2), got {len(row)}"
                    )
                scores.append(_parse_score(row[4], path, reader.line_num))
                # Sentences are kept exactly as written (raw text): tokenizers handle the whitespace.
                sentences1.append(row[5])
                sentences2.append(row[6])
        except UnicodeDecodeError as error:
            raise ValueError(f"{path}: not valid UTF-8 ({error})") from error
    if not scores:
        raise ValueError(f"{path}: no sentence pairs")
    return STSData(sentences1, sentences2, scores, name="stsb-raw")


def _load_stsb_from_hub(split: str, missing_path: Path) -> STSData:
    try:
        from datasets import load_dataset

        hub_split = {"dev": "validation"}.get(split, split)
        dataset = load_dataset(STSB_HUB_DATASET, split=hub_split)
    except Exception as error:
        raise FileNotFoundError(
            _missing_message(missing_path, "STS Benchmark", "stsbenchmark/sts-{train,dev,test}.csv")
            + f" Loading {STSB_HUB_DATASET} from the Hub failed: {error}"
        ) from error
    # The Hub copy stores score / 5; round after scaling back so 3.8 stays 3.8 (not 3.8000000000000003).
    scores = [round(float(score) * 5, 6) for score in dataset["score"]]
    return STSData(list(dataset["sentence1"]), list(dataset["sentence2"]), scores, name="stsb-raw")


# ----------------------------------------------------------------------------------------------------------------
# SentEval's STS12-16, STSBenchmark and SICK-R


def load_sts_task(task: str, split: str = "test", data_dir: str | Path | None = None) -> STSData:
    """One SentEval STS task, read exactly as SentEval (SimCSE's fork) reads it.

    Args:
        task: ``"sts12"`` ... ``"sts16"`` (test only), ``"stsb"`` (SentEval's processed STS Benchmark) or
            ``"sickr"`` (SICK relatedness; its dev split is ``SICK_trial.txt``).
        split: ``"test"``, ``"dev"`` or ``"train"``.
        data_dir: data folder holding ``senteval/downstream/``.

    Returns:
        :class:`STSData`; sentences are whitespace-normalised (``' '.join(s.split())``) as SimCSE's batcher
        passes them to the tokenizer.
    """
    task = _normalise_task(task)
    _check_split(split)
    if task in SENTEVAL_STS_SUBSETS:
        if split != "test":
            raise ValueError(f"{task} has only a test split (got split={split!r}); use stsb or sickr for dev/train")
        folder, subsets = SENTEVAL_STS_SUBSETS[task]
        return _load_senteval_sts(task, _senteval_path(folder, data_dir, f"SentEval {task.upper()}"), subsets)
    path = _senteval_path(SENTEVAL_SPLIT_FILES[task][split], data_dir, f"SentEval {task} ({split})")
    if task == "stsb":
        return _load_senteval_stsbenchmark(path)
    return _load_senteval_sick(path)


def _load_senteval_sts(task: str, folder: Path, subsets: list[str]) -> STSData:
    """SentEval's ``STSEval.loadFile`` for STS12-16."""
    sentences1, sentences2, scores, subset_of_pair = [], [], [], []
    for subset in subsets:
        input_path = folder / f"STS.input.{subset}.txt"
        gold_path = folder / f"STS.gs.{subset}.txt"
        for path in (input_path, gold_path):
            if not path.is_file():
                raise FileNotFoundError(
                    _missing_message(path, f"SentEval {task.upper()} subset {subset}", "SentEval's STS files")
                )
        # SentEval: io.open(...).read().splitlines() on both files, pairs aligned by line number.
        input_lines = _read_text(input_path).splitlines()
        gold_lines = _read_text(gold_path).splitlines()
        if len(input_lines) != len(gold_lines):
            raise ValueError(
                f"{input_path} has {len(input_lines)} lines but {gold_path} has {len(gold_lines)}: "
                "the input and gold files must align line by line"
            )
        for line_number, (line, gold) in enumerate(zip(input_lines, gold_lines), start=1):
            # SentEval keeps a pair iff its gold line is exactly '' (raw_scores != ''): the STS15/16 files leave
            # unannotated pairs' gold lines empty. Those pairs are dropped whatever their input line holds.
            if gold == "":
                continue
            columns = line.split("\t")
            if len(columns) != 2:
                raise ValueError(
                    f"{input_path}:{line_number}: expected two tab-separated sentences, got {len(columns)} field(s)"
                )
            scores.append(_parse_score(gold, gold_path, line_number))
            sentences1.append(_senteval_tokens(columns[0]))
            sentences2.append(_senteval_tokens(columns[1]))
            subset_of_pair.append(subset)
        # (SentEval then sorts each subset by token lengths to limit padding; order does not change a correlation.)
    if not scores:
        raise ValueError(f"{folder}: no annotated sentence pairs")
    return STSData(sentences1, sentences2, scores, subset_of_pair, name=task)


def _senteval_tab_pairs(path: Path, lines, first_line_number: int, columns: tuple[int, int, int], expected: str):
    """SentEval's line loop for STS-B and SICK: ``line.strip().split('\\t')``; ``columns`` = (sentence 1,
    sentence 2, score). Blank lines are skipped (they would crash SentEval)."""
    first, second, score = columns
    sentences1, sentences2, scores = [], [], []
    for line_number, line in enumerate(lines, start=first_line_number):
        text = line.strip()  # also removes the \r of CRLF line ends (SICK_test_annotated.txt)
        if not text:
            continue
        fields = text.split("\t")
        if len(fields) <= max(columns):
            raise ValueError(f"{path}:{line_number}: expected {expected}, got {len(fields)} field(s)")
        scores.append(_parse_score(fields[score], path, line_number))
        sentences1.append(_senteval_tokens(fields[first]))
        sentences2.append(_senteval_tokens(fields[second]))
    if not scores:
        raise ValueError(f"{path}: no sentence pairs")
    return sentences1, sentences2, scores


def _load_senteval_stsbenchmark(path: Path) -> STSData:
    """SimCSE-SentEval's ``STSBenchmarkEval.loadFile``: ``line.strip().split('\\t')``, score col 4, text 5 and 6."""
    # SentEval iterates the file line by line (only \n / \r\n end a line, unlike str.splitlines()); no header.
    lines = _read_text(path).split("\n")
    expected = "at least 7 tab-separated fields (score in column 4, sentences in columns 5 and 6)"
    return STSData(*_senteval_tab_pairs(path, lines, 1, (5, 6, 4), expected), name="stsb")


def _load_senteval_sick(path: Path) -> STSData:
    """SimCSE-SentEval's ``SICKRelatednessEval.loadFile``: skip the header, sentences in cols 1-2, score in 3."""
    lines = _read_text(path).split("\n")
    # SentEval drops the first line unconditionally (skipFirstLine); make sure it is the header it expects.
    if not lines or not lines[0].strip().startswith("pair_ID"):
        raise ValueError(
            f"{path}:1: expected SICK's header line (pair_ID, sentence_A, sentence_B, relatedness_score, ...), "
            f"got {lines[0][:80]!r}"
            if lines
            else f"{path}: empty file"
        )
    expected = "pair_ID, sentence_A, sentence_B, relatedness_score (tab-separated)"
    return STSData(*_senteval_tab_pairs(path, lines[1:], 2, (1, 2, 3), expected), name="sickr")
