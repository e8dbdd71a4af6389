"""tfgpu.runtime.restarts: the cause of a failed group, whether to restart, on which slots, and what is said."""
import hypothesis
import hypothesis.strategies as st
import pytest

from tfgpu.runtime import restarts
from tfgpu.runtime.restarts import Failure
from tfgpu.runtime import run_dir


@pytest.mark.parametrize("exits, exited_at, stopped, running, cause", [
    ({1: 137, 0: 129, 2: 129}, {1: 5.0, 0: 5.5, 2: 5.6}, set(), set(), 1),  # the killed one, not its peers
    ({0: 129, 2: 129, 1: 137}, {0: 5.0, 2: 5.1, 1: 5.2}, set(), set(), 1),  # even when a 129 is seen first
    ({0: 129, 1: 129}, {0: 5.0, 1: 5.1}, {2}, {2}, 2),  # the stopped worker its peers lost
    ({0: 129}, {0: 5.0}, set(), {1, 2}, 1),  # one still running while its peer lost it
    ({0: 129, 1: 129}, {0: 5.1, 1: 5.0}, set(), set(), 1),  # only 129s: the first
    ({0: 0, 1: 0}, {0: 1.0, 1: 1.0}, set(), set(), None),
])
def test_the_cause_is_the_worker_the_others_lost(exits, exited_at, stopped, running, cause):
    assert restarts.choose_cause(exits, exited_at, stopped, running) == cause


def test_which_failures_a_restart_can_help_and_which_slots_are_suspect():
    killed, lost, preempted = Failure(1, 1, 137, ""), Failure(0, 0, 129, ""), Failure(0, 0, 143, "")
    hung, kernel = Failure(2, 2, None, "", hung=True), Failure(0, 0, 3, "")
    assert [f.retryable for f in (killed, lost, preempted, hung, kernel)] == [True, True, True, True, False]
    assert [f.slot_suspect for f in (killed, lost, preempted, hung, kernel)] == [True, False, False, True, False]
    assert (hung.exit_code, killed.exit_code) == (124, 137)
    assert restarts.describe_exit(137) == "was killed by SIGKILL (exit 137)"
    assert restarts.describe_exit(129) == "lost a peer (exit 129)"


@hypothesis.settings(max_examples=300, deadline=None)
@hypothesis.given(num=st.integers(1, 8), cause=st.integers(0, 7), code=st.sampled_from([129, 134, 137, 143]),
                  hung=st.booleans(), min_workers=st.integers(1, 8), batch=st.sampled_from([24, 32, 48, 64, 96]),
                  reuse=st.booleans())
def test_the_next_group_is_the_largest_that_fits_and_never_below_min_workers(num, cause, code, hung, min_workers,
                                                                             batch, reuse):
    hypothesis.assume(cause < num and min_workers <= num)
    active = list(range(num))
    failure = Failure(cause, cause, None if hung else code, "", hung=hung)
    slots, why = restarts.next_slots(active, failure, min_workers, lambda n: batch % n == 0, reuse)
    dropped = failure.slot_suspect and not reuse
    candidates = [s for s in active if not (dropped and s == cause)]
    if slots:
        assert not why and min_workers <= len(slots) and batch % len(slots) == 0
        assert slots == candidates[:len(slots)]  # the slots kept, in order
        assert all(batch % n for n in range(len(slots) + 1, len(candidates) + 1))  # none larger fits
    else:
        assert why and all(batch % n for n in range(min_workers, len(candidates) + 1))


def test_the_line_and_record_say_why_who_sizes_the_step_and_the_steps_lost(tmp_path):
    (tmp_path / run_dir.CHECKPOINTS_DIR).mkdir()
    assert restarts.checkpoint_step(str(tmp_path)) is None
    (tmp_path / run_dir.CHECKPOINTS_DIR / run_dir.CHECKPOINT_STATE_FILE).write_text(
        f'model_checkpoint_path: "{run_dir.CHECKPOINT_PREFIX}225"\n'
        f'all_model_checkpoint_paths: "{run_dir.CHECKPOINT_PREFIX}180"\n'
        f'all_model_checkpoint_paths: "{run_dir.CHECKPOINT_PREFIX}225"\n')
    assert restarts.checkpoint_step(str(tmp_path)) == 225
    assert restarts.checkpoint_step("gs://bucket/run") is None
    failure = Failure(1, 1, 137, restarts.describe_exit(137), last_step=240)
    assert restarts.restart_line(1, 3, failure, 3, 2, 225) == (
        "restart 1 of --max_restarts=3: worker 1 was killed by SIGKILL (exit 137) after step 240; 3 -> 2 workers, "
        "resuming from the checkpoint at step 225 (15 step(s) lost)")
    record = restarts.restart_record(1, failure, 3, 2, 225, 1000.0)
    assert (record["steps_lost"], record["workers_before"], record["workers_after"], record["hung"]) == (15, 3, 2,
                                                                                                      False)
    early = Failure(0, 0, 137, restarts.describe_exit(137))
    assert restarts.restart_line(2, 3, early, 2, 2, None).endswith(
        "before its first loop; 2 -> 2 workers, resuming from the newest checkpoint (none found yet: from the start)")


def test_a_handed_record_is_taken_once_and_completed_with_the_step_resumed_from():
    record = restarts.restart_record(2, restarts.Failure(1, -1, 129, "lost a peer (exit 129)", last_step=47), 3, 2,
                                     None, 100.0)
    environ = {restarts.RECORD_ENV: restarts.handoff(record)}
    taken = restarts.take_handed_record(environ, 40)
    assert taken["restart"] == 2 and taken["steps_lost"] == 7 and taken["workers_after"] == 2
    assert restarts.RECORD_ENV not in environ and restarts.take_handed_record(environ, 40) is None
    assert restarts.take_handed_record({restarts.RECORD_ENV: "{not json"}, 40) is None
