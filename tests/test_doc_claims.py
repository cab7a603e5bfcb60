"""Every result the README and docs/experiments.md state is what the archived cells give (issue 56), every relative
link in README.md and docs/*.md resolves, and Holm's correction is Holm's."""

from __future__ import annotations

import re
import shutil
import sys
import unicodedata

import pytest
from train_helpers import REPO_ROOT

from simcse_weince.compare.statistics import holm, paired_t_p

sys.path.insert(0, str(REPO_ROOT / "scripts" / "study"))  # doc_tables

#: the blocks each document must carry: a table moved back to hand-copying would escape the check
#: at least this many quoted contrasts in each document's prose (a broken quote finder would find none)
MIN_QUOTES = {"README.md": 3, "docs/experiments.md": 30}
EXPECTED_BLOCKS = {
    "README.md": {"decisions"},
    "docs/experiments.md": {"comparison/cpu-cls", "comparison/cpu-demo", "comparison/digits", "study2-contrasts",
                            "study3-scores", "study3-contrasts", "study3-dev-contrasts", "holm/study1", "holm/study2",
                            "holm/study3"},
}  # fmt: skip


def test_the_docs_results_are_what_the_archived_cells_give():
    """Each generated table equals what ``doc_tables.py`` computes from the cells' ``results.json`` now, and each
    sentence that quotes a contrast (mean [interval], W/T/L) quotes a paired difference the archive holds."""
    import doc_tables

    for name, blocks in EXPECTED_BLOCKS.items():
        text = (REPO_ROOT / name).read_text(encoding="utf-8")
        assert blocks <= set(doc_tables.block_names(text)), f"{name} lost a generated table"
        assert len(doc_tables.quoted_contrasts(text)) >= MIN_QUOTES[name], f"{name}: the quote finder finds too little"
    assert doc_tables.check() == []


def _planted(tmp_path, name: str, old: str, new: str):
    for document in EXPECTED_BLOCKS:
        (tmp_path / document).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO_ROOT / document, tmp_path / document)
    text = (tmp_path / name).read_text(encoding="utf-8")
    assert text.count(old) >= 1, old
    (tmp_path / name).write_text(text.replace(old, new, 1), encoding="utf-8")
    return tmp_path


def test_a_changed_number_is_named(tmp_path):
    """One digit changed in a quoted sentence, or inside a generated table, is found and named."""
    import doc_tables

    root = _planted(
        tmp_path, "README.md", "InfoNCE: +0.04 [−0.51, +0.59], 2/0/3", "InfoNCE: +0.05 [−0.51, +0.59], 2/0/3"
    )
    assert doc_tables.check(root) == ["README.md: '+0.05 [−0.51, +0.59], 2/0/3' is no paired difference of the archive"]
    root = _planted(tmp_path, "docs/experiments.md", "| 85.51 ± 0.04 |", "| 85.52 ± 0.04 |")
    assert doc_tables.check(root) == [
        "docs/experiments.md: generated block 'study3-scores' is not what the archive gives"
    ]
    # a W/T/L of the wrong contrast next to a right mean is caught too
    root = _planted(tmp_path, "docs/experiments.md", "−0.13 [−0.53, +0.27], 1/0/4", "−0.13 [−0.53, +0.27], 0/0/5")
    assert len(doc_tables.check(root)) == 1


def test_study3_holm_is_the_issues_reading():
    """Holm over Study 3's 20 contrasts: A's and D's primary wins survive, B's win and C's loss do not (issue 56),
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


def _slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, markup and punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[`*_]|<[^>]+>", "", heading.strip()).lower()
    text = "".join(c for c in text if c in " -" or unicodedata.category(c)[0] in "LN")
    return text.replace(" ", "-")


def _anchors(path) -> set[str]:
    anchors, seen, fenced = set(), {}, False
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and (match := re.match(r"#{1,6} (.+)", line)):
            slug = _slug(match[1])
            anchors.add(slug if slug not in seen else f"{slug}-{seen[slug]}")
            seen[slug] = seen.get(slug, 0) + 1
    return anchors


def test_every_relative_link_resolves():
    """README.md's and docs/*.md's relative links (and images) point at files that exist and at headings they hold."""
    broken = []
    for document in [REPO_ROOT / "README.md", *sorted((REPO_ROOT / "docs").glob("*.md"))]:
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
                elif anchor and resolved.suffix == ".md" and anchor not in _anchors(resolved):
                    broken.append(f"{where} (no such heading)")
    assert not broken, "\n".join(broken)


def test_every_doc_pointer_in_the_code_resolves():
    """A code comment that moved its numbers to the docs points at a file and heading that exist
    (``why: docs/performance.md#comment-numbers``)."""
    pointer = re.compile(r"\b(docs/[\w.-]+\.md)#([\w-]+)")
    broken, found = [], 0
    for source in sorted((REPO_ROOT / "simcse_weince").rglob("*.py")):
        for number, line in enumerate(source.read_text(encoding="utf-8").splitlines(), 1):
            for path, anchor in pointer.findall(line):
                found += 1
                target = REPO_ROOT / path
                if not target.is_file() or anchor not in _anchors(target):
                    broken.append(f"{source.relative_to(REPO_ROOT)}:{number}: {path}#{anchor}")
    assert found >= 5 and not broken, "\n".join(broken)
