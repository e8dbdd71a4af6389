"""A ``tfgpu.fit`` run's checkpoints: the user's model (its optimizers and Keras' state through it), the states of its
random seed generators, the steps trained and the position in the data, saved by the chief into
``<model_dir>/checkpoints`` (``training.checkpoint``: atomic, checked against the model before anything is restored).

The position (``Position``) is where the next step starts: Keras' epoch, the step inside it, the seed of the arrays'
order and what the data was (kind, examples, batch size). A rerun with the same ``model_dir`` resumes there; one
whose data or batch size differ from the checkpoint's is refused in one line naming the argument.

Cadence: a checkpoint when a stop is asked for (the step in flight), at the end, and in between on a timer, by
default as often as costs 2% of the run's time (the next timed save waits 50 times the last save's duration).
"""
import dataclasses
import logging
import time

import tensorflow as tf

from tfgpu.models import random_states
from tfgpu.training import checkpoint
from tfgpu.training.fit.arguments import FitError

log = logging.getLogger("tfgpu")

FORMAT = 1
SAVE_COST_SHARE = 0.02  # timed checkpoints take at most this share of the run's time by default
MIN_INTERVAL_S = 10.0  # and come no closer together than this (a tiny model saves in milliseconds)


@dataclasses.dataclass
class Position:
    """Where the next step starts, and what the data was."""
    epoch: int = 0
    step: int = 0  # steps of ``epoch`` already trained
    seed: int = 0
    kind: str = ""  # "arrays" or "dataset"
    examples: int = -1  # arrays: how many (-1: a Dataset's is not counted)
    batch_size: int = 0

    def record(self) -> dict:
        return {"format": FORMAT, **dataclasses.asdict(self)}


def checked_position(record, current: Position, path: str) -> Position:
    """The position a checkpoint recorded, refused in one line when the data it trained on is not ``current``'s."""
    if not isinstance(record, dict) or record.get("format") != FORMAT:
        raise FitError("model_dir", f"{path} was not written by tfgpu.fit (no fit position in it); give another "
                       "model_dir")
    saved = Position(**{f.name: record.get(f.name) for f in dataclasses.fields(Position)})
    for name, argument, what in (("kind", "x", "data kind"), ("examples", "x", "number of examples"),
                                 ("batch_size", "batch_size", "batch size")):
        if getattr(saved, name) != getattr(current, name):
            raise FitError(argument, f"the checkpoint {path} was trained with {what} {getattr(saved, name)}, this "
                           f"call gives {getattr(current, name)}: give the same, or another model_dir")
    return saved


class RunState:
    """The checkpoints of ``model`` on ``placement`` in ``model_dir``; ``every_s``: the timed interval (0: 2% of the
    time)."""

    def __init__(self, model, placement, model_dir: str, position: Position, every_s: float):
        with placement.strategy.scope():
            self.steps = tf.Variable(0, dtype=tf.int64, trainable=False, name="fit_steps")
        items = {"model": model, **random_states.items(model)}  # a resumed run draws what the whole run would
        if model.optimizer is not None:
            items["optimizer"] = model.optimizer
        self.position = position
        self.checkpointer = checkpoint.Checkpointer(model_dir, placement, items, self.steps, keep=2,
                                                    data_position=self.position.record)
        self.fixed_every_s = every_s
        self.every_s = every_s or MIN_INTERVAL_S

    def restore(self):
        """Restores the latest checkpoint in model_dir, if any: its position (checked), else None."""
        path = checkpoint.latest(self.checkpointer.model_dir)
        if path is None:
            return None
        self.checkpointer.restore(path, "model_dir")
        saved = checked_position(self.checkpointer.data_position.restored, self.position, path)
        self.position.epoch, self.position.step, self.position.seed = saved.epoch, saved.step, saved.seed
        log.info("restored %s: resuming at epoch %d, step %d of it", path, saved.epoch + 1, saved.step)
        return self.position

    def save(self) -> str:
        """Saves now (every worker together); sets the next timed interval from the save's duration."""
        started = time.monotonic()
        path = self.checkpointer.save()
        if not self.fixed_every_s:
            self.every_s = max(MIN_INTERVAL_S, (time.monotonic() - started) / SAVE_COST_SHARE)
        return path

    def close(self) -> None:
        self.checkpointer.close()

    @property
    def real_dir(self) -> str:
        """The chief's checkpoint directory (what a rerun resumes from)."""
        return self.checkpointer.real_dir
