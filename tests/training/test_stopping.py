"""training/stopping.py on one worker, in-process: a stop signal asks the loops to stop and is then saved and
raised as the signal's exception; what a second Ctrl-C would lose; --checkpoint_every's clock."""
import signal
import types

import pytest
import tensorflow as tf

from tfgpu.runtime import failures
from tfgpu.training import loop
from tfgpu.training.stopping import Stopping


class _Checkpointer:
    real_dir = "/runs/a/checkpoints"

    def __init__(self):
        self.saves = []

    def save(self):
        self.saves.append(1)
        return f"{self.real_dir}/ckpt-{len(self.saves)}"


def _stopping(every_s=0.0):
    strategy = tf.distribute.get_strategy()
    placement = types.SimpleNamespace(strategy=strategy, num_workers=1, is_chief=True)
    step = tf.Variable(0, dtype=tf.int64)
    return Stopping(placement, step, loop.StopFlag(strategy, 1), _Checkpointer(), every_s), step


@pytest.mark.parametrize("signum,error", [(signal.SIGINT, failures.Interrupted), (signal.SIGTERM, failures.Preempted)])
def test_a_stop_signal_is_seen_by_every_worker_then_saved_once_and_raised_as_its_exception(signum, error):
    stopping, step = _stopping()
    assert not stopping.any_worker_preempted()
    stopping.on_signal(signum)
    assert stopping.any_worker_preempted() and float(stopping.flag.flag.numpy()) == 1.0
    step.assign(7)
    with pytest.raises(error) as raised:
        stopping.stop_at(7)
    assert type(raised.value) is error and raised.value.step == 7 and len(stopping.checkpointer.saves) == 1
    assert stopping.saved_step == 7


def test_what_a_second_ctrl_c_loses_names_the_last_checkpoint():
    stopping, step = _stopping()
    assert stopping.unsaved() == "no checkpoint was saved in /runs/a/checkpoints; a rerun starts at step 0"
    step.assign(4)
    assert stopping.save().endswith("ckpt-1")
    assert stopping.unsaved() == ("training after step 4 is not saved (the last checkpoint, in /runs/a/checkpoints); "
                                  "a rerun resumes there")


def test_a_timed_checkpoint_is_due_once_the_interval_passed_and_the_clock_restarts():
    assert not _stopping(0.0)[0].checkpoint_due()  # no --checkpoint_every
    stopping, _ = _stopping(3600.0)
    assert not stopping.checkpoint_due()
    stopping.last_timed_save -= 3601
    assert stopping.checkpoint_due()
    assert not stopping.checkpoint_due()  # counted again from that save


def test_a_library_call_never_ends_the_process_while_compiling():
    stopping, _ = _stopping()
    stopping.compiling_from = 0
    assert not stopping.nothing_to_save()  # not a command: the caller's process is not ours to end
