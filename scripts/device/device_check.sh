#!/usr/bin/env bash
# GPU checks for a session with a lent device: one command, under 5 minutes, one JSON.
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
exec timeout 290 python scripts/device/device_check.py "$@"
