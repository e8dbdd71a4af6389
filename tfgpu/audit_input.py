"""``python -m tfgpu.audit_input --data_dir=D --num_workers=N [--replicas_per_worker=R]
[--data_service_workers=K] [--epochs=E] [--output_json=F] [train flags]``.

Answers "does each worker see each example exactly once?" for a run's own flags: builds every worker's
training input pipeline (``pipeline.train_dataset_fn``, the one training uses, with the run's seed, batch,
cache, shuffle and data service settings), reads ``--epochs`` epochs of all of them and prints, per epoch,
how many records of the train split were seen once, never (missing) and twice or more (duplicated).

A record is identified by its place in the split (shard, index in the shard), which the pipeline reads
alongside it instead of decoding the image, so two byte-identical records (the same image stored twice)
are two records and never count as a duplicate. An epoch is each worker's first ``records // workers``
records after the previous epoch (the pipeline's own definition); the ``records % workers`` records the
workers leave out by design each epoch (one per worker whose share is a record longer) are reported as
``left_out``, not as missing; nor are the unreadable records --skip_corrupt_records reads around (``unreadable``,
counted once for the split). ``--data_service_workers=K`` starts a tf.data service (a dispatcher and K
workers) in this process and reads through it. Exit status: 0 when no epoch misses or duplicates a
record, 2 when one does, 1 for a bad flag or dataset.
"""
import json
import math
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # before TensorFlow is imported anywhere

from tfgpu.config import ConfigError, DatasetConfig, InputConfig  # noqa: E402

USAGE = ("python -m tfgpu.audit_input --data_dir=D [--dataset=NAME] --num_workers=N [--replicas_per_worker=R] "
         "[--data_service_workers=K] [--epochs=E] [--output_json=F] [train flags]")
FOUND_PROBLEMS_EXIT_CODE = 2


def parser():
    from tfgpu import cli

    p = cli.ArgumentParser(prog="python -m tfgpu.audit_input", usage=USAGE,
                           description="Does each worker's training input pipeline see each example exactly once?")
    p.add_argument("--num_workers", type=int, default=1, help="Workers whose pipelines are read.")
    p.add_argument("--replicas_per_worker", type=int, default=1, help="Replicas per worker (sets the batch split).")
    p.add_argument("--data_service_workers", type=int, default=0, help="Start a tf.data service with this many "
                   "workers in this process and read through it; 0 = no service.")
    p.add_argument("--output_json", default="", help="Also write the counts as JSON here.")
    p.add_config_flags(config_file=True)
    return p


def _service(num_workers: int):
    """An in-process tf.data service: a dispatcher and ``num_workers`` workers; returns (address, servers)."""
    import tensorflow as tf

    service = tf.data.experimental.service
    dispatcher = service.DispatchServer()
    address = dispatcher.target.split("://")[1]
    workers = [service.WorkerServer(service.WorkerConfig(dispatcher_address=address)) for _ in range(num_workers)]
    return dispatcher.target, [dispatcher, *workers]


def read_keys(config, info, num_workers: int, replicas_per_worker: int, records: int):
    """The first ``records`` record identities each worker's training pipeline yields, in order."""
    import numpy as np
    import tensorflow as tf

    from tfgpu.data import pipeline

    dataset_fn = pipeline.train_dataset_fn(InputConfig.of(config), info, 0, record_keys=True)
    per_worker = []
    for worker in range(num_workers):
        ctx = tf.distribute.InputContext(num_workers, worker, num_workers * replicas_per_worker)
        per_replica = ctx.get_per_replica_batch_size(config.global_batch_size)
        batches = dataset_fn(ctx).take(math.ceil(records / per_replica))
        per_worker.append(np.concatenate(list(batches.as_numpy_iterator()))[:records])
    return per_worker


def audit(config, num_workers: int, replicas_per_worker: int = 1, epochs: int = 1) -> dict:
    """Counts, per epoch, the train records all workers' pipelines yield 0, 1 and 2+ times."""
    import numpy as np

    from tfgpu.data import catalog, pipeline

    info = catalog.prepare(DatasetConfig.of(config))
    if info.name == "synthetic":
        raise ConfigError("dataset", "synthetic data repeats one random batch; there are no records to audit")
    split = info.train_split
    sizes = np.array([n for _, n in info.split_files[split]], np.int64)
    first_of_file = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    total = int(sizes.sum())
    unreadable = np.zeros(total, bool)
    for i, (filename, _) in enumerate(info.split_files[split]):
        if filename in info.damaged:
            unreadable[first_of_file[i] + np.array(info.damaged[filename].unreadable, np.int64)] = True
    shares = [pipeline.train_share(pipeline.readable_files(info, split), num_workers, w) for w in range(num_workers)]
    epoch_size = shares[0][1]
    keys = read_keys(config, info, num_workers, replicas_per_worker, epochs * epoch_size)
    result = {"data": info.directory, "split": split, "records": total, "unreadable": int(unreadable.sum()),
              "num_workers": num_workers,
              "replicas_per_worker": replicas_per_worker, "records_per_worker_per_epoch": epoch_size,
              "steps_per_epoch": num_workers * epoch_size / config.examples_per_step, "epochs": []}
    for e in range(epochs):
        seen = np.zeros(total, np.int64)
        left_out = 0
        for worker_keys, (segments, _) in zip(keys, shares):
            part = worker_keys[e * epoch_size:(e + 1) * epoch_size]
            file_index, index = part >> 32, part & 0xFFFFFFFF
            np.add.at(seen, first_of_file[file_index] + index, 1)
            # Its share's records this worker did not reach, up to the one record a longer share leaves out.
            share = np.concatenate([first_of_file[f] + pipeline.readable_indices(info, split, f, first, n)
                                    for f, first, n in segments])
            left_out += min(int((seen[share] == 0).sum()), len(share) - epoch_size)
        never = int((seen[~unreadable] == 0).sum())
        result["epochs"].append({"epoch": e + 1, "seen_once": int((seen == 1).sum()), "missing": never - left_out,
                                 "duplicated": int((seen >= 2).sum()), "left_out": left_out})
    return result


def format_report(result: dict) -> str:
    unreadable = (f" ({result['unreadable']} unreadable, read around: --skip_corrupt_records)"
                  if result["unreadable"] else "")
    lines = [f"{result['data']} split {result['split']!r}: {result['records']} records{unreadable}, "
             f"{result['num_workers']} worker(s) x {result['replicas_per_worker']} replica(s), {result['records_per_worker_per_epoch']} "
             f"records per worker per epoch ({result['steps_per_epoch']:.2f} steps)"]
    for e in result["epochs"]:
        lines.append(f"epoch {e['epoch']}: seen once {e['seen_once']}, missing (seen 0 times) {e['missing']}, "
                     f"duplicated (seen 2+ times) {e['duplicated']}, left out as the remainder {e['left_out']}")
    return "\n".join(lines)


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
        for name, minimum in (("num_workers", 1), ("replicas_per_worker", 1), ("data_service_workers", 0)):
            if getattr(opts, name) < minimum:
                raise ConfigError(name, f"must be >= {minimum}, got {getattr(opts, name)}")
        num_workers, replicas, service_workers = opts.num_workers, opts.replicas_per_worker, opts.data_service_workers
        opts.config_flags.setdefault("model_dir", "unused-by-audit_input")
        config = cli.resolve(opts, opts.config)
        if service_workers and config.data_service:
            raise ConfigError("data_service_workers", f"starts its own tf.data service; drop --data_service="
                              f"{config.data_service} or --data_service_workers")
        from tfgpu.training import experiment

        experiment._check_batches(config, num_workers * replicas)
        if service_workers:
            import dataclasses

            target, servers = _service(service_workers)
            config = dataclasses.replace(config, data_service=target)
        result = audit(config, num_workers, replicas, max(1, math.ceil(config.epochs)))
        result["data_service_workers"] = service_workers
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    finally:
        for server in servers:
            server._stop()
    print(format_report(result), flush=True)
    if opts.output_json:
        from tfgpu.runtime.fileio import atomic_write_bytes

        atomic_write_bytes(opts.output_json, json.dumps(result, indent=2).encode())
    bad = any(e["missing"] or e["duplicated"] for e in result["epochs"])
    return FOUND_PROBLEMS_EXIT_CODE if bad else 0


if __name__ == "__main__":
    sys.exit(main())
