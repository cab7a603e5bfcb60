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
from negatives_study import decision, differences_by_seed  # noqa: E402
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
        "infonce-hardness": {"loss": "infonce", "hardness_strength": float(choice["infonce-hardness"])},
        "weince-hardness": {"loss": "weince", "hardness_strength": float(choice["weince-hardness"])},
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
    for setting, contrasts in analysis["per_setting"].items():
        for key, result in contrasts.items():
            interval = result["ci95"]
            shown = "n/a" if interval is None else f"[{interval[0]:+.2f}, {interval[1]:+.2f}]"
            print(f"{setting}: {key}: {result['mean']:+.2f} {shown}, {result['wins']}/{result['ties']}/"
                  f"{result['losses']}: {result['decision']}")  # fmt: skip
    print(f"pooled: {analysis['pooled']}")


if __name__ == "__main__":
    main()
