"""Download the data simcse-weince uses into the data directory (``--data-dir`` > $SIMCSE_WEINCE_DATA_DIR >
``~/.cache/simcse_weince/data``), so that later runs work offline.

    python data/download.py                   # everything below
    python data/download.py --only sts        # SentEval STS12-16 / STS-B / SICK and the original STS-B
    python data/download.py --only wiki       # SimCSE's 1M Wikipedia sentences and the cpu-demo's head
    python data/download.py --only nli        # supervised SimCSE's SNLI+MNLI triplets (preset paper-sup)

The commands also download what they miss on first use; this script only does it up front.
"""

from __future__ import annotations

import argparse

from simcse_weince.paths import resolve_data_dir


def download_sts(data_dir):
    from simcse_weince.evaluation import download_senteval, load_stsb

    print("SentEval STS12-16, STS-B, SICK ->", download_senteval(data_dir))
    for split in ("train", "dev", "test"):
        print(f"STS Benchmark (original) {split}: {len(load_stsb(split, data_dir=data_dir).scores)} pairs")


def download_wiki(data_dir):
    from simcse_weince.text.config import preset
    from simcse_weince.text.data import resolve_train_file

    for train_file in ("wiki1m_for_simcse.txt", "wiki1m_head.txt"):
        print(train_file, "->", resolve_train_file(preset("paper", train_file=train_file, data_dir=data_dir)))


def download_nli(data_dir):
    from simcse_weince.text.config import preset
    from simcse_weince.text.data import resolve_train_file

    print("nli_for_simcse.csv ->", resolve_train_file(preset("paper-sup", data_dir=data_dir)))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-dir", default=None, help="target folder (default: $SIMCSE_WEINCE_DATA_DIR or cache)")
    parser.add_argument("--only", choices=("sts", "wiki", "nli"), default=None)
    args = parser.parse_args(argv)
    data_dir = resolve_data_dir(args.data_dir)
    data_dir.mkdir(parents=True, exist_ok=True)
    if args.only in (None, "sts"):
        download_sts(data_dir)
    if args.only in (None, "wiki"):
        download_wiki(data_dir)
    if args.only in (None, "nli"):
        download_nli(data_dir)


if __name__ == "__main__":
    main()
