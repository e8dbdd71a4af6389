"""TensorBoard scalars as Keras writes them: runs ``summaries/train`` and ``summaries/validation`` with the same tag
for the same metric (``loss``, ``accuracy``: an evaluation's ``val_`` prefix is the run's name), so train and
validation curves overlay."""
import math

import tensorflow as tf


class Summaries:
    """The run's TensorBoard writers: ``dirs`` maps a kind of record (``train``, ``eval``) to its run's directory
    ({} without --tensorboard, or off the chief). Each writer is made at its first record: after ``train`` has cut
    what an earlier process recorded past the checkpoint (``history.cut_summaries``) from the files it left."""

    def __init__(self, dirs: dict):
        self.dirs = dict(dirs)
        self._writers = {}

    def write(self, kind: str, step: int, values: dict) -> None:
        """The finite numbers of ``values`` at ``step`` in ``kind``'s run (nothing for a kind without one)."""
        if kind not in self.dirs:
            return
        if kind not in self._writers:
            self._writers[kind] = tf.summary.create_file_writer(self.dirs[kind])
        writer = self._writers[kind]
        with writer.as_default(step=step):
            for name, value in values.items():
                if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
                    tf.summary.scalar(name[len("val_"):] if kind == "eval" and name.startswith("val_") else name,
                                      value)
        writer.flush()
