"""The README and docs/ speak of the project, as reference docs do: no issue numbers and no working sessions (history
lives in commit messages and in the dated records of docs/studies/, which follow the same rule), and the README is a
front door short enough to read."""

from __future__ import annotations

import re

from train_helpers import REPO_ROOT

#: the words of a lab notebook: an issue's number, a working session, who did the work
NOTEBOOK_WORDS = re.compile(r"issue ?#?[0-9]+|issues [0-9]|session|helper|red-team", re.IGNORECASE)
README_MAX_LINES = 330


def notebook_words(root=REPO_ROOT) -> list[str]:
    """``path:line: word`` for each notebook word in README.md and docs/**/*.md under ``root``."""
    found = []
    for document in [root / "README.md", *sorted((root / "docs").rglob("*.md"))]:
        for number, line in enumerate(document.read_text(encoding="utf-8").splitlines(), 1):
            found += [f"{document.relative_to(root)}:{number}: {match[0]!r}" for match in NOTEBOOK_WORDS.finditer(line)]
    return found


def test_readme_and_docs_name_no_issue_and_no_session():
    """README.md and every page under docs/ (the dated study records too) name no issue and no working session."""
    found = notebook_words()
    assert not found, "notebook words in the docs (say what the project does; history goes in commits):\n" + "\n".join(
        found
    )


def test_a_planted_notebook_word_is_named(tmp_path):
    """The finder names each kind of word, with its file and line, in a nested docs folder too."""
    (tmp_path / "docs" / "studies").mkdir(parents=True)
    (tmp_path / "README.md").write_text("# A\n\nAs issue 12 found, ...\n", encoding="utf-8")
    (tmp_path / "docs" / "a.md").write_text("Issues 3 and 4.\nA helper module.\n", encoding="utf-8")
    (tmp_path / "docs" / "studies" / "b.md").write_text("Ran in a later Session.\nissue #7, red-team\n", "utf-8")
    assert notebook_words(tmp_path) == [
        "README.md:3: 'issue 12'",
        "docs/a.md:1: 'Issues 3'",
        "docs/a.md:2: 'helper'",
        "docs/studies/b.md:1: 'Session'",
        "docs/studies/b.md:2: 'issue #7'",
        "docs/studies/b.md:2: 'red-team'",
    ]
    (tmp_path / "README.md").write_text("# A\n\nThe issue tracker; 2026-12-07; step 62.\n", encoding="utf-8")
    assert [entry for entry in notebook_words(tmp_path) if entry.startswith("README")] == []


def test_the_readme_is_short_enough_to_read():
    lines = len((REPO_ROOT / "README.md").read_text(encoding="utf-8").splitlines())
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines; at most {README_MAX_LINES}: move detail to docs/"
