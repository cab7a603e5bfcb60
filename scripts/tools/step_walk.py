"""Which of the package's files one optimizer step of the text trainer walks through, and the hops between them.

Runs the ``cpu-demo`` preset (the bundled MiniLM, unsupervised wiki sentences) for two steps with the Python
profiler on during the second step's ``train_step`` and prints:

- the package files the step's calls enter, in the order first entered, starting with the loop that calls
  ``train_step``;
- the hops: the distinct (caller file -> callee file) pairs among them, the nearest package frame counting as the
  caller (a call through torch or transformers back into the package is a hop from the package frame below it);
- the back-and-forth pairs: files that call each other both ways.

Used for issue 55's "a text step's walk from the loop to the core crosses fewer files" (before and after).

    python scripts/tools/step_walk.py                      # the unsupervised step
    python scripts/tools/step_walk.py --mini-batch-size 16 # the GradCache step
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import simcse_weince

PACKAGE_ROOT = Path(simcse_weince.__file__).resolve().parent  # the package imported (PYTHONPATH picks the tree)


def _package_file(frame) -> str | None:
    filename = frame.f_code.co_filename
    try:
        return Path(filename).resolve().relative_to(PACKAGE_ROOT).as_posix()
    except ValueError:
        return None


class StepWalk:
    """A ``sys.setprofile`` hook active from the entry of the trainer's ``train_step`` (file text/trainer.py) of
    step ``step`` to its return."""

    def __init__(self, step: int):
        self.step, self.active, self.depth = step, False, 0
        self.files: list[str] = []
        self.hops: dict[tuple[str, str], int] = {}
        self._cache: dict[int, str | None] = {}

    def _file(self, frame) -> str | None:
        key = id(frame.f_code)
        if key not in self._cache:
            self._cache[key] = _package_file(frame)
        return self._cache[key]

    def __call__(self, frame, event, arg):
        if event != "call":
            if event == "return" and self.active and frame is self.entry:
                self.active = False
            return
        callee = self._file(frame)
        if not self.active:
            if (
                callee == "text/trainer.py"
                and frame.f_code.co_name == "train_step"
                and frame.f_locals.get("step") == self.step
            ):
                self.active, self.entry = True, frame
                loop = self._file(frame.f_back)  # the shared loop (training/loop.py) that calls the step
                self.files += [loop, callee] if loop else [callee]
                if loop:
                    self.hops[(loop, callee)] = 1
            return
        if callee is None:
            return
        if callee not in self.files:
            self.files.append(callee)
        caller = frame.f_back
        while caller is not None and self._file(caller) is None:
            caller = caller.f_back
        if caller is not None and self._file(caller) != callee:
            pair = (self._file(caller), callee)
            self.hops[pair] = self.hops.get(pair, 0) + 1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mini-batch-size", type=int, default=None, help="walk the GradCache step instead")
    parser.add_argument("--json", default=None, help="also write the walk here")
    args = parser.parse_args()

    from simcse_weince.paths import resolve_data_dir
    from simcse_weince.text import preset, train

    with tempfile.TemporaryDirectory() as workdir:
        config = preset(
            "cpu-demo", output_dir=str(Path(workdir) / "run"), data_dir=str(resolve_data_dir(None)),
            max_steps=2, eval_steps=0, eval_before_training=False, final_evaluation=False, save_steps=0,
            report_to="csv", mixed_precision="no", seed=42, mini_batch_size=args.mini_batch_size,
        )  # fmt: skip
        walk = StepWalk(step=2)
        sys.setprofile(walk)
        try:
            train(config)
        finally:
            sys.setprofile(None)
    back_and_forth = sorted({tuple(sorted(pair)) for pair in walk.hops if pair[::-1] in walk.hops})
    print(f"{len(walk.files)} package files, {len(walk.hops)} hops (distinct caller -> callee file pairs), "
          f"{len(back_and_forth)} back-and-forth pairs")  # fmt: skip
    for name in walk.files:
        print(f"  {name}")
    print("hops:")
    for (caller, callee), calls in sorted(walk.hops.items()):
        print(f"  {caller} -> {callee}  ({calls} calls)")
    print("back and forth:", ", ".join(f"{a} <-> {b}" for a, b in back_and_forth) or "none")
    if args.json:
        Path(args.json).write_text(
            json.dumps({"files": walk.files, "hops": [[a, b, n] for (a, b), n in sorted(walk.hops.items())],
                        "back_and_forth": back_and_forth}, indent=1), encoding="utf-8",
        )  # fmt: skip


if __name__ == "__main__":
    main()
