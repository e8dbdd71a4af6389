"""Checkpoints: the chief saves to ``<model_dir>/checkpoints``; every other worker saves the same
collective checkpoint into a temporary directory that it deletes at the end.

All workers restore from the chief's directory, so a rerun of the same command
resumes every worker at the same step. TensorFlow writes a checkpoint's data and
``.index`` files first and the ``checkpoint`` state file (which names the latest)
last, under a temporary name renamed over the old one
(``file_io.atomic_write_string_to_file``), so a crash during a save leaves the
previous checkpoint as the latest usable one. Each checkpoint also holds the data position and topology that
trained it (``DataPosition``: JSON in the checkpoint itself, so it is written and replaced with it); a checkpoint
written before it was recorded restores without it. ``model_dir`` may be any path
TensorFlow opens (``gs://``, ``ram://``): on an object store that rename is a copy
and a delete, so the state file is replaced whole but not in one atomic step.
"""
import json
import logging
import os
import shutil

import tensorflow as tf

from tfgpu.runtime.distribute import Placement, worker_dir

log = logging.getLogger("tfgpu")


def checkpoint_dir(model_dir: str) -> str:
    return os.path.join(model_dir, "checkpoints")


DATA_POSITION = "data_position"


class DataPosition(tf.train.experimental.PythonState):
    """The data position record (``tfgpu.data.position.to_record``) saved inside each checkpoint: ``current()``
    gives the one to save; ``restored`` is the one read back (``None`` until a checkpoint holding one is restored)."""

    def __init__(self, current):
        self.current = current
        self.restored = None

    def serialize(self):
        return json.dumps(self.current())

    def deserialize(self, string_value):
        try:
            self.restored = json.loads(string_value)
        except ValueError:
            self.restored = string_value  # position.from_record refuses it, naming the checkpoint


def has_data_position(path: str) -> bool:
    """Whether the checkpoint at ``path`` records its data position (one written before it did not)."""
    return any(name.startswith(DATA_POSITION + "/") for name, _ in tf.train.list_variables(path))


class Checkpointer:
    def __init__(self, model_dir: str, placement: Placement, items: dict, step: tf.Variable, keep: int,
                 data_position=None):
        self.real_dir = checkpoint_dir(model_dir)
        self._own_dir = worker_dir(model_dir, placement)
        self._temporary = not placement.is_chief
        directory = self.real_dir if placement.is_chief else os.path.join(self._own_dir, "checkpoints")
        self._items = {"step": step, **items}
        self.data_position = DataPosition(data_position or (lambda: {}))
        self.checkpoint = tf.train.Checkpoint(**self._items, **{DATA_POSITION: self.data_position})
        self.manager = tf.train.CheckpointManager(self.checkpoint, directory, max_to_keep=keep if
                                                  placement.is_chief else 1, step_counter=step)
        self.step = step

    def restore_latest(self) -> int:
        """Restores the chief's latest checkpoint, if any; returns the step to continue from."""
        latest = tf.train.latest_checkpoint(self.real_dir)
        if latest is None:
            return 0
        self.restore(latest).assert_existing_objects_matched()
        step = int(self.step.numpy())
        log.info("restored %s: resuming at step %d", latest, step)
        return step

    def restore(self, path: str):
        """Restores the checkpoint at ``path``, with its data position when it records one (then in
        ``data_position.restored``); returns the restore status."""
        self.restored_path = path
        if has_data_position(path):
            return self.checkpoint.restore(path)
        return tf.train.Checkpoint(**self._items).restore(path)

    def save(self) -> str:
        """Saves at the current step (all workers must call it together)."""
        return self.manager.save(checkpoint_number=int(self.step.numpy()))

    def close(self) -> None:
        if self._temporary:
            shutil.rmtree(self._own_dir, ignore_errors=True)
