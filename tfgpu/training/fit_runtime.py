"""TensorFlow's runtime between ``tfgpu.fit`` calls in one process: TensorFlow applies device settings and
MultiWorkerMirrored's collectives only to a runtime that has not started, and keeps each collective's instance
parameters (shapes) by key, which a new strategy numbers from the start again, so a run after one that all-reduced
over several replicas would meet the last one's shapes ("Shape mismatch in the collective instance 101"). ``fit``
restarts the runtime when its run needs that (tensors and datasets made before may not be usable after it)."""
import contextlib
import logging

from tfgpu.config import ConfigError

log = logging.getLogger("tfgpu")
_LAST_RUN = {"collectives": False}  # whether the last run in this process all-reduced over replicas (or failed)


@contextlib.contextmanager
def collectives_noted():
    """Around a run: yields ``note(num_replicas)`` for its end; a run that fails while training (perhaps inside a
    collective) counts as one that ran collectives, a refusal before training as one that did not."""
    def note(num_replicas: int):
        _LAST_RUN["collectives"] = num_replicas > 1

    try:
        yield note
    except ConfigError:
        raise
    except BaseException:
        _LAST_RUN["collectives"] = True
        raise


def fresh_if_needed(config, multi_worker: bool) -> bool:
    """Restarts TensorFlow's eager runtime when this run needs an unstarted one (device settings, MultiWorkerMirrored's collectives, fresh collective keys); returns
    whether it did."""
    from tensorflow.python.eager import context

    from tfgpu.config import RuntimeConfig
    from tfgpu.runtime import distribute

    after_collectives = _LAST_RUN["collectives"]
    if not multi_worker and not after_collectives:
        try:
            distribute.configure_devices(RuntimeConfig.of(config))
            return False
        except RuntimeError:
            pass
    why = ("MultiWorkerMirrored's collectives" if multi_worker else "fresh collectives (the last run in this process "
           "all-reduced over several replicas)" if after_collectives else "the device settings")
    log.info("restarting TensorFlow's runtime to apply %s (tensors and datasets made before this call may not be "
             "usable after it)", why)
    context._reset_context()
    return True
