"""Every result the README and the study records (docs/studies/) state is what the archived cells give, each quote
is checked as the contrast its sentence names, every number of the README has a stored source, every relative link
in README.md and docs/**/*.md resolves, and Holm's correction is Holm's."""

from __future__ import annotations

import re
import shutil
import sys

import pytest
from train_helpers import REPO_ROOT, heading_anchors

from simcse_weince.compare.statistics import holm, paired_t_p

sys.path.insert(0, str(REPO_ROOT / "scripts" / "study"))  # doc_tables

#: at least this many quoted contrasts and references in each document's prose (a broken finder would find none)
STUDY1, STUDY2 = "docs/studies/2026-12-01-study1-results.md", "docs/studies/2026-12-02-study2-results.md"
STUDY3 = "docs/studies/2026-12-06-study3-results.md"
CORRECTIONS = "docs/studies/2026-12-07-corrections-and-multiplicity.md"
MIN_QUOTES = {"README.md": 10, "docs/experiments.md": 0, STUDY1: 4, STUDY2: 10, STUDY3: 10, CORRECTIONS: 10}
#: the kinds of reference each document uses at least once
REFERENCE_KINDS = {"README.md": {"contrast", "seeds", "count", "settings", "value"}, "docs/experiments.md": set(),
                   STUDY1: {"contrast"}, STUDY2: {"contrast", "wtl", "seeds"}, STUDY3: {"contrast", "wtl", "seeds"},
                   CORRECTIONS: {"contrast", "wtl", "seeds", "settings", "value"}}  # fmt: skip
#: the blocks each document must carry: a table moved back to hand-copying would escape the check
EXPECTED_BLOCKS = {
    "README.md": {"decisions", "published-and-ours", "minilm-sts"},
    "docs/experiments.md": {"study3-pilot"},
    STUDY1: {"comparison/cpu-cls", "comparison/cpu-demo", "comparison/digits", "study1-pairs", "lambda/study1",
             "digits-pairs"},
    STUDY2: {"study2-scores", "study2-contrasts", "lambda/study2"},
    STUDY3: {"study3-scores", "study3-contrasts"},
    CORRECTIONS: {"study3-dev-contrasts", "holm/study1", "holm/study2", "holm/study3"},
}  # fmt: skip


def test_the_docs_results_are_what_the_archived_cells_give():
    """Each generated table equals what ``doc_tables.py`` computes from the cells' ``results.json`` now, and each
    quote in the prose (a contrast, a W/T/L, a seed count, a count of decisions or settings, a stored value) is what
    the reference beside it gives."""
    import doc_tables

    assert set(EXPECTED_BLOCKS) == set(doc_tables.DOCUMENTS)  # a new record is checked, and named here
    for name, blocks in EXPECTED_BLOCKS.items():
        text = (REPO_ROOT / name).read_text(encoding="utf-8")
        assert blocks <= set(doc_tables.block_names(text)), f"{name} lost a generated table"
        assert len(doc_tables.quoted_contrasts(text)) >= MIN_QUOTES[name], f"{name}: the quote finder finds too little"
        kinds = {reference["kind"] for reference in doc_tables.references(text)}
        assert REFERENCE_KINDS[name] <= kinds, f"{name}: the reference finder finds too little"
    assert doc_tables.check() == []


def _planted(tmp_path, name: str, old: str, new: str):
    import doc_tables

    for document in doc_tables.DOCUMENTS:
        (tmp_path / document).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO_ROOT / document, tmp_path / document)
    text = (tmp_path / name).read_text(encoding="utf-8")
    assert text.count(old) == 1, old
    (tmp_path / name).write_text(text.replace(old, new, 1), encoding="utf-8")
    return tmp_path


#: (document, what is written, what is planted, what the check must name): each a real number put where another
#: belongs, or a reference taken away
PLANTED = {
    "another real contrast swapped in for the named one (A's over InfoNCE for A's over the peer)": (
        "README.md",
        "A +0.79 [+0.64, +0.93]<!-- contrast: study3/A/test weince-hardness - infonce-hardness -->",
        "A +1.31 [+1.08, +1.53]<!-- contrast: study3/A/test weince-hardness - infonce-hardness -->",
        "+1.31",
    ),
    "B's quote replaced by C's": (
        "README.md",
        "B +0.34 [+0.17, +0.51]<!-- contrast: study3/B/test weince-hardness - infonce-hardness -->",
        "B −0.27 [−0.50, −0.04]<!-- contrast: study3/B/test weince-hardness - infonce-hardness -->",
        "−0.27",
    ),
    "a dev quote replaced by test's": (
        "README.md",
        "(+0.28 [+0.11, +0.45]<!-- contrast: study3/B/dev weince - infonce -->",
        "(+0.18 [−0.06, +0.41]<!-- contrast: study3/B/dev weince - infonce -->",
        "+0.18",
    ),
    "a reference pointed at another real contrast": (
        "README.md",
        "(+0.28 [+0.11, +0.45]<!-- contrast: study3/B/dev weince - infonce -->",
        "(+0.28 [+0.11, +0.45]<!-- contrast: study3/B/test weince - infonce -->",
        "+0.28",
    ),
    "a seed count changed": ("README.md", "bundled MiniLM, 5 seeds<!--", "bundled MiniLM, 6 seeds<!--", "6 seeds"),
    "a range of seeds changed": ("README.md", "(seeds 1–10<!--", "(seeds 1–9<!--", "seeds 1–9"),
    "a W/T/L in prose changed": (
        STUDY3,
        "(15/0/0<!-- wtl: study3/A,B,D",
        "(14/0/1<!-- wtl: study3/A,B,D",
        "14/0/1",
    ),
    "a W/T/L with its mean changed": (
        STUDY3,
        "(−0.27, 0/0/5<!-- contrast: study3/C/test weince-hardness - infonce-hardness -->)\n",
        "(−0.27, 1/0/4<!-- contrast: study3/C/test weince-hardness - infonce-hardness -->)\n",
        "1/0/4",
    ),
    "a count of decisions changed": (
        "README.md",
        "beat InfoNCE in 2 of the 10<!--",
        "beat InfoNCE in 3 of the 10<!--",
        "3 of the 10",
    ),
    "a count of settings changed": (
        "README.md",
        "cover 8 distinct settings<!--",
        "cover 10 distinct settings<!--",
        "10 distinct settings",
    ),
    "a published number changed": (
        "README.md",
        "WEINCE at 76.36<!-- value: paper-weince -->",
        "WEINCE at 76.63<!-- value: paper-weince -->",
        "76.63",
    ),
    "a quote's reference removed": (
        "README.md",
        "9/0/1<!-- contrast: study2/pooled-64/test weince - infonce -->",
        "9/0/1",
        "9/0/1",
    ),
    "a number inside a generated table changed": (
        STUDY3,
        "| 85.51 ± 0.04 |",
        "| 85.52 ± 0.04 |",
        "study3-scores",
    ),
}


@pytest.mark.parametrize("planted", sorted(PLANTED))
def test_a_planted_claim_is_named(tmp_path, planted):
    """Each way a sentence can say what its contrast does not is found, and the message names what was written."""
    import doc_tables

    name, old, new, named = PLANTED[planted]
    problems = doc_tables.check(_planted(tmp_path, name, old, new))
    assert len(problems) == 1 and problems[0].startswith(name) and named in problems[0], problems


def test_a_reference_that_names_nothing_is_refused():
    """A reference to a place, study or form the archive does not have is an error that names it and the form."""
    import doc_tables

    with pytest.raises(ValueError, match="study3 has no 'E'"):
        doc_tables.reference_contrasts("study3/E/test weince - infonce")
    with pytest.raises(ValueError, match="write it as 'study3/A/test weince - infonce'"):
        doc_tables.reference_contrasts("study3/A weince vs infonce")
    with pytest.raises(ValueError, match="the signs must cancel"):
        doc_tables.reference_contrasts("study3/A/test weince + infonce")
    with pytest.raises(ValueError, match="no paired"):
        doc_tables.reference_contrasts("study3/A/test weince - untrained")
    interaction = doc_tables.reference_contrasts("study2/batch-64/test weince-hardness - weince - infonce-hardness + "
                                                 "infonce")  # fmt: skip
    parts = [doc_tables.folder_contrast("negatives/batch-64", v, "infonce")["mean"]
             for v in ("weince-hardness", "weince", "infonce-hardness")]  # fmt: skip
    assert interaction[0]["mean"] == pytest.approx(parts[0] - parts[1] - parts[2], abs=1e-12)


# ---- every number of the README has a source

#: numbers of the README that are not measurements: names, definitions, settings of the presets and protocols, and
#: versions. Each pattern must occur in the README (a stale entry fails); every other number must carry a reference.
NOT_MEASURED = {
    r"Study [123]": "the studies' names",
    r"STS12–16|STS 2012–2016|7-task|7 tasks": "the benchmark's task names",
    r"ICML 2026, arXiv:2606\.00262": "the citation",
    r"CC BY-NC-SA 3\.0": "a licence's name",
    r"ResNet-18/50|CIFAR-10/100|STL-10|ImageNet-32|UTF-8": "names of models, data sets and encodings",
    r"λ = 0": "the definition: λ = 0 is InfoNCE",
    r"bounded by 1|get to 1|−log\(1 − s\) needs s ≤ 1": "the endpoint of cosine similarity",
    r"95%": "the confidence level of the protocols",
    r"above\s+0|below\s+0|excludes 0": "the decision rule's threshold",
    r"×\s?100": "the scale of the scores",
    r"α = (?:9|18)": "the variants' α (simcse_weince.text.TEXT_VARIANTS, results/study/hardness/hardness.json)",
    r"batch[ -]64|64 sentences at a time": "the presets' batch size",
    r"τ = 0\.05, length 32, batch 64, lr 3e-5": "SimCSE's recipe, the presets' settings",
    r"batch 256, Adam 3e-4, τ 0\.5, 100 epochs": "the vision paper defaults, the vision presets' settings",
    r"≥ 6\.2": "a dependency's version",
    r"at least 3 wins": "the pre-registered pooled rule",
    r"to 1e-6": "the tolerance tests/test_evaluation_minilm.py asserts",
    r"\(0 for a pair\)": "MNRL's loss on a batch of one pair (tests/test_mnrl_api.py)",
}


def _readme_numbers() -> list[tuple[int, str, str]]:
    """(position, number, context) of every number in the README's prose outside code, comments, link targets and
    generated blocks."""
    import doc_tables

    body = doc_tables.prose((REPO_ROOT / "README.md").read_text(encoding="utf-8"))
    for pattern, flags in ((r"^```.*?^```", re.M | re.S), (r"<!--.*?-->", re.S), (r"`[^`\n]*`", 0),
                           (r"\]\([^)\s]*\)", 0)):  # fmt: skip
        body = re.sub(pattern, lambda match: " " * len(match.group(0)), body, flags=flags)
    return [(match.start(), match.group(0), body[max(0, match.start() - 40) : match.end() + 20].replace("\n", " "))
            for match in re.finditer(r"(?<![\w.])\d+(?:[.,]\d+)*(?:e-?\d+)?", body)]  # fmt: skip


def test_every_readme_number_has_a_source():
    """Each number of the README is inside a quote whose reference the archive or a stored record confirms (the
    check above), or inside a name, definition or setting listed in ``NOT_MEASURED``; nothing else."""
    import doc_tables

    text = (REPO_ROOT / "README.md").read_text(encoding="utf-8")
    body = doc_tables.prose(text)
    checked = [reference["span"] for reference in doc_tables.references(text) if reference["problem"] is None]
    allowed = []
    for pattern in NOT_MEASURED:
        found = [(match.start(), match.end()) for match in re.finditer(pattern.replace(" ", r"\s+"), body)]
        assert found, f"NOT_MEASURED lists {pattern!r}, which the README no longer has"
        allowed += found
    unsourced = [f"{number!r} in ...{context}..." for start, number, context in _readme_numbers()
                 if not any(low <= start < high for low, high in checked + allowed)]  # fmt: skip
    assert not unsourced, "README numbers with no checked source:\n" + "\n".join(unsourced)
    assert len(_readme_numbers()) > 100  # the finder finds the README's numbers


def test_an_unsourced_readme_number_is_found(tmp_path, monkeypatch):
    """A timing with no stored record, added to the README, is what the number test names."""
    text = (REPO_ROOT / "README.md").read_text(encoding="utf-8")
    planted = text.replace("## Train: unsupervised SimCSE", "One epoch takes about 4–8 minutes.\n\n## Train: "
                           "unsupervised SimCSE", 1)  # fmt: skip
    (tmp_path / "README.md").write_text(planted, encoding="utf-8")
    monkeypatch.setitem(globals(), "REPO_ROOT", tmp_path)
    with pytest.raises(AssertionError, match="'4' in .*about 4–8 minutes"):
        test_every_readme_number_has_a_source()


def test_study3_holm_is_the_issues_reading():
    """Holm over Study 3's 20 contrasts: A's and D's primary wins survive, B's win and C's loss do not,
    and a t-test p < 0.05 goes with each interval that excludes 0 (the test belongs to the decision rule)."""
    import doc_tables

    entries = doc_tables.holm_family(3)
    assert len(entries) == 20
    for entry in entries:
        low, high = entry["result"]["ci95"]
        assert (entry["p"] < 0.05) == (low > 0 or high < 0), entry["where"]
    primary = {
        e["where"][0]: e["survives"] for e in entries if e["contrast"] == "`weince-hardness` − `infonce-hardness`"
    }
    assert primary == {"A": True, "B": False, "C": False, "D": True}


def test_holm_is_the_step_down_procedure():
    """Against the textbook procedure: reject the i-th smallest p while p_(i) ≤ α / (m − i + 1), then stop."""
    import numpy as np

    rng = np.random.default_rng(0)
    for _ in range(200):
        count = int(rng.integers(1, 25))
        p_values = {f"c{i}": float(p) for i, p in enumerate(rng.uniform(0, 0.1, count) ** 2)}
        ordered = sorted(p_values, key=p_values.get)
        rejected = set()
        for rank, name in enumerate(ordered):
            if p_values[name] >= 0.05 / (count - rank):
                break
            rejected.add(name)
        result = holm(p_values)
        assert {name for name, entry in result.items() if entry["survives"]} == rejected
        adjusted = [result[name]["adjusted"] for name in ordered]
        assert adjusted == sorted(adjusted) and all(entry["adjusted"] <= 1 for entry in result.values())
    with pytest.raises(ValueError, match="no p-value in \\[0, 1\\] for b"):
        holm({"a": 0.01, "b": None})
    with pytest.raises(ValueError, match="alpha"):
        holm({"a": 0.01}, alpha=1.5)
    assert paired_t_p([0.5]) is None and paired_t_p([0.2, 0.2]) == 0.0 and paired_t_p([0.0, 0.0]) == 1.0


# ---- links

LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")


def test_every_relative_link_resolves():
    """README.md's and docs/**/*.md's relative links (and images) point at existing files and at their headings."""
    broken = []
    for document in [REPO_ROOT / "README.md", *sorted((REPO_ROOT / "docs").rglob("*.md"))]:
        fenced = False
        for number, line in enumerate(document.read_text(encoding="utf-8").splitlines(), 1):
            fenced = fenced != line.startswith("```")
            for target in [] if fenced else LINK.findall(line):
                if re.match(r"[a-z]+:", target):
                    continue  # http(s), mailto: not this test's business
                path, _, anchor = target.partition("#")
                resolved = (document.parent / path).resolve() if path else document
                where = f"{document.relative_to(REPO_ROOT)}:{number}: {target}"
                if not resolved.exists():
                    broken.append(f"{where} (no such file)")
                elif anchor and resolved.suffix == ".md" and anchor not in heading_anchors(resolved):
                    broken.append(f"{where} (no such heading)")
    assert not broken, "\n".join(broken)


def test_every_doc_pointer_in_the_code_resolves():
    """A code comment that moved its numbers to the docs points at a file and heading that exist
    (``why: docs/performance.md#comment-numbers``)."""
    pointer = re.compile(r"\b(docs/[\w.-]+\.md)#([\w-]+)")
    numbered = re.compile(r"\bdocs/[\w.-]+\.md,? (?:sections?|§) ?\d")  # headings move; numbers go stale
    broken, found = [], 0
    for source in sorted((REPO_ROOT / "simcse_weince").rglob("*.py")):
        for number, line in enumerate(source.read_text(encoding="utf-8").splitlines(), 1):
            if numbered.search(line):
                broken.append(f"{source.relative_to(REPO_ROOT)}:{number}: a section number, not a heading")
            for path, anchor in pointer.findall(line):
                found += 1
                target = REPO_ROOT / path
                if not target.is_file() or anchor not in heading_anchors(target):
                    broken.append(f"{source.relative_to(REPO_ROOT)}:{number}: {path}#{anchor}")
    assert found >= 5 and not broken, "\n".join(broken)
