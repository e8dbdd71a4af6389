"""How a run fails: which errors mean a lost peer."""

import pytest

from tfgpu.runtime import failures


def test_only_collective_failures_count_as_a_lost_peer():
    import tensorflow as tf

    from tfgpu.runtime import failures

    lost = [tf.errors.UnavailableError(None, None, "Socket closed"),
            tf.errors.DeadlineExceededError(None, None, "Collective ops timed out"),
            tf.errors.CancelledError(None, None, "RPC cancelled"), tf.errors.AbortedError(None, None, "aborted"),
            tf.errors.InternalError(None, None, "Collective ops is aborted by: Connection reset by peer"),
            tf.errors.UnknownError(None, None, "Task /job:worker/task:1 stopped sending heartbeats")]
    kernels = [tf.errors.InternalError(None, None, "cuDNN launch failure : input shape ([8,64,32,32])"),
               tf.errors.UnknownError(None, None, "CUDNN_STATUS_EXECUTION_FAILED"),
               tf.errors.InternalError(None, None, "XLA compilation failed: ptxas exited with non-zero code")]
    assert all(failures.lost_peer(e) for e in lost) and not any(failures.lost_peer(e) for e in kernels)


def test_every_failure_has_its_exit_code_in_one_table_and_the_values_clusters_rely_on():
    """One table from failure to exit code (the launcher, every command's main and the Slurm/Kubernetes templates
    read the same values); a subclass (tfgpu.fit's FitError) takes its parent's row; anything else is no failure."""
    import pytest

    from tfgpu.config import ConfigError
    from tfgpu.runtime import failures
    from tfgpu.training.fit import FitError

    cases = [(ConfigError("model_dir", "x"), 1), (FitError("train_data", "x"), 1), (failures.NonFiniteError("x"), 2),
             (failures.KernelFailed("x"), 3), (failures.WorkerLost("x"), 129), (failures.Preempted(4, "ckpt-4"), 143)]
    assert [failures.exit_code(error) for error, _ in cases] == [code for _, code in cases]
    assert not isinstance(failures.Preempted(4, "ckpt-4"), SystemExit)  # tfgpu.fit's caller decides whether to exit
    with pytest.raises(ValueError, match="KeyError is not a failure of the exit-code table"):
        failures.exit_code(KeyError("x"))


def test_a_ctrl_c_stop_is_a_preemption_and_a_keyboard_interrupt_exiting_130():
    """tfgpu.fit's callers catch a Ctrl-C's stop as Preempted (with SIGTERM's) or as the KeyboardInterrupt Python
    raises for Ctrl-C; a command exits 130, says so in one line, and a SIGTERM's stop stays 143."""
    import signal

    from tfgpu.runtime import failures

    stop = failures.stopped_by(signal.SIGINT)(12, "run/checkpoints/ckpt-12")
    assert isinstance(stop, failures.Preempted) and isinstance(stop, KeyboardInterrupt) and stop.step == 12
    assert failures.exit_code(stop) == failures.INTERRUPTED == 130
    assert str(stop) == ("interrupted by SIGINT (Ctrl-C): checkpoint saved at step 12 (run/checkpoints/ckpt-12); run "
                         "the same command again (or call tfgpu.fit again with the same model_dir) to resume from it")
    sigterm = failures.stopped_by(signal.SIGTERM)(12, "ckpt-12")
    assert type(sigterm) is failures.Preempted and failures.exit_code(sigterm) == 143
    assert not isinstance(sigterm, KeyboardInterrupt)


def test_the_launcher_and_the_table_load_no_tensorflow():
    """The launcher reads the table without importing TensorFlow (it must not initialise a runtime its workers
    need); subprocess: what a fresh interpreter imports is what is tested."""
    import subprocess
    import sys

    from tests.conftest import REPO

    probe = "import sys, tfgpu.launch, tfgpu.runtime.failures; print('tensorflow' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True,
                          check=True).stdout.strip() == "False"


def test_a_kernel_error_inside_named_fails_as_itself_and_a_lost_peer_as_worker_lost():
    import tensorflow as tf

    done = []
    with pytest.raises(failures.KernelFailed, match=r"^worker 1: a TensorFlow kernel failed after step 7 .*"
                                                    r"Last checkpoint: /ckpt/ckpt-6\.$"):
        with failures.named(1, 2, lambda: 7, lambda: "/ckpt/ckpt-6"):
            raise tf.errors.InternalError(None, None, "cuDNN launch failure")
    with pytest.raises(failures.WorkerLost, match=r"^worker 0: a collective failed after step 3 .*Last checkpoint: "
                                                  r"none; rerun"):
        with failures.named(0, 2, lambda: 3, lambda: None):
            raise tf.errors.UnavailableError(None, None, "task 1 stopped heartbeats")
    with pytest.raises(tf.errors.UnavailableError):  # one worker has no peer to lose
        with failures.named(0, 1, lambda: 3, lambda: None):
            raise tf.errors.UnavailableError(None, None, "socket closed")
    with failures.named(0, 1, lambda: done.append(1), lambda: done.append(2)):
        pass
    assert done == []  # the step and checkpoint are read only when an error comes


def test_too_many_skipped_steps_in_a_row_name_the_limit_the_counters_and_the_good_checkpoint():
    error = failures.skipped_too_long(5, 5, 40, ("nonfinite_steps",), "/runs/a/checkpoints", "Try --precision=fp32.")
    assert isinstance(error, failures.NonFiniteError)
    assert str(error).startswith("5 consecutive steps (no finite step between them, counted across loops) had a "
                                 "non-finite loss or gradient and were skipped, by step 40 (--max_nonfinite_steps=5;")
    assert "history.jsonl as nonfinite_steps" in str(error)
    assert str(error).endswith("the last checkpoint in /runs/a/checkpoints is good. Try --precision=fp32.")
