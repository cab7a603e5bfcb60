"""The STS correlation as an 🤗 ``evaluate`` metric module: ``evaluate.load(METRIC_PATH)`` (works offline)."""

from pathlib import Path

# A folder holding a script of the same name is what evaluate.load() recognises as a local metric module.
METRIC_PATH = str(Path(__file__).resolve().parent / "sts_correlation")
