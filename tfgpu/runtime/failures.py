"""How a run fails: its exceptions, and the one table of the exit codes every command and the launcher use.

A SIGTERM checkpoints at the current step and raises ``Preempted`` (``python -m tfgpu.train`` exits 143, retried;
``tfgpu.fit`` lets it reach the caller), a Ctrl-C likewise ``Interrupted`` (exit 130; a ``KeyboardInterrupt`` too); a lost peer exits 129 (retried by Kubeflow's ExitCode policy); a failing kernel
exits 3 and too many skipped non-finite steps exit 2 (both permanent: a rerun would fail the same way); a bad
flag, file or record (``ConfigError``) exits 1. ``lost_peer`` tells a collective that failed because another
worker is gone from a kernel that failed here. Importing this module loads no TensorFlow: the launcher and the
commands read the table before TensorFlow is imported.
"""
import contextlib
import sys

from tfgpu.config import ConfigError

# Codes 128 and up are retried by Kubeflow's ExitCode restart policy and Slurm requeues; 1-127 are permanent.
OK = 0  # done, or --target reached
BAD_INPUT = 1  # a flag, file, record, model or checkpoint: ConfigError's one line
NON_FINITE = 2  # --max_nonfinite_steps consecutive skipped steps
CHECK_FAILED = 2  # a command that checks found what it checks for: audit_input's problems, a benchmark case failing
KERNEL_FAILED = 3  # a computation that failed here fails again on a rerun
TIMEOUT = 124  # the launcher's --timeout_s, like coreutils timeout(1)
INTERRUPTED = 130  # 128 + SIGINT: Ctrl-C
WORKER_LOST = 129  # a collective lost a peer
PREEMPTED = 143  # 128 + SIGTERM, after the checkpoint: Kubeflow and Slurm retry it


class Preempted(RuntimeError):
    """A SIGTERM stopped training after the coordinated checkpoint at ``step`` (in ``checkpoint``); training
    again into the same model_dir resumes there. Not a SystemExit: under ``tfgpu.fit`` the caller decides."""

    cause = "preempted by SIGTERM"

    def __init__(self, step: int, checkpoint: str):
        super().__init__(f"{self.cause}: checkpoint saved at step {step} ({checkpoint}); run the same "
                         "command again (or call tfgpu.fit again with the same model_dir) to resume from it")
        self.step, self.checkpoint = step, checkpoint


class Interrupted(Preempted, KeyboardInterrupt):
    """Ctrl-C (SIGINT) stopped training after the checkpoint at ``step``, as a SIGTERM does: a ``Preempted`` for
    callers of ``tfgpu.fit`` that catch that, and a ``KeyboardInterrupt``, as Python's own Ctrl-C is, for the
    others (a notebook's interrupted cell)."""

    cause = "interrupted by SIGINT (Ctrl-C)"


def stopped_by(signum: int):
    """The exception a stop signal ends training with: Interrupted for SIGINT, Preempted for any other."""
    import signal

    return Interrupted if signum == signal.SIGINT else Preempted


class NonFiniteError(RuntimeError):
    """--max_nonfinite_steps consecutive steps were skipped for a non-finite loss or gradient."""


class WorkerLost(RuntimeError):
    """A collective failed or timed out because another worker died, hung or became unreachable."""


class KernelFailed(RuntimeError):
    """A kernel (cuDNN, XLA, a custom op) failed on this worker: not a lost peer, so not worth a retry."""


# Every failure a command reports in one line, and the exit code it ends with.
EXIT_CODES = {ConfigError: BAD_INPUT, NonFiniteError: NON_FINITE, KernelFailed: KERNEL_FAILED,
              WorkerLost: WORKER_LOST, Preempted: PREEMPTED, Interrupted: INTERRUPTED}
FAILURES = tuple(EXIT_CODES)  # for ``except failures.FAILURES``


def exit_code(error: BaseException) -> int:
    """The exit code of ``error`` by the table (its nearest class listed there); ValueError for any other."""
    for cls in type(error).__mro__:
        if cls in EXIT_CODES:
            return EXIT_CODES[cls]
    raise ValueError(f"{type(error).__name__} is not a failure of the exit-code table")


def report(error: BaseException) -> int:
    """What a command's ``main`` does with a failure of the table: its one line on stderr (a preemption's as what
    happened, the others as ``error:``), and the exit code to end with."""
    print(f"{'stopped' if isinstance(error, Preempted) else 'error'}: {error}", file=sys.stderr, flush=True)
    return exit_code(error)


# A collective's connection failed: these words in a kernel error's message mean a lost peer, not a kernel
# (TensorFlow aborts every pending collective with the first failure's message).
COLLECTIVE_SIGNS = ("collective", "heartbeat", "connection reset", "socket closed", "failed to connect",
                    "unreachable", "peer", "coordination service")


def peer_errors() -> tuple:
    """Errors a collective raises when a peer is gone (connection reset, --collective_timeout_s exceeded, aborted)."""
    import tensorflow as tf

    return (tf.errors.UnavailableError, tf.errors.DeadlineExceededError, tf.errors.CancelledError,
            tf.errors.AbortedError)


def kernel_errors() -> tuple:
    """Errors a kernel raises when it fails; they mean a lost peer only when their message says so."""
    import tensorflow as tf

    return tf.errors.InternalError, tf.errors.UnknownError


def lost_peer(error: Exception) -> bool:
    """Whether ``error`` says that a collective failed because another worker is gone."""
    if isinstance(error, peer_errors()):
        return True
    return isinstance(error, kernel_errors()) and any(sign in str(error).lower() for sign in COLLECTIVE_SIGNS)


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


def skipped_too_long(longest_skipped_run: int, limit: int, step: int, counted, checkpoint_dir: str,
                     advice: str) -> NonFiniteError:
    """--max_nonfinite_steps reached: ``longest_skipped_run`` steps in a row, the longest run reaching into the loop
    that ended at ``step``, were skipped; ``counted``: the step metrics that count them; ``advice``: what to
    change (``precision.nonfinite_advice``)."""
    return NonFiniteError(
        f"{longest_skipped_run} consecutive steps (no finite step between them, counted across "
        f"loops) had a non-finite loss or gradient and were skipped, by step {step} "
        f"(--max_nonfinite_steps={limit}; scattered skips do not count, "
        f"each loop's are in history.jsonl as {', '.join(counted)}). A skipped step changes no "
        f"weight, so the last checkpoint in {checkpoint_dir} is good. " + advice)


@contextlib.contextmanager
def named(worker_index: int, num_workers: int, steps_done, last_checkpoint):
    """A TensorFlow error inside as the failure it is: WorkerLost when a collective lost a peer, KernelFailed
    when a kernel failed here (each naming this worker, the last step done and the last checkpoint: ``steps_done``
    and ``last_checkpoint`` are callables, read when an error comes)."""
    import tensorflow as tf

    try:
        yield
    except tf.errors.OpError as e:
        last = last_checkpoint()
        if num_workers > 1 and lost_peer(e):
            raise worker_lost(e, worker_index, steps_done(), last) from None
        if isinstance(e, kernel_errors()):
            raise kernel_failed(e, worker_index, steps_done(), last) from e
        raise
