"""Study 3 (docs/experiments.md, "Study 3"): four variants x seeds 21-25 on four settings, the hardness variants at
the α the pilot chose (``results/study/hardness-pilot/pilot.json``).

Every cell is an ordinary ``compare`` cell in ``<output-dir>/<setting>/<variant>/seed-<s>``, trained seed by seed
across the settings, so a sweep stopped early holds complete pairs on every setting. Then, from the cells found:
``<setting>/comparison.{json,md,png}`` (``compare``'s own files) and ``hardness.json`` (per setting, the protocol's
contrasts and decisions; the pooled rule). The cross-setting figure and the mechanism come with the results.

    OMP_NUM_THREADS=1 python scripts/study/hardness_study.py --seeds 21,22        # process 1 (23,24,25: process 2)
    python scripts/study/hardness_study.py --seeds 21,22,23,24,25 --summarize-only
"""

from __future__ import annotations

import argparse
import csv
import json
import logging
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from negatives_budget_search import cell_config  # noqa: E402
from negatives_study import decision, differences_by_seed, interval_text  # noqa: E402
from sick_supervised_demo import build_sick_files  # noqa: E402

from simcse_weince.compare import compare, paired_difference  # noqa: E402
from simcse_weince.paths import resolve_data_dir  # noqa: E402
from simcse_weince.settings import apply_overrides  # noqa: E402
from simcse_weince.text import TEXT_CELLS  # noqa: E402

SETTINGS = ("cpu-cls", "stsb-sentences", "sick-pairs", "cpu-cls-tau0.1")  # the protocol's order (the budget cut)
STUDY_VARIANTS = ("infonce", "weince", "infonce-hardness", "weince-hardness")
BASELINE, PEER, OURS = "infonce", "infonce-hardness", "weince-hardness"
CONTRASTS = tuple((v, BASELINE) for v in STUDY_VARIANTS[1:]) + ((OURS, PEER), ("weince", PEER))
METRIC = "stsb_test"


def stsb_train_sentences(data_dir: Path, output_dir: Path) -> Path:
    """The distinct sentences of STS Benchmark's train split, one a line (setting B; no label is used)."""
    source = data_dir / "stsbenchmark" / "sts-train.csv"
    with open(source, encoding="utf-8", newline="") as handle:
        rows = list(csv.reader(handle, delimiter="\t", quoting=csv.QUOTE_NONE))
    sentences = dict.fromkeys(cell.strip() for row in rows if len(row) >= 7 for cell in row[5:7])
    path = output_dir / "data" / "stsb_train_sentences.txt"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(sentence for sentence in sentences if sentence) + "\n", encoding="utf-8")
    return path


def setting_configs(data_dir: Path, output_dir: Path) -> dict:
    """Each setting's base config (the protocol's table)."""
    cpu_cls = cell_config(64, 1, 3e-5, "no")
    sick = build_sick_files(data_dir, output_dir / "data")["pairs"]
    return {
        "cpu-cls": cpu_cls,
        "stsb-sentences": apply_overrides(cpu_cls, {"train_file": str(stsb_train_sentences(data_dir, output_dir))}),
        "sick-pairs": apply_overrides(
            cpu_cls,
            {"train_file": str(sick), "learning_rate": 5e-5, "num_epochs": 3, "eval_steps": 10, "save_steps": 10},
        ),  # fmt: skip
        "cpu-cls-tau0.1": apply_overrides(cpu_cls, {"temperature": 0.1}),
    }


def study_variants(choice: dict) -> dict[str, dict]:
    return {
        "infonce": {"loss": "infonce"},
        "weince": {"loss": "weince"},
        "infonce-hardness": {
            "loss": "infonce",
            "hardness_mode": "in_batch_negatives",
            "hardness_strength": float(choice["infonce-hardness"]),
        },
        "weince-hardness": {
            "loss": "weince",
            "hardness_mode": "in_batch_negatives",
            "hardness_strength": float(choice["weince-hardness"]),
        },
    }


def contrast(runs: list[dict], variant: str, baseline: str) -> dict:
    by_seed = differences_by_seed(runs, variant, baseline, METRIC)
    values = {(run["variant"], run["seed"]): run.get(METRIC) for run in runs}
    seeds = sorted(by_seed)
    result = paired_difference([values[variant, s] for s in seeds], [values[baseline, s] for s in seeds])
    return {**result, "seeds": seeds, "decision": decision(result["ci95"])}


def analyse(runs_by_setting: dict[str, list[dict]]) -> dict:
    per_setting = {setting: {f"{v} - {b}": contrast(runs, v, b) for v, b in CONTRASTS}
                   for setting, runs in runs_by_setting.items()}  # fmt: skip
    primary = [per_setting[s][f"{OURS} - {PEER}"]["decision"] for s in per_setting]
    wins, losses = primary.count("beats"), primary.count("worse")
    holds = len(per_setting) == len(SETTINGS) and wins >= 3 and losses == 0
    return {"metric": METRIC, "per_setting": per_setting,
            "pooled": {"wins": wins, "losses": losses, "settings": len(per_setting), "holds": holds}}  # fmt: skip


def format_markdown(analysis: dict) -> str:
    """The per-setting table of every contrast and the decisions, per setting and pooled (docs/experiments.md)."""
    settings = list(analysis["per_setting"])
    lines = ["Paired STS-B test differences (Spearman × 100; mean [95% t-interval], wins/ties/losses over seeds; "
             f"α: `infonce-hardness` {analysis['alpha']['infonce-hardness']}, `weince-hardness` "
             f"{analysis['alpha']['weince-hardness']}):", "",
             "| contrast | " + " | ".join(settings) + " |", "|---|" + "---|" * len(settings)]  # fmt: skip
    for variant, baseline in CONTRASTS:
        key = f"{variant} - {baseline}"
        cells = [interval_text(analysis["per_setting"][s][key]) for s in settings]
        lines.append(f"| `{variant}` − `{baseline}` | " + " | ".join(cells) + " |")
    lines += ["", "Decisions (an interval above 0 beats, below 0 is worse):", ""]
    for variant, baseline in CONTRASTS:
        key = f"{variant} - {baseline}"
        lines.append(
            f"- `{variant}` − `{baseline}`: "
            + "; ".join(f"{s}: {analysis['per_setting'][s][key]['decision']}" for s in settings)
            + "."
        )
    pooled = analysis["pooled"]
    lines += ["", f"Pooled rule (`{OURS}` beats `{PEER}` on at least 3 of the {len(SETTINGS)} settings and is worse on "
              f"none): beats on {pooled['wins']}, worse on {pooled['losses']}, of {pooled['settings']} settings "
              f"with results: **{'holds' if pooled['holds'] else 'does not hold'}**."]  # fmt: skip
    return "\n".join(lines) + "\n"


def plot(analysis: dict, path: Path) -> None:
    """The cross-setting figure: each contrast's paired STS-B test difference per setting, 95% t-intervals."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    settings = list(analysis["per_setting"])
    figure, axis = plt.subplots(figsize=(9, 0.9 + 0.55 * len(CONTRASTS) * len(settings) / 2))
    labels = []
    for index, (variant, baseline) in enumerate(CONTRASTS):
        key = f"{variant} - {baseline}"
        top = index * (len(settings) + 1)  # one row per setting, a blank row between contrasts
        for offset, setting in enumerate(settings):
            result = analysis["per_setting"][setting][key]
            if result["mean"] is not None:
                mean = result["mean"]
                low, high = result["ci95"] or [mean, mean]
                axis.errorbar(mean, top + offset, xerr=[[mean - low], [high - mean]], fmt="o", capsize=3,
                              color=f"C{offset}", label=setting if index == 0 else None)  # fmt: skip
        labels.append((top + (len(settings) - 1) / 2, f"{variant} − {baseline}"))
    axis.axvline(0, color="grey", lw=0.8)
    axis.set_yticks([y for y, _ in labels], [label for _, label in labels], fontsize=8)
    axis.invert_yaxis()
    axis.set_xlabel("paired Δ STS-B test (×100), mean and 95% t-interval over seeds")
    axis.legend(fontsize=8, loc="lower right")
    axis.set_title("Study 3: every contrast on every setting", fontsize=10)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--output-dir", default="runs/study/hardness")
    parser.add_argument("--seeds", default="21,22,23,24,25")
    parser.add_argument("--settings", default=",".join(SETTINGS))
    parser.add_argument("--pilot", default="results/study/hardness-pilot/pilot.json", help="the pilot's choice")
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--summarize-only", action="store_true")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    seeds = [int(seed) for seed in args.seeds.split(",")]
    output_dir = Path(args.output_dir)
    choice = json.loads(Path(args.pilot).read_text(encoding="utf-8"))["choice"]
    variants = study_variants(choice)
    configs = setting_configs(resolve_data_dir(args.data_dir), output_dir)
    settings = [name.strip() for name in args.settings.split(",")]
    if not args.summarize_only:
        for seed in seeds:
            for setting in settings:
                compare(configs[setting], variants, [seed], output_dir / setting, kind=TEXT_CELLS)
    runs_by_setting = {}
    for setting in settings:
        folder = output_dir / setting
        finished = [s for s in seeds if all((folder / v / f"seed-{s}" / "results.json").is_file() for v in variants)]
        if finished:
            runs_by_setting[setting] = compare(configs[setting], variants, finished, folder, kind=TEXT_CELLS)["runs"]
    if not runs_by_setting:
        print("no seed has all four variants finished on any setting yet")
        return
    analysis = {**analyse(runs_by_setting), "alpha": choice}
    (output_dir / "hardness.json").write_text(json.dumps(analysis, indent=2), encoding="utf-8")
    (output_dir / "hardness.md").write_text(format_markdown(analysis), encoding="utf-8")
    plot(analysis, output_dir / "hardness.png")
    for setting, contrasts in analysis["per_setting"].items():
        for key, result in contrasts.items():
            interval = result["ci95"]
            shown = "n/a" if interval is None else f"[{interval[0]:+.2f}, {interval[1]:+.2f}]"
            print(f"{setting}: {key}: {result['mean']:+.2f} {shown}, {result['wins']}/{result['ties']}/"
                  f"{result['losses']}: {result['decision']}")  # fmt: skip
    print(f"pooled: {analysis['pooled']}")


if __name__ == "__main__":
    main()
