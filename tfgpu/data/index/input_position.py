"""Where a run's input pipelines are in the train split, and what a read error names: the trainer's input state.

``InputPosition`` is built once per run with what the pipelines read; ``start`` plans where they begin (from a
restored checkpoint's data position, on any topology, or from a step), ``record`` is the position saved in each
checkpoint, and ``reading`` turns an unreadable record into one line naming the flag that named the data.
"""
import contextlib
import dataclasses
import logging

import tensorflow as tf

from tfgpu.config import ConfigError
from tfgpu.data.index import position as data_position
from tfgpu.data.index import resume
from tfgpu.data.input import records

log = logging.getLogger("tfgpu")


class InputPosition:
    """The input position of a run reading ``info`` with ``inputs`` on ``placement``'s workers and replicas;
    ``data_flag``: the option that named the data (``data_dir`` or ``dataset``); ``allowed_changes``:
    --allow_config_change; ``step``: the run's step counter, which the position advances with."""

    def __init__(self, inputs, info, placement, data_flag: str, allowed_changes, step):
        self.inputs = inputs
        self.info = info
        self.placement = placement
        self.data_flag = data_flag
        self.allowed_changes = tuple(allowed_changes)
        self.step = step
        self.plan = None  # where the pipelines start (``start``); None for synthetic data or before ``start``
        self.plan_step = 0  # the step the plan starts at
        self.resumed_examples = None  # (step, examples trained by it) of the checkpoint resumed: its data position

    @contextlib.contextmanager
    def reading(self):
        """A read failure of the input inside (an unreadable record, a bad label) becomes a ConfigError naming the
        shard and record; other failures pass unchanged. Training, evaluation and --profile_input read through it."""
        try:
            yield
        except (tf.errors.DataLossError, tf.errors.InvalidArgumentError) as e:
            reason = records.explain_read_error(self.info, e)
            if reason is None:
                raise
            raise ConfigError(self.data_flag, reason) from None

    def topology(self) -> data_position.Topology:
        return data_position.Topology(self.placement.num_workers,
                                      self.placement.num_replicas // self.placement.num_workers,
                                      self.inputs.global_batch_size, self.inputs.batches_per_step)

    def record(self):
        """The data position at the current step and the topology, saved inside each checkpoint (no record for
        synthetic data, which has no records, or before ``start`` planned where the input starts)."""
        if self.plan is None:
            return None
        fed = (int(self.step.numpy()) - self.plan_step) * self.topology().records_per_pipeline_step
        now = data_position.advance(self.plan.position, self.plan.stage_length, self.plan.epoch_length, fed)
        return data_position.to_record(now, self.topology(), self.inputs.seed, self._fingerprint())

    def _fingerprint(self) -> str:
        return data_position.dataset_fingerprint(self.info.split_files[self.info.train_split])

    def start(self, step: int, recorded, where: str, history):
        """Plans where the input pipelines start and returns the plan: from ``recorded`` (the restored checkpoint's
        data position, read from ``where``; on another topology the rest of its epoch, each record once; one line
        and a ``history`` record say so), else from ``step``."""
        self.plan = self._plan(step, recorded if step else None, where, history)
        return self.plan

    def _plan(self, step: int, recorded, where: str, history):
        if self.info.name == "synthetic":
            return None
        self.plan_step = step
        num_pipelines = self.placement.num_workers
        if recorded is None:
            return resume.plan_resume(self.inputs, self.info, num_pipelines, step)
        pos, before, seed, fingerprint = data_position.from_record(recorded, where)
        self.resumed_examples = (step, data_position.records_fed(pos, records.train_records(self.info)))
        self._check_recorded(where, before, seed, fingerprint)
        plan = resume.plan_resume(self.inputs, self.info, num_pipelines, step, pos)
        after = self.topology()
        if before != after:
            self._announce_topology(step, before, after, pos, history)
        return plan

    def _check_recorded(self, where: str, before, seed: int, fingerprint: str) -> None:
        """Refuses, in one line, a resume whose records cannot be placed: another train split, another seed (the
        order the checkpoint's epoch was read in), another global batch unless --allow_config_change lists it."""
        if fingerprint != self._fingerprint():
            raise ConfigError(self.data_flag,
                              f"the train split {self.info.train_split!r} of {self.info.directory} is not the one "
                              f"{where} trained on (other shards or record counts); resume with that data or "
                              "start a new --model_dir")
        if seed != self.inputs.seed:
            raise ConfigError("seed", f"{self.inputs.seed} differs from the {seed} of {where}, which decides the order "
                              f"its epoch was read in; pass --seed={seed}")
        new_batch = self.inputs.global_batch_size
        if before.global_batch_size != new_batch and "global_batch_size" not in self.allowed_changes:
            raise ConfigError("global_batch_size", f"{new_batch} differs from the {before.global_batch_size} of "
                              f"{where}; pass --global_batch_size={before.global_batch_size} (it is kept on any "
                              "number of workers and replicas), or --allow_config_change=global_batch_size to "
                              "carry the data position over in records")

    def _announce_topology(self, step: int, before, after, pos, history) -> None:
        """One line and a history.jsonl record: what changed since the checkpoint and where the input resumes."""
        per_replica = after.global_batch_size // (after.num_workers * after.replicas_per_worker)
        was_per_replica = before.global_batch_size // (before.num_workers * before.replicas_per_worker)
        if before.global_batch_size == after.global_batch_size:
            batch = f"global batch {after.global_batch_size} kept, {per_replica} per replica"
        else:
            batch = (f"global batch {before.global_batch_size} -> {after.global_batch_size} by "
                     f"--allow_config_change, {per_replica} per replica; the classifier's learning rate follows it "
                     "(--base_learning_rate is per 256 examples)")
        accumulate = -(-per_replica // was_per_replica)
        if accumulate > 1 and per_replica % accumulate == 0:
            batch += (f"; if {per_replica} per replica does not fit in memory, --grad_accum_steps={accumulate} "
                      f"(classification) computes it in micro-batches of {per_replica // accumulate}")
        if (before.num_workers, before.replicas_per_worker) == (after.num_workers, after.replicas_per_worker):
            change = f"global batch changed on {after.describe()}"
        else:
            change = f"topology changed: {before.describe()} -> {after.describe()}"
        total = records.train_records(self.info)  # what the position counts in: readable records
        log.info("%s (%s); resuming epoch %d at record %s of %s", change, batch, pos.epoch + 1,
                 f"{pos.records_in_epoch:,}", f"{total:,}")
        history.write("topology", step, {
            "before": dataclasses.asdict(before), "after": dataclasses.asdict(after), "epoch": pos.epoch + 1,
            "records_consumed_in_epoch": pos.records_in_epoch, "records": total})
