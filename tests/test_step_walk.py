"""``scripts/tools/step_walk.py`` (issue 55): the files one text training step walks through, from the shared loop to
the loss core, as the script prints them for the README's model (the bundled MiniLM, two ``cpu-demo`` steps).

What it shows and these tests hold: the walk starts at the loop, reaches the loss path in one hop from the trainer
(``losses/from_embeddings.py``, where the objective sits beside the path it takes) and the core from there, and no
file of the loss path calls back into the file that called it.
"""

from __future__ import annotations

import json
import subprocess
import sys

from train_helpers import REPO_ROOT, subprocess_env

LOSS_PATH = ("losses/", "weince/")


def test_a_text_step_walks_from_the_loop_to_the_core_through_the_loss_path(tmp_path):
    output = tmp_path / "walk.json"
    completed = subprocess.run(
        [sys.executable, str(REPO_ROOT / "scripts" / "tools" / "step_walk.py"), "--json", str(output)],
        env=subprocess_env(), capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert completed.returncode == 0, completed.stderr[-2000:]
    walk = json.loads(output.read_text(encoding="utf-8"))
    files, hops = walk["files"], {(caller, callee) for caller, callee, _ in walk["hops"]}
    assert files[:2] == ["training/loop.py", "text/trainer.py"]
    assert ("text/trainer.py", "losses/from_embeddings.py") in hops  # the objective beside the path it takes
    assert ("losses/from_embeddings.py", "weince/loss.py") in hops
    assert not any(name.startswith("training/objective") for name in files)
    entries = {callee for caller, callee in hops if callee.startswith(LOSS_PATH) and not caller.startswith(LOSS_PATH)}
    # the loss path is entered at from_embeddings.py; the core's speedups also by torch's autograd (its backward)
    assert entries <= {"losses/from_embeddings.py", "weince/speedups.py"}, entries
    back_and_forth = [pair for pair in walk["back_and_forth"] if any(f.startswith(LOSS_PATH) for f in pair)]
    assert not back_and_forth, back_and_forth
    printed = completed.stdout.splitlines()[0]
    assert printed.startswith(f"{len(files)} package files, {len(hops)} hops"), printed
