"""How a run fails: which errors mean a lost peer."""


def test_only_collective_failures_count_as_a_lost_peer():
    import tensorflow as tf

    from tfgpu.training import failures

    lost = [tf.errors.UnavailableError(None, None, "Socket closed"),
            tf.errors.DeadlineExceededError(None, None, "Collective ops timed out"),
            tf.errors.CancelledError(None, None, "RPC cancelled"), tf.errors.AbortedError(None, None, "aborted"),
            tf.errors.InternalError(None, None, "Collective ops is aborted by: Connection reset by peer"),
            tf.errors.UnknownError(None, None, "Task /job:worker/task:1 stopped sending heartbeats")]
    kernels = [tf.errors.InternalError(None, None, "cuDNN launch failure : input shape ([8,64,32,32])"),
               tf.errors.UnknownError(None, None, "CUDNN_STATUS_EXECUTION_FAILED"),
               tf.errors.InternalError(None, None, "XLA compilation failed: ptxas exited with non-zero code")]
    assert all(failures.lost_peer(e) for e in lost) and not any(failures.lost_peer(e) for e in kernels)
