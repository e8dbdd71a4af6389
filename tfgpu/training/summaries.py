"""TensorBoard scalars as Keras writes them: runs ``summaries/train`` and ``summaries/validation`` with the same tag
for the same metric (``loss``, ``accuracy``: an evaluation's ``val_`` prefix is the run's name), so train and
validation curves overlay.

The events are written by TensorBoard's own event file writer from protos made in Python (``scalar_pb``: the float32
scalar and plugin metadata ``tf.summary.scalar`` writes), not by TensorFlow ops: eager, ``tf.summary.scalar`` cost
about 0.3-2.6 ms of host time a scalar here (2-15 ms a train loop of 6, while the device waited), and one traced
call for all of them took 0.18 s to trace (issue 46, item 6)."""
import math
import time

from tensorboard.compat.proto import event_pb2, summary_pb2
from tensorboard.plugins.scalar.summary_v2 import scalar_pb
from tensorboard.summary.writer.event_file_writer import EventFileWriter


class Summaries:
    """The run's TensorBoard writers: ``dirs`` maps a kind of record (``train``, ``eval``) to its run's directory
    ({} without --tensorboard, or off the chief). Each writer is made at its first record: after ``train`` has cut
    what an earlier process recorded past the checkpoint (``history.cut_summaries``) from the files it left."""

    def __init__(self, dirs: dict):
        self.dirs = dict(dirs)
        self._writers = {}

    def write(self, kind: str, step: int, values: dict) -> None:
        """The finite numbers of ``values`` at ``step`` in ``kind``'s run (nothing for a kind without one), on disk
        when it returns."""
        if kind not in self.dirs:
            return
        if kind not in self._writers:
            self._writers[kind] = EventFileWriter(self.dirs[kind])
        writer = self._writers[kind]
        scalars = [scalar_pb(name[len("val_"):] if kind == "eval" and name.startswith("val_") else name, value).value[0]
                   for name, value in values.items()
                   if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)]
        if scalars:
            writer.add_event(event_pb2.Event(wall_time=time.time(), step=int(step),
                                             summary=summary_pb2.Summary(value=scalars)))
        writer.flush()

    def close(self) -> None:
        """Flushes and closes the writers (their files stay; a later record opens a new one)."""
        for writer in self._writers.values():
            writer.close()
        self._writers = {}
