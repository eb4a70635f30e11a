"""fxsym.prune.phases: the steps of a long call timed when a caller records, exclusive of the phases
started inside them, and nothing recorded (or kept) otherwise."""

from __future__ import annotations

import threading
import time

from fxsym.prune.phases import format_record, phase, recording


def test_phases_are_timed_exclusive_of_the_phases_inside_them() -> None:
    """An inner phase pauses the outer one: the values add up to the time spent in phases,
    in the order the phases first started; a phase run twice adds up."""
    with recording() as seconds:
        with phase("outer"):
            time.sleep(0.05)
            with phase("inner"):
                time.sleep(0.3)
            time.sleep(0.05)
        with phase("inner"):
            time.sleep(0.1)
    assert list(seconds) == ["outer", "inner"]
    assert 0.1 <= seconds["outer"] < 0.3, seconds  # 0.4 and more if the inner one counted
    assert 0.4 <= seconds["inner"], seconds


def test_nothing_is_recorded_without_a_recording_nor_from_another_thread() -> None:
    """Outside :func:`recording` a phase is a no-op; a phase in a thread the recording did
    not start (the lock-step batches) is not added to it."""
    with phase("alone"):
        pass
    with recording() as seconds:
        worker = threading.Thread(target=lambda: phase("elsewhere").__enter__())
        worker.start()
        worker.join()
        with phase("here"):
            pass
    assert list(seconds) == ["here"]
    with recording() as fresh:
        pass
    assert fresh == {}


def test_a_phase_left_by_an_exception_is_still_timed() -> None:
    with recording() as seconds:
        try:
            with phase("failing"):
                time.sleep(0.02)
                raise ValueError
        except ValueError:
            pass
        with phase("after"):
            pass
    assert seconds["failing"] >= 0.02 and list(seconds) == ["failing", "after"]


def test_the_record_prints_a_line_a_phase_and_the_rest() -> None:
    text = format_record({"building": 3.0, "writing": 1.0}, total=5.0)
    lines = text.splitlines()
    assert lines[0].split() == ["building", "3.00", "s", "60", "%"]
    assert lines[1].split() == ["writing", "1.00", "s", "20", "%"]
    assert lines[2].split()[-4:] == ["1.00", "s", "20", "%"] and "no phase" in lines[2]
