"""Where training is in its data, counted in records, and how a run resumes on another topology.

An epoch is read in *stages*. Stage 0 is an ordinary epoch of the topology that began it: each of its
``num_pipelines`` input pipelines reads ``total // num_pipelines`` records of its share (``pipeline.train_share``).
When a run resumes with a different number of input pipelines, the epoch it was interrupted in gets one more
stage: the records no earlier stage consumed, in split order, cut into contiguous ranges of nearly equal size, one
per new pipeline, each pipeline reading ``remaining // num_pipelines`` of them (``stage_ranges``). A stage's
pipelines start together and consume the same number of records (``Stage.consumed`` each), so a ``Position``
(epoch, stages) names exactly which records of the epoch were fed: the consumed records of every stage, whose
order ``resume.stage_keys`` reproduces. Later epochs are ordinary epochs of the new topology.

This module is pure Python and numpy: the trainer, ``tfgpu.audit_input`` and the tests compute positions,
stage ranges and the checkpoint's record with it.
"""
import dataclasses
import hashlib
import json

import numpy as np

from tfgpu.config import ConfigError

RECORD_VERSION = 1


@dataclasses.dataclass(frozen=True)
class Stage:
    """One stage of an epoch: ``num_pipelines`` pipelines, each of which consumed ``consumed`` records of it."""
    num_pipelines: int
    consumed: int


@dataclasses.dataclass(frozen=True)
class Position:
    """Records fed so far in ``epoch`` (0-based), stage by stage; the last stage is the one being read."""
    epoch: int
    stages: tuple

    @property
    def records_in_epoch(self) -> int:
        return sum(s.num_pipelines * s.consumed for s in self.stages)

    @property
    def is_ordinary(self) -> bool:
        """Whether the epoch is still in its first stage (no topology changed inside it)."""
        return len(self.stages) == 1


@dataclasses.dataclass(frozen=True)
class Topology:
    """What decides how records are cut into steps: pipelines (one per worker), replicas, the global batch."""
    num_workers: int
    replicas_per_worker: int
    global_batch_size: int
    batches_per_step: int

    @property
    def records_per_pipeline_step(self) -> int:
        return self.global_batch_size * self.batches_per_step // self.num_workers

    def describe(self) -> str:
        return (f"{self.num_workers} worker{'s' if self.num_workers != 1 else ''} x {self.replicas_per_worker} "
                f"replica{'s' if self.replicas_per_worker != 1 else ''}")


def from_step(step: int, topology: Topology, total: int) -> Position:
    """The position an uninterrupted run on ``topology`` reaches at ``step`` (ordinary epochs only)."""
    epoch, offset = divmod(step * topology.records_per_pipeline_step, total // topology.num_workers)
    return Position(epoch, (Stage(topology.num_workers, offset),))


def resume(position: Position, num_pipelines: int) -> Position:
    """The position a run with ``num_pipelines`` pipelines continues from: the same stage when the last stage had
    as many pipelines (nothing to rebalance), else a new stage of the records no stage consumed yet."""
    if position.stages[-1].num_pipelines == num_pipelines:
        return position
    if position.records_in_epoch == 0:
        return Position(position.epoch, (Stage(num_pipelines, 0),))
    return Position(position.epoch, position.stages + (Stage(num_pipelines, 0),))


def stage_ranges(remaining: np.ndarray, num_pipelines: int):
    """The remaining records (global indices, ascending) cut into ``num_pipelines`` contiguous ranges whose sizes
    differ by at most one, and the records each pipeline reads of its range (``len(remaining) // num_pipelines``;
    a longer range leaves out the record its order puts last, as in an ordinary epoch)."""
    total = len(remaining)
    cuts = [total * p // num_pipelines for p in range(num_pipelines + 1)]
    return [remaining[cuts[p]:cuts[p + 1]] for p in range(num_pipelines)], total // num_pipelines


def advance(position: Position, stage_length: int, epoch_length: int, records: int) -> Position:
    """The position after each pipeline of the current (last) stage consumed ``records`` more records:
    ``stage_length`` is what each pipeline reads of the current stage, ``epoch_length`` of an ordinary epoch."""
    current = position.stages[-1]
    done = current.consumed + records
    if done < stage_length:
        return Position(position.epoch, position.stages[:-1] + (Stage(current.num_pipelines, done),))
    epochs, offset = divmod(done - stage_length, epoch_length)
    return Position(position.epoch + 1 + epochs, (Stage(current.num_pipelines, offset),))


def records_fed(position: Position, total: int) -> int:
    """Records of the train split (``total`` readable) fed to reach ``position``: its whole epochs, each an ordinary
    epoch of the topology that began the current one (``total // pipelines`` records per pipeline), and those fed
    in the current one. Without a topology change, ``step * examples per step``, as an uninterrupted run counts."""
    first = position.stages[0].num_pipelines
    return position.epoch * first * (total // first) + position.records_in_epoch


def global_index(keys: np.ndarray, first_of_file: np.ndarray) -> np.ndarray:
    """Record identities (``file_index * 2**32 + index in the file``) as indices into the split."""
    keys = np.asarray(keys, np.int64)
    return first_of_file[keys >> 32] + (keys & 0xFFFFFFFF)


def first_of_file(files) -> np.ndarray:
    sizes = np.array([n for _, n in files], np.int64)
    return np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)


def dataset_fingerprint(files) -> str:
    """The train split's identity for a checkpoint's record: its shard names and record counts (no read)."""
    names = [[str(f).replace("\\", "/").rsplit("/", 1)[-1], int(n)] for f, n in files]
    return hashlib.sha256(json.dumps(names).encode()).hexdigest()[:16]


# -- the checkpoint's record ------------------------------------------------------------------------------------
def to_record(position: Position, topology: Topology, seed: int, fingerprint: str) -> dict:
    """What a checkpoint stores of the data position and the topology that trained it (JSON-able)."""
    return {"version": RECORD_VERSION, "epoch": position.epoch,
            "records_consumed_in_epoch": position.records_in_epoch,
            "stages": [[s.num_pipelines, s.consumed] for s in position.stages],
            **dataclasses.asdict(topology), "seed": seed, "dataset_fingerprint": fingerprint}


def from_record(record, where: str):
    """(Position, Topology, seed, fingerprint) of a checkpoint's record; a ConfigError naming ``where`` when it is
    not one this version wrote consistently."""

    def bad(what):
        return ConfigError("model_dir", f"{where}: the data position it records {what}; resume from an earlier "
                           "checkpoint (--checkpoint) or start a new --model_dir")

    if not isinstance(record, dict) or record.get("version") != RECORD_VERSION:
        raise bad(f"has version {record.get('version') if isinstance(record, dict) else None!r}, this tfgpu "
                  f"reads {RECORD_VERSION}")
    try:
        stages = tuple(Stage(int(p), int(c)) for p, c in record["stages"])
        position = Position(int(record["epoch"]), stages)
        topology = Topology(*(int(record[f.name]) for f in dataclasses.fields(Topology)))
        seed, fingerprint = int(record["seed"]), str(record["dataset_fingerprint"])
    except (KeyError, TypeError, ValueError) as e:
        raise bad(f"is malformed ({type(e).__name__}: {e})") from None
    if (not stages or position.epoch < 0 or any(s.num_pipelines < 1 or s.consumed < 0 for s in stages)
            or min(dataclasses.astuple(topology)) < 1
            or position.records_in_epoch != record.get("records_consumed_in_epoch")):
        raise bad(f"is inconsistent ({json.dumps(record, sort_keys=True)})")
    return position, topology, seed, fingerprint
