"""``python -m tfgpu.audit_input --data_dir=D --num_workers=N [--replicas_per_worker=R]
[--data_service_workers=K] [--epochs=E] [--read_records] [--output_json=F] [train flags]``.

Answers "does each worker see each example exactly once?" for a run's own flags: computes every worker's
training order (``data.index.order``, the one ``pipeline.train_dataset_fn`` reads by, with the run's seed, batch,
shuffle settings) for ``--epochs`` epochs from the shards' record index, without reading a record (seconds for
ImageNet), and prints, per epoch, how many records of the train split were seen once, never (missing) and twice or
more (duplicated). ``--read_records`` reads them through the real pipelines instead (as a tf.data service always
is): the order the records really arrive in.

A record is identified by its place in the split (shard, index in the shard), which the pipeline reads
alongside it instead of decoding the image, so two byte-identical records (the same image stored twice)
are two records and never count as a duplicate. An epoch is each worker's first ``records // workers``
records after the previous epoch (the pipeline's own definition); the ``records % workers`` records the
workers leave out by design each epoch (one per worker whose share is a record longer) are reported as
``left_out``, not as missing; nor are the unreadable records --skip_corrupt_records reads around (``unreadable``,
counted once for the split). ``--data_service_workers=K`` starts a tf.data service (a dispatcher and K
workers) in this process and reads through it.

``--resume_from_step=S`` audits a resume on another topology: a run on ``--previous_num_workers`` x
``--previous_replicas_per_worker`` with ``--previous_global_batch_size`` (defaults: this run's) interrupted at
step S and resumed with this run's flags. The interrupted epoch counts the records the previous topology consumed
before S (computed by ``resume.consumed_records``, as the trainer does) plus those the new pipelines feed for the
rest of it; ``--epochs`` ordinary epochs of the new topology follow. Exit status: 0 when no epoch misses or duplicates a
record, 2 when one does, 1 for a bad flag or dataset.
"""
import json
import math
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # before TensorFlow is imported anywhere

from tfgpu.config import ConfigError, DatasetConfig  # noqa: E402
from tfgpu.runtime import failures  # noqa: E402

USAGE = ("python -m tfgpu.audit_input --data_dir=D [--dataset=NAME] --num_workers=N [--replicas_per_worker=R] "
         "[--data_service_workers=K] [--epochs=E] [--read_records] [--resume_from_step=S --previous_num_workers=N "
         "--previous_replicas_per_worker=R --previous_global_batch_size=B] [--output_json=F] [train flags]")


def parser():
    from tfgpu import cli

    p = cli.ArgumentParser(prog="python -m tfgpu.audit_input", usage=USAGE,
                           description="Does each worker's training input pipeline see each example exactly once?")
    p.add_argument("--num_workers", type=int, default=1, help="Workers whose pipelines are read.")
    p.add_argument("--replicas_per_worker", type=int, default=1, help="Replicas per worker (sets the batch split).")
    p.add_argument("--data_service_workers", type=int, default=0, help="Start a tf.data service with this many "
                   "workers in this process and read through it; 0 = no service.")
    p.add_argument("--resume_from_step", type=int, default=0, help="Audit a resume at this step of a run on the "
                   "previous topology below; 0 = a run from the start.")
    p.add_argument("--previous_num_workers", type=int, default=0, help="Workers of the interrupted run; 0 = "
                   "--num_workers.")
    p.add_argument("--previous_replicas_per_worker", type=int, default=0, help="Replicas per worker of the "
                   "interrupted run; 0 = --replicas_per_worker.")
    p.add_argument("--previous_global_batch_size", type=int, default=0, help="Global batch of the interrupted run; "
                   "0 = --global_batch_size.")
    p.add_argument("--read_records", action="store_true", help="Read every record through the real pipelines "
                   "(minutes at ImageNet's size) instead of computing each epoch's order from the shards' record "
                   "index (seconds); a tf.data service is always read.")
    p.add_argument("--output_json", default="", help="Also write the counts as JSON here.")
    p.add_config_flags(config_file=True)
    return p


def _service(num_workers: int):
    """An in-process tf.data service: a dispatcher and ``num_workers`` workers; returns (address, servers)."""
    import tensorflow as tf

    service = tf.data.experimental.service
    # Jobs the audit leaves open (a pipeline's next epochs, started ahead) are collected a second after their
    # client goes, not after the default 5 minutes: stopping a worker waits for the tasks it still holds.
    dispatcher = service.DispatchServer(service.DispatcherConfig(job_gc_check_interval_ms=500, job_gc_timeout_ms=1000))
    address = dispatcher.target.split("://")[1]
    workers = [service.WorkerServer(service.WorkerConfig(dispatcher_address=address, heartbeat_interval_ms=500))
               for _ in range(num_workers)]
    return dispatcher.target, [dispatcher, *workers]


def read_keys(config, info, num_workers: int, replicas_per_worker: int, records: int, start_step: int = 0,
              plan=None):
    """The first ``records`` record identities each worker's training pipeline yields from ``start_step`` (resumed
    by ``plan``), in order."""
    import numpy as np
    import tensorflow as tf

    from tfgpu.data.input import pipeline
    from tfgpu.tasks.registry import input_config

    dataset_fn = pipeline.train_dataset_fn(input_config(config), info, start_step, record_keys=True, plan=plan)
    per_worker = []
    for worker in range(num_workers):
        ctx = tf.distribute.InputContext(num_workers, worker, num_workers * replicas_per_worker)
        per_replica = ctx.get_per_replica_batch_size(config.global_batch_size)
        batches = dataset_fn(ctx).take(math.ceil(records / per_replica))
        per_worker.append(np.concatenate(list(batches.as_numpy_iterator()))[:records])
    return per_worker


def index_keys(inputs, info, num_workers: int, records: int, plan=None):
    """The first ``records`` record identities each worker's training pipeline feeds (resumed by ``plan``), in
    order, computed from the epochs' orders (``data.index.order``) without reading a record: what ``read_keys``
    reads."""
    import numpy as np

    from tfgpu.data.input import pipeline

    per_worker = []
    for worker in range(num_workers):
        ordinary = pipeline.share_order(inputs, info, num_workers, worker)
        epoch, offset = (plan.position.epoch, plan.position.stages[-1].consumed) if plan is not None else (0, 0)
        parts, need = [], records
        if plan is not None and plan.in_later_stage:
            parts.append(plan.stage_order(inputs, info, worker).keys(epoch, offset, need))
            need, epoch, offset = need - len(parts[-1]), epoch + 1, 0
        while need > 0:
            parts.append(ordinary.keys(epoch, offset, need))
            need, epoch, offset = need - len(parts[-1]), epoch + 1, 0
        per_worker.append(np.concatenate(parts) if parts else np.zeros(0, np.int64))
    return per_worker


def _count_epoch(total: int, first_of_file, parts, ranges, epoch_length: int, before=(), unreadable=None) -> dict:
    """Seen once / missing / duplicated / left out of one epoch: ``parts`` the record keys each worker fed in it,
    ``before`` the split indices fed before (an interrupted epoch's), ``ranges`` each worker's records of it;
    ``unreadable`` (a mask of the split) are never missing."""
    import numpy as np

    from tfgpu.data.index import position

    seen = np.zeros(total, np.int64)
    np.add.at(seen, np.asarray(before, np.int64), 1)
    for part in parts:
        np.add.at(seen, position.global_index(part, first_of_file), 1)
    # Records of its range a worker did not reach, up to those a longer range leaves out.
    left_out = sum(min(int((seen[mine] == 0).sum()), len(mine) - epoch_length) for mine in ranges)
    never = int((seen[~unreadable] == 0).sum()) if unreadable is not None else int((seen == 0).sum())
    return {"seen_once": int((seen == 1).sum()), "missing": never - left_out, "duplicated": int((seen >= 2).sum()),
            "left_out": left_out}


def _share_indices(info, first_of_file, num_workers: int):
    """Each worker's share of an ordinary epoch (its readable records), as split indices."""
    import numpy as np

    from tfgpu.data.input import pipeline, records

    split = info.train_split
    return [np.concatenate([first_of_file[f] + records.readable_indices(info, split, f, first, n)
                            for f, first, n in pipeline.train_share(records.readable_files(info, split),
                                                                    num_workers, w)[0]])
            for w in range(num_workers)]


def audit(config, num_workers: int, replicas_per_worker: int = 1, epochs: int = 1, previous=None,
          resume_from_step: int = 0, read_records: bool = False) -> dict:
    """Counts, per epoch, the train records all workers' pipelines yield 0, 1 and 2+ times: computed from the
    epochs' orders (``index_keys``; no record read), or, with ``read_records`` (and always through a tf.data
    service, whose order is not computable), read through the real pipelines. With ``resume_from_step``, the run
    resumes there from one on ``previous`` (a ``position.Topology``): the interrupted epoch (records consumed
    before plus fed after), then ``epochs`` epochs."""
    import numpy as np

    from tfgpu.data import catalog
    from tfgpu.data.index import position, resume
    from tfgpu.data.input import records
    from tfgpu.tasks.registry import input_config

    info = catalog.prepare(DatasetConfig.of(config))
    if info.name == "synthetic":
        raise ConfigError("dataset", "synthetic data repeats one random batch; there are no records to audit")
    inputs = input_config(config)
    split = info.train_split
    files = info.split_files[split]
    starts = position.first_of_file(files)
    total = info.num_train_examples
    unreadable = np.zeros(total, bool)
    for i, (filename, _) in enumerate(files):
        if filename in info.damaged:
            unreadable[starts[i] + np.array(info.damaged[filename].unreadable, np.int64)] = True
    epoch_size = records.train_records(info) // num_workers
    shares = _share_indices(info, starts, num_workers)
    result = {"data": info.directory, "split": split, "records": total, "unreadable": int(unreadable.sum()),
              "num_workers": num_workers,
              "replicas_per_worker": replicas_per_worker, "records_per_worker_per_epoch": epoch_size,
              "steps_per_epoch": num_workers * epoch_size / inputs.examples_per_step, "epochs": []}
    plan, stage_reads, first_epoch, before, ranges = None, 0, 0, (), shares
    if resume_from_step:
        recorded = position.from_step(resume_from_step, previous, records.train_records(info))
        plan = resume.plan_resume(inputs, info, num_workers, resume_from_step, recorded)
        before = (plan.consumed if plan.in_later_stage else
                  resume.consumed_records(inputs, info, plan.position)[0])
        if plan.in_later_stage:
            ranges = plan.ranges
        stage_reads = plan.stage_length - plan.position.stages[-1].consumed
        first_epoch = plan.position.epoch
        result.update(resume_from_step=resume_from_step, previous_num_workers=previous.num_workers,
                      previous_replicas_per_worker=previous.replicas_per_worker,
                      previous_global_batch_size=previous.global_batch_size,
                      interrupted_epoch={"epoch": first_epoch + 1, "records_consumed_before": len(before),
                                         "records_fed_after_per_worker": stage_reads})
    reading = read_records or bool(inputs.data_service)
    result["read_records"] = reading
    if reading:
        keys = read_keys(config, info, num_workers, replicas_per_worker, stage_reads + epochs * epoch_size,
                         resume_from_step, plan)
    else:
        if plan is None:
            plan = resume.plan_resume(inputs, info, num_workers, 0)
        keys = index_keys(inputs, info, num_workers, stage_reads + epochs * epoch_size, plan)
    if resume_from_step:
        result["epochs"].append({"epoch": first_epoch + 1, **_count_epoch(
            total, starts, [k[:stage_reads] for k in keys], ranges, plan.stage_length, before, unreadable)})
    for e in range(epochs):
        parts = [k[stage_reads + e * epoch_size:stage_reads + (e + 1) * epoch_size] for k in keys]
        number = first_epoch + (2 if resume_from_step else 1) + e
        result["epochs"].append({"epoch": number, **_count_epoch(total, starts, parts, shares, epoch_size,
                                                                 unreadable=unreadable)})
    return result


def format_report(result: dict) -> str:
    unreadable = (f" ({result['unreadable']} unreadable, read around: --skip_corrupt_records)"
                  if result["unreadable"] else "")
    lines = [f"{result['data']} split {result['split']!r}: {result['records']} records{unreadable}, "
             f"{result['num_workers']} worker(s) x {result['replicas_per_worker']} replica(s), {result['records_per_worker_per_epoch']} "
             f"records per worker per epoch ({result['steps_per_epoch']:.2f} steps)"]
    if "resume_from_step" in result:
        interrupted = result["interrupted_epoch"]
        lines.append(f"resumed at step {result['resume_from_step']} of a run on {result['previous_num_workers']} "
                     f"worker(s) x {result['previous_replicas_per_worker']} replica(s), global batch "
                     f"{result['previous_global_batch_size']}: epoch {interrupted['epoch']} had "
                     f"{interrupted['records_consumed_before']} records consumed before, each worker feeds "
                     f"{interrupted['records_fed_after_per_worker']} more")
    for e in result["epochs"]:
        lines.append(f"epoch {e['epoch']}: seen once {e['seen_once']}, missing (seen 0 times) {e['missing']}, "
                     f"duplicated (seen 2+ times) {e['duplicated']}, left out as the remainder {e['left_out']}")
    return "\n".join(lines)


def _previous_topology(opts, config):
    """The interrupted run's topology from the --previous_* flags (each defaults to this run's value)."""
    from tfgpu.data.index import position
    from tfgpu.tasks.registry import input_config

    return position.Topology(opts.previous_num_workers or opts.num_workers,
                             opts.previous_replicas_per_worker or opts.replicas_per_worker,
                             opts.previous_global_batch_size or config.global_batch_size,
                             input_config(config).batches_per_step)


def _check_previous_batch(config, previous, opts) -> None:
    """The interrupted run's global batch against its own replicas; ConfigError naming the --previous_* flag that
    set what does not fit (this run's own batch was checked against this run's replicas before)."""
    import dataclasses

    from tfgpu.training import experiment

    replicas = previous.num_workers * previous.replicas_per_worker
    set_here = [name for name in ("previous_global_batch_size", "previous_num_workers", "previous_replicas_per_worker")
                if getattr(opts, name)]
    flag = "previous_global_batch_size" if opts.previous_global_batch_size or not set_here else set_here[0]
    try:
        experiment._check_batches(dataclasses.replace(config, global_batch_size=previous.global_batch_size,
                                                      eval_batch_size=previous.global_batch_size), replicas)
    except ConfigError as e:
        raise ConfigError(flag, f"the interrupted run's global batch {previous.global_batch_size} does not fit its "
                          f"{previous.num_workers} worker(s) x {previous.replicas_per_worker} replica(s): "
                          f"{e.reason}") from None


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    from tfgpu import cli
    from tfgpu.runtime import logs

    if cli.wants_help(argv):
        print(parser().format_help())
        return 0
    logs.setup()
    servers = []
    try:
        opts = parser().parse_args(argv)
        for name, minimum in (("num_workers", 1), ("replicas_per_worker", 1), ("data_service_workers", 0),
                              ("resume_from_step", 0), ("previous_num_workers", 0),
                              ("previous_replicas_per_worker", 0), ("previous_global_batch_size", 0)):
            if getattr(opts, name) < minimum:
                raise ConfigError(name, f"must be >= {minimum}, got {getattr(opts, name)}")
        num_workers, replicas, service_workers = opts.num_workers, opts.replicas_per_worker, opts.data_service_workers
        opts.config_flags.setdefault("model_dir", "unused-by-audit_input")
        config = cli.resolve(opts, opts.config)
        if service_workers and config.data_service:
            raise ConfigError("data_service_workers", f"starts its own tf.data service; drop --data_service="
                              f"{config.data_service} or --data_service_workers")
        import dataclasses

        from tfgpu.training import experiment

        experiment._check_batches(config, num_workers * replicas)
        if service_workers:
            target, servers = _service(service_workers)
            config = dataclasses.replace(config, data_service=target)
        previous = _previous_topology(opts, config)
        if opts.resume_from_step:
            _check_previous_batch(config, previous, opts)
        result = audit(config, num_workers, replicas, max(1, math.ceil(config.epochs)), previous,
                       opts.resume_from_step, opts.read_records)
        result["data_service_workers"] = service_workers
    except ConfigError as e:
        return failures.report(e)
    finally:
        for server in servers:
            server._stop()
    print(format_report(result), flush=True)
    if opts.output_json:
        from tfgpu.runtime.fileio import atomic_write_bytes

        atomic_write_bytes(opts.output_json, json.dumps(result, indent=2).encode())
    bad = any(e["missing"] or e["duplicated"] for e in result["epochs"])
    return failures.CHECK_FAILED if bad else failures.OK


if __name__ == "__main__":
    sys.exit(main())
