"""How a training run fails: its exceptions and the exit codes clusters act on.

A SIGTERM checkpoints and exits 143 (retried); a lost peer exits 129 (retried by
Kubeflow's ExitCode policy); a failing kernel exits 3 and too many skipped
non-finite steps exit 2 (both permanent: a rerun would fail the same way).
``lost_peer`` tells a collective that failed because another worker is gone
from a kernel that failed here.
"""
import tensorflow as tf

PREEMPTED_EXIT_CODE = 143  # 128 + SIGTERM: Kubeflow and Slurm retry it


class Preempted(SystemExit):
    """Raised after the coordinated checkpoint that follows a SIGTERM."""

    def __init__(self, step):
        super().__init__(PREEMPTED_EXIT_CODE)
        self.step = step


WORKER_LOST_EXIT_CODE = 129  # 128+: Kubeflow's ExitCode restart policy retries it; 1-127 are permanent
KERNEL_FAILED_EXIT_CODE = 3  # below 128: a computation that failed here fails again on a rerun


class NonFiniteError(RuntimeError):
    """--max_nonfinite_steps consecutive steps were skipped for a non-finite loss or gradient."""


class WorkerLost(RuntimeError):
    """A collective failed or timed out because another worker died, hung or became unreachable."""


class KernelFailed(RuntimeError):
    """A kernel (cuDNN, XLA, a custom op) failed on this worker: not a lost peer, so not worth a retry."""


# Errors a collective raises when a peer is gone (connection reset, --collective_timeout_s exceeded, aborted).
PEER_ERRORS = (tf.errors.UnavailableError, tf.errors.DeadlineExceededError, tf.errors.CancelledError,
                tf.errors.AbortedError)
# Errors a kernel raises when it fails; they mean a lost peer only when their message says a collective or
# its connection failed (TensorFlow aborts every pending collective with the first failure's message).
KERNEL_ERRORS = (tf.errors.InternalError, tf.errors.UnknownError)
COLLECTIVE_SIGNS = ("collective", "heartbeat", "connection reset", "socket closed", "failed to connect",
                     "unreachable", "peer", "coordination service")


def lost_peer(error: Exception) -> bool:
    """Whether ``error`` says that a collective failed because another worker is gone."""
    if isinstance(error, PEER_ERRORS):
        return True
    return isinstance(error, KERNEL_ERRORS) and any(sign in str(error).lower() for sign in COLLECTIVE_SIGNS)


def cause(error: Exception) -> str:
    """The line of a TensorFlow error message that says what happened to the peer."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    for line in lines:
        if any(word in line for word in ("aborted by", "Connection", "Deadline", "timed out", "unreachable",
                                          "timeout")):
            return line[:300]
    return lines[0][:300] if lines else ""


def worker_lost(error: Exception, worker_index: int, steps_done: int, last_checkpoint: str) -> WorkerLost:
    """Any collective (train loop, metric read, preemption vote, checkpoint, eval) fails the same way when a peer
    is gone: one message naming this worker, the last step it finished and the checkpoint to resume."""
    return WorkerLost(
        f"worker {worker_index}: a collective failed after step {steps_done} ({type(error).__name__}: "
        f"{cause(error)}); another worker died, hung or became unreachable. Last checkpoint: "
        f"{last_checkpoint or 'none'}; rerun the same launch to resume from it.")


def kernel_failed(error: Exception, worker_index: int, steps_done: int, last_checkpoint: str) -> KernelFailed:
    """A kernel error fails as itself: named, with its step, and an exit code clusters do not retry."""
    return KernelFailed(
        f"worker {worker_index}: a TensorFlow kernel failed after step {steps_done} ({type(error).__name__}: "
        f"{cause(error)}). This is a computation failing on this worker (cuDNN, XLA, a driver), not a lost "
        "worker, so a rerun would likely fail the same way; try without --jit_compile or with another "
        f"--precision. Last checkpoint: {last_checkpoint or 'none'}.")
