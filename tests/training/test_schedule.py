"""training/schedule.py: the steps a run evaluates at and where its loops end."""
from hypothesis import given, strategies as st

from tfgpu.training import schedule


def _never():
    raise AssertionError("steps_per_epoch read when no epoch end is needed")


def test_a_run_that_does_not_evaluate_has_no_evaluation_step():
    assert schedule.eval_steps(100, {10, 20}, (5,), False, True, _never) == set()


def test_eval_every_steps_and_asked_steps_are_kept_before_the_last_step():
    assert schedule.eval_steps(30, {10, 20, 30}, (5, 30, 0), True, False, _never) == {5, 10, 20}
    assert schedule.eval_steps(30, set(), (7,), True, True, _never) == {7}
    assert schedule.eval_steps(30, set(), (), True, False, _never) == set()


def test_a_target_without_eval_every_evaluates_at_each_epoch_end():
    assert schedule.eval_steps(10, set(), (), True, True, lambda: {3, 5, 8, 10}) == {3, 5, 8}  # 10 is the last


@given(st.integers(1, 200), st.integers(0, 50), st.lists(st.integers(-5, 250), max_size=6))
def test_boundaries_ascend_once_each_and_end_at_the_last_step(total, every, extra):
    marks = schedule.boundaries(total, {s for s in extra if s % 2}, every, "", extra)
    assert marks[-1] == total and marks == sorted(set(marks)) and all(0 < m <= total for m in marks)
    if every:
        assert all(m in marks for m in range(every, total, every))
    assert all(m in marks for m in extra if 0 < m < total)


def test_profile_steps_start_and_stop_a_loop():
    assert schedule.boundaries(10, (), 0, "2,4") == [2, 4, 10]
