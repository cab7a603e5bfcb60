"""The run timer: the whole run's wall time and its parts, carried across --resume (a fake clock, no timing)."""

from __future__ import annotations

import pytest

from simcse_weince.training import timing
from simcse_weince.training.timing import TIME_PARTS, RunTimer, format_time_parts


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch) -> FakeClock:
    fake = FakeClock()
    monkeypatch.setattr(timing.time, "perf_counter", fake)
    return fake


def test_parts_are_timed_and_the_wall_time_is_the_whole_session(clock):
    timer = RunTimer()
    clock.now += 3.0
    timer.add("setup", timer.since_start())
    with timer.part("evaluation"):
        clock.now += 2.0
    with pytest.raises(RuntimeError), timer.part("checkpoint"):  # a failing block still counts
        clock.now += 1.5
        raise RuntimeError
    clock.now += 10.0  # steps: the trainer state's train_seconds, not timed here
    report = timer.report(train_seconds=9.0)
    assert report == {
        "wall_time_seconds": 16.5,
        "setup_seconds": 3.0,
        "train_seconds": 9.0,
        "evaluation_seconds": 2.0,
        "checkpoint_seconds": 1.5,
        "final_evaluation_seconds": 0.0,
        "export_seconds": 0.0,
    }
    assert list(timer.report(9.0, parts=("setup", "train"))) == ["wall_time_seconds", "setup_seconds", "train_seconds"]


def test_a_resumed_run_adds_its_earlier_sessions(clock):
    first = RunTimer()
    clock.now += 4.0
    first.add("setup", first.since_start())
    with first.part("evaluation"):
        clock.now += 1.0
    state = {"train_seconds": 7.0}
    clock.now += 7.0
    first.save_into(state)  # what a checkpoint holds
    assert state["wall_seconds"] == 12.0 and state["time_parts"]["setup"] == 4.0
    assert "train" not in state["time_parts"]  # the trainer state keeps it as train_seconds

    second = RunTimer()
    second.restore(state)
    clock.now += 2.0
    second.add("setup", second.since_start())
    report = second.report(train_seconds=state["train_seconds"])
    assert report["wall_time_seconds"] == 14.0
    assert report["setup_seconds"] == 6.0 and report["evaluation_seconds"] == 1.0


def test_a_checkpoint_of_an_earlier_release_counts_its_wall_time_only(clock):
    timer = RunTimer()
    timer.restore({"wall_seconds": 30.0, "train_seconds": 20.0})  # no time_parts
    clock.now += 1.0
    assert timer.wall() == 31.0
    assert all(seconds == 0.0 for seconds in timer.parts.values())


def test_the_summary_names_every_part_that_took_time():
    results = {"wall_time_seconds": 404.2, "setup_seconds": 20.0, "train_seconds": 291.0, "export_seconds": 0.0}
    assert format_time_parts(results) == "404 s (set-up 20 s, training 291 s)"
    assert format_time_parts({"wall_time_seconds": 3.0}) == "3 s"
    assert set(TIME_PARTS) == {"setup", "train", "evaluation", "checkpoint", "final_evaluation", "export"}
