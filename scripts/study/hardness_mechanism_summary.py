"""Study 3's mechanism, read side by side (docs/studies/2026-12-06-study3-results.md): the tables and the figure that
test the protocol's predictions 1-3, from the archived ``hardness_mechanism.py`` outputs and the pilot.

Reads ``<mechanism-dir>/mechanism.json`` (the protocol's measurement) and, where present, its ``peer-alpha-*/``
and ``setting-*/`` folders; writes ``summary.md`` and ``summary.png`` into ``<mechanism-dir>``. The figure puts the
peer's concentration on the hardest negatives against its α (left) beside the pilot's dev score against α (right):
prediction 1 ("more hardness") needs the peer to reach ours on the left *and* to gain dev score doing it.

    python scripts/study/hardness_mechanism_summary.py results/study/hardness/mechanism \
        --pilot results/study/hardness-pilot/pilot.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

VARIANTS = ("infonce", "weince", "infonce-hardness", "weince-hardness")
PEER, OURS = "infonce-hardness", "weince-hardness"


def load(folder: Path) -> dict:
    return json.loads((folder / "mechanism.json").read_text(encoding="utf-8"))


def row(label: str, encoder: str, entry: dict) -> str:
    every, gated = entry["all"], entry["gated"]
    return (
        f"| {label} | {encoder} | {entry['hardness_strength']:g} | {every['positive_share']:.3f} | "
        f"{gated['positive_share']:.3f} | {every['top1']:.3f} | {every['top5']:.3f} | {every['top20']:.3f} | "
        f"{every['effective_negatives']:.1f} | {gated['effective_negatives']:.1f} |"
    )


HEADER = [
    "| variant | encoder | α | positive share | (gated) | top-1 | top-5 | top-20 | effective negatives | (gated) |",
    "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
]


def peer_by_alpha(mechanism_dir: Path) -> dict[float, dict]:
    """The peer's untrained-encoder readings at every α measured (the protocol's α and the peer-alpha-* folders)."""
    points = {}
    for folder in [mechanism_dir, *sorted(mechanism_dir.glob("peer-alpha-*"))]:
        entry = load(folder)["untrained"][PEER]
        points[float(entry["hardness_strength"])] = entry
    return dict(sorted(points.items()))


def summary_markdown(mechanism_dir: Path) -> str:
    protocol = load(mechanism_dir)
    caption = (
        "Setting A's batches (τ = 0.05), the pilot's α; shares of |∂L/∂s| per anchor, averaged over anchors; "
        "top-k: share of the negatives' mass on the k most similar; gated: anchors with λ > ½."
    )
    lines = [caption, "", *HEADER]
    for encoder, variants in protocol.items():
        lines += [row(f"`{name}`", encoder, variants[name]) for name in VARIANTS]
    lines += ["", "The peer at larger α (untrained encoder, same batches; ours at its α for reference):", "", *HEADER]
    lines += [row(f"`{PEER}`", "untrained", entry) for entry in peer_by_alpha(mechanism_dir).values()]
    lines.append(row(f"`{OURS}`", "untrained", protocol["untrained"][OURS]))
    for folder in sorted(mechanism_dir.glob("setting-*")):
        lines += ["", f"`{folder.name}` (untrained encoder):", "", *HEADER]
        lines += [row(f"`{name}`", "untrained", load(folder)["untrained"][name]) for name in VARIANTS]
    return "\n".join(lines) + "\n"


def plot(mechanism_dir: Path, pilot: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    peer = peer_by_alpha(mechanism_dir)
    ours = load(mechanism_dir)["untrained"][OURS]
    alphas = list(peer)
    figure, (left, middle, right) = plt.subplots(1, 3, figsize=(13, 3.6))
    for axis, key, title in ((left, "top1", "share on the hardest negative"),
                             (middle, "effective_negatives", "effective number of negatives")):  # fmt: skip
        axis.plot(alphas, [peer[a]["all"][key] for a in alphas], "o-", color="C2", label=f"{PEER} (peer) at α")
        axis.axhline(ours["all"][key], color="C3", ls="--", label=f"{OURS} (ours), α = {ours['hardness_strength']:g}")
        axis.set_xscale("log", base=2)
        axis.set_xticks(alphas, [f"{a:g}" for a in alphas])
        axis.set_xlabel("hardness strength α")
        axis.set_title(f"{title} (untrained encoder)", fontsize=9)
        axis.legend(fontsize=7)
    for variant, color in ((PEER, "C2"), (OURS, "C3")):
        points = sorted((float(a), p["best_stsb_dev"]) for a, p in pilot["points"][variant].items())
        right.plot([a for a, _ in points], [d for _, d in points], "o-", color=color, label=variant)
    right.set_xscale("log", base=2)
    right.set_xticks([float(a) for a in pilot["alphas"]], [f"{float(a):g}" for a in pilot["alphas"]])
    right.set_xlabel("hardness strength α")
    right.set_ylabel("best STS-B dev (×100)")
    right.set_title(f"the pilot (seed {pilot['seed']}): dev score against α", fontsize=9)
    right.legend(fontsize=7)
    question = "Study 3, prediction 1: does a larger α bring the peer to ours, and does its dev score follow?"
    figure.suptitle(question, fontsize=10)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("mechanism_dir", type=Path)
    parser.add_argument("--pilot", type=Path, default=Path("results/study/hardness-pilot/pilot.json"))
    args = parser.parse_args()
    text = summary_markdown(args.mechanism_dir)
    (args.mechanism_dir / "summary.md").write_text(text, encoding="utf-8")
    plot(args.mechanism_dir, json.loads(args.pilot.read_text(encoding="utf-8")), args.mechanism_dir / "summary.png")
    print(text)


if __name__ == "__main__":
    main()
