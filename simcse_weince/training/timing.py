"""A run's wall time and where it went, shared by the text and vision trainers.

``wall_time_seconds`` is the whole run: from the call to ``train`` (set-up included) to the written results and
model card, across every ``--resume`` session. Its parts::

    setup_seconds               config, data, model, optimizer, checkpoint loading (before the first step)
    train_seconds               the training steps themselves (what sentences/s is computed from)
    evaluation_seconds          STS-B dev during training (before the first step too)
    checkpoint_seconds          writing checkpoints
    final_evaluation_seconds    the scores of the exported folder (text only)
    export_seconds              writing the SentenceTransformer folder, results.json and the card (text only)

The parts add up to a little less than the whole: the loop's own bookkeeping (progress bar, trackers) is in
none of them. They live in the trainer state (``time_parts``), so a resumed run carries its earlier sessions'
times; a checkpoint of an earlier release, without them, counts from zero.
"""

from __future__ import annotations

import contextlib
import time

TIME_PARTS = ("setup", "train", "evaluation", "checkpoint", "final_evaluation", "export")


class RunTimer:
    """Wall time since the run started (plus earlier sessions') and named parts of it, in seconds.

    ``train`` is the trainer state's ``train_seconds`` (kept per step by the loop, as before); the other parts
    are timed here.
    """

    def __init__(self) -> None:
        self.started = time.perf_counter()
        self.previous_wall = 0.0
        self.parts = dict.fromkeys(TIME_PARTS, 0.0)

    def restore(self, state: dict) -> None:
        """Continue a resumed run: add the saved wall time and parts of its earlier sessions."""
        self.previous_wall = float(state.get("wall_seconds", 0.0))
        for name, seconds in state.get("time_parts", {}).items():
            if name in self.parts and name != "train":
                self.parts[name] += float(seconds)

    def wall(self) -> float:
        return self.previous_wall + time.perf_counter() - self.started

    def add(self, name: str, seconds: float) -> None:
        self.parts[name] += seconds

    @contextlib.contextmanager
    def part(self, name: str):
        """Time the block as part ``name`` (also when it raises)."""
        start = time.perf_counter()
        try:
            yield
        finally:
            self.parts[name] += time.perf_counter() - start

    def since_start(self) -> float:
        """Seconds of this session so far (the set-up is this, up to the first step)."""
        return time.perf_counter() - self.started

    def save_into(self, state: dict) -> None:
        """Record the wall time and parts so far in the trainer state (before a checkpoint is written)."""
        state["wall_seconds"] = self.wall()
        state["time_parts"] = {name: seconds for name, seconds in self.parts.items() if name != "train"}

    def report(self, train_seconds: float, parts=TIME_PARTS) -> dict[str, float]:
        """``wall_time_seconds``, measured now, and ``<part>_seconds`` of each of ``parts``."""
        seconds = {**self.parts, "train": train_seconds}
        return {"wall_time_seconds": self.wall(), **{f"{name}_seconds": seconds[name] for name in parts}}


def format_time_parts(results: dict) -> str:
    """``404 s (set-up 20 s, training 291 s, ...)``: the whole run and its parts, for the printed summary."""
    labels = {
        "setup_seconds": "set-up",
        "train_seconds": "training",
        "evaluation_seconds": "evaluation during training",
        "checkpoint_seconds": "checkpoints",
        "final_evaluation_seconds": "final evaluation",
        "export_seconds": "export",
    }
    shown = [f"{label} {results[key]:.0f} s" for key, label in labels.items() if results.get(key)]
    return f"{results['wall_time_seconds']:.0f} s" + (f" ({', '.join(shown)})" if shown else "")
