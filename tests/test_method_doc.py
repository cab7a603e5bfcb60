"""The method lives in the repository: docs/method.md defines what the package computes, every option the package
offers is defined there, and the package cites its headings, never a file outside the repository."""

from __future__ import annotations

import dataclasses
import re

from train_helpers import REPO_ROOT, heading_anchors, heading_slug

METHOD = REPO_ROOT / "docs" / "method.md"
#: how a citation of a document outside the repository reads (the spec file of the shared folder, its sections)
OUTSIDE = re.compile(r"\.\./shared|WEINCE\.md|\bspec sections?\b|\bthe spec\b|\bspec:", re.IGNORECASE)
CITATION = re.compile(r"docs/method\.md#([\w-]+)")
#: the modules that compute a part of the method: each says where that part is defined
IMPLEMENTERS = (
    "weince/config.py",
    "weince/tail.py",
    "weince/loss.py",
    "weince/reference.py",
    "weince/directions.py",
    "vision/extra_terms.py",
    "diagnostics/pot.py",
    "diagnostics/link.py",
    "diagnostics/ksweep.py",
)


def _lines(folder: str):
    """(path relative to the repository, line number, line) of every text file under ``folder``."""
    for path in sorted((REPO_ROOT / folder).rglob("*")):
        if not path.is_file() or "__pycache__" in path.parts:
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue  # images, compiled files: they cite nothing
        for number, line in enumerate(text.splitlines(), 1):
            yield path.relative_to(REPO_ROOT).as_posix(), number, line


def test_the_package_cites_nothing_outside_the_repository():
    """No file of the package (code, docstrings, model-card template) nor the method's page points at a document a
    clone does not have: the spec file of the shared folder, its section numbers."""
    lines = [*_lines("simcse_weince"), *(("docs/method.md", n, line) for n, line in enumerate(METHOD.read_text(
        encoding="utf-8").splitlines(), 1))]  # fmt: skip
    outside = [f"{path}:{number}: {line.strip()}" for path, number, line in lines if OUTSIDE.search(line)]
    assert len(lines) > 10_000, "the scan found too few lines to be reading the package"
    assert not outside, "cite docs/method.md#<heading> instead:\n" + "\n".join(outside)


def test_every_method_citation_names_a_heading():
    """Every heading of docs/method.md that the package, its tests and scripts cite exists there (GitHub's anchors),
    and every module that computes a part of the method cites one."""
    anchors = heading_anchors(METHOD)
    citations = [(path, number, anchor) for folder in ("simcse_weince", "tests", "scripts")
                 for path, number, line in _lines(folder) for anchor in CITATION.findall(line)]  # fmt: skip
    broken = [f"{path}:{number}: #{anchor}" for path, number, anchor in citations if anchor not in anchors]
    assert not broken, "no such heading in docs/method.md:\n" + "\n".join(broken)
    citing = {path for path, _, _ in citations}
    silent = [module for module in IMPLEMENTERS if f"simcse_weince/{module}" not in citing]
    assert not silent, f"these modules compute part of the method but cite none of docs/method.md's headings: {silent}"
    assert len(citations) >= 25


def test_the_anchors_are_githubs(tmp_path):
    """The anchor rule the citations are checked with is GitHub's: lower case, punctuation dropped, spaces to
    hyphens, repeats numbered."""
    page = tmp_path / "page.md"
    page.write_text(
        "# Step 1: the tail size k\n## Vision: the top-M extra terms\n```\n# not a heading\n```\n"
        "### `beta`, β and ρ₀\n## Cost\n## Cost\n",
        encoding="utf-8",
    )
    assert heading_anchors(page) == {
        "step-1-the-tail-size-k",
        "vision-the-top-m-extra-terms",
        "beta-β-and-ρ₀",
        "cost",
        "cost-1",
    }
    assert heading_slug("Directions, partitions and hardness") == "directions-partitions-and-hardness"


def test_every_option_of_the_method_is_defined_on_its_page():
    """Each WeinceConfig field and each value of the options that change the loss (gates, directions, partition and
    hardness modes, geometries) is named in docs/method.md, so a new option cannot ship without its definition."""
    from simcse_weince.settings import DIRECTIONS, HARDNESS_MODES, PARTITION_MODES
    from simcse_weince.weince import GATES, GEOMETRIES, WeinceConfig

    text = METHOD.read_text(encoding="utf-8")
    fields = [field.name for field in dataclasses.fields(WeinceConfig)]
    undefined = [name for name in fields if f"`{name}`" not in text]
    values = [*GATES, *DIRECTIONS, *PARTITION_MODES, *HARDNESS_MODES, *GEOMETRIES]
    undefined += [value for value in values if f"`{value}`" not in text and f'`"{value}"`' not in text]
    assert not undefined, f"docs/method.md does not define {undefined}"


def test_the_method_page_cites_the_paper_the_loss_cites():
    """docs/method.md names the arXiv identifier of the paper that ``WeinceLoss.citation`` gives."""
    from simcse_weince.losses.weince_loss import WEINCE_CITATION

    eprint = re.search(r"eprint=\{([^}]+)\}", WEINCE_CITATION)[1]
    assert f"arXiv:{eprint}" in METHOD.read_text(encoding="utf-8")
