"""Checkpoints: the chief saves to ``<model_dir>/checkpoints``; every other worker saves the same
collective checkpoint into a temporary directory that it deletes at the end.

All workers restore from the chief's directory, so a rerun of the same command
resumes every worker at the same step. TensorFlow writes a checkpoint's data and
``.index`` files first and the ``checkpoint`` state file (which names the latest)
last, under a temporary name renamed over the old one
(``file_io.atomic_write_string_to_file``), so a crash during a save leaves the
previous checkpoint as the latest usable one. ``model_dir`` may be any path
TensorFlow opens (``gs://``, ``ram://``): on an object store that rename is a copy
and a delete, so the state file is replaced whole but not in one atomic step.
"""
import logging
import os
import shutil

import tensorflow as tf

from tfgpu.runtime.distribute import Placement, worker_dir

log = logging.getLogger("tfgpu")


def checkpoint_dir(model_dir: str) -> str:
    return os.path.join(model_dir, "checkpoints")


class Checkpointer:
    def __init__(self, model_dir: str, placement: Placement, items: dict, step: tf.Variable, keep: int):
        self.real_dir = checkpoint_dir(model_dir)
        self._own_dir = worker_dir(model_dir, placement)
        self._temporary = not placement.is_chief
        directory = self.real_dir if placement.is_chief else os.path.join(self._own_dir, "checkpoints")
        self.checkpoint = tf.train.Checkpoint(step=step, **items)
        self.manager = tf.train.CheckpointManager(self.checkpoint, directory, max_to_keep=keep if
                                                  placement.is_chief else 1, step_counter=step)
        self.step = step

    def restore_latest(self) -> int:
        """Restores the chief's latest checkpoint, if any; returns the step to continue from."""
        latest = tf.train.latest_checkpoint(self.real_dir)
        if latest is None:
            return 0
        self.checkpoint.restore(latest).assert_existing_objects_matched()
        step = int(self.step.numpy())
        log.info("restored %s: resuming at step %d", latest, step)
        return step

    def save(self) -> str:
        """Saves at the current step (all workers must call it together)."""
        return self.manager.save(checkpoint_number=int(self.step.numpy()))

    def close(self) -> None:
        if self._temporary:
            shutil.rmtree(self._own_dir, ignore_errors=True)
