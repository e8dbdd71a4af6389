"""Input pipeline speed, shuffle memory and resume cost, measured in one run (issue 40).

Throughput, records per wall second and per CPU second of the process (steadier on a shared host), on the same
shards in the same process (``--repeats`` interleaved rounds, the median):
  tfgpu          tfgpu's training pipeline (``pipeline.train_dataset_fn``: the epoch's order by index, parse, decode,
                 label checks, batch), default settings;
  bare           ``TFRecordDataset(files)`` -> parse (and the same decode) -> batch: a bare read + parse loop;
  bare_pipeline  a bare shuffled pipeline doing the same decode: files shuffled, a parallel interleave, a
                 ``--shuffle_buffer`` record shuffle, a parallel map, batch, prefetch.
for raw 16x16x3 records (``--raw_records``, about 0.9 KB each) and for ~100 KB JPEG records (``--jpeg_records``,
decoded with --augment=imagenet's fused crop to 224 by tfgpu and both baselines).

Shuffle memory: the resident memory a process gains reading ``--memory_batches`` batches of the JPEG records through
tfgpu's pipeline at the default settings, and through the bare pipeline (its record shuffle buffer fills with up
to ``--shuffle_buffer`` records); a subprocess each, so nothing else is counted.

Resume cost: for each of ``--resume_sizes`` (raw 16x16 records, 1,125 a shard, as the issue measured): seconds from
building tfgpu's pipeline to its first batch, fresh (step 0), at mid-epoch and at the epoch's last step, and
what ``tfgpu.audit_input``'s index audit of one epoch costs (``--audit``). Runs longer than ``--max_seconds`` in
all stop early, saying so.

    python tools/bench_input.py --work_dir=/tmp/bench_input --raw_records=100000 --jpeg_records=2000 \\
        --resume_sizes=10000,100000,1000000 --output=/tmp/bench_input.json
"""
import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

PER_SHARD = 1125
BATCH = 256


def _write(directory: str, records, per_shard: int, image_shape, classes: int):
    """Shards of ``per_shard`` serialized records and their manifest (``records``: an iterator)."""
    from tfgpu.data.schema import tfrecord

    os.makedirs(directory, exist_ok=True)
    shards, index, done = [], 0, False
    while not done:
        chunk = []
        for record in records:
            chunk.append(record)
            if len(chunk) == per_shard:
                break
        done = len(chunk) < per_shard
        if chunk:
            name = f"train-{index:05d}.tfrecord"
            entry = tfrecord.write_shard(os.path.join(directory, name), iter(chunk))
            shards.append({"file": name, "num_examples": entry["num_examples"]})
            index += 1
    h, w, c = image_shape
    tfrecord.write_manifest(directory, {
        "name": os.path.basename(directory), "classes": [str(i) for i in range(classes)], "compression": "none",
        "splits": {"train": {"num_examples": sum(s["num_examples"] for s in shards), "shards": shards}},
        "image_shape": {"height": h, "width": w, "channels": c}})
    return directory


def raw_dataset(work_dir: str, count: int) -> str:
    """``count`` random 16x16x3 raw records, 10 classes, 1,125 a shard (made once)."""
    from tfgpu.data.schema import tfrecord

    directory = os.path.join(work_dir, f"raw16-{count}")
    if os.path.exists(os.path.join(directory, tfrecord.MANIFEST)):
        return directory
    rng = np.random.default_rng(0)
    pool = rng.integers(0, 256, (4096, 16, 16, 3), dtype=np.uint8)

    def records():
        for i in range(count):
            yield tfrecord.make_example(pool[i % 4096].tobytes(), "raw", i % 10, 16, 16, 3)

    return _write(directory, records(), PER_SHARD, (16, 16, 3), 10)


def jpeg_dataset(work_dir: str, count: int) -> str:
    """``count`` JPEG records of about 100 KB (500x375 noisy images at quality 93, 64 distinct; ImageNet's train
    JPEGs average about 110 KB), 10 classes, 125 a shard."""
    import tensorflow as tf

    from tfgpu.data.schema import tfrecord

    directory = os.path.join(work_dir, f"jpeg-q93-{count}")  # (jpeg-<count>: quality 85, about 63 KB a record)
    if os.path.exists(os.path.join(directory, tfrecord.MANIFEST)):
        return directory
    rng = np.random.default_rng(1)
    pool = []
    for _ in range(64):
        y, x = np.mgrid[0:375, 0:500].astype(np.float32)
        base = np.stack([127 + 90 * np.sin(x / rng.uniform(10, 60) + y / rng.uniform(10, 60) + c)
                         for c in range(3)], -1)
        image = np.clip(base + rng.normal(0, 14, base.shape), 0, 255).astype(np.uint8)
        pool.append(tf.io.encode_jpeg(image, quality=93).numpy())

    def records():
        for i in range(count):
            yield tfrecord.make_example(pool[i % 64], "jpeg", i % 10, 375, 500, 3)

    return _write(directory, records(), 125, (375, 500, 3), 10)


# -- the pipelines ------------------------------------------------------------------------------------------------
def _config(data_dir: str, jpeg: bool, **overrides):
    from tfgpu.config import Config

    more = dict(augment="imagenet", image_size=224) if jpeg else {}
    return Config(model_dir="unused", data_dir=data_dir, global_batch_size=BATCH, **more, **overrides)


def tfgpu_pipeline(data_dir: str, jpeg: bool, start_step: int = 0, **overrides):
    import tensorflow as tf

    from tfgpu.config import DatasetConfig
    from tfgpu.data import catalog
    from tfgpu.data.input import pipeline
    from tfgpu.tasks.registry import input_config

    config = _config(data_dir, jpeg, **overrides)
    info = catalog.prepare(DatasetConfig.of(config))
    return pipeline.train_dataset_fn(input_config(config), info, start_step)(tf.distribute.InputContext())


def _decode(jpeg: bool):
    """The per-record work of tfgpu's default Examples (parse, decode, --augment, --input_range), without its
    pipeline: the baselines' map."""
    import tensorflow as tf

    from tfgpu.data.input import augment
    from tfgpu.data.schema import tfrecord

    def fn(index, serialized):
        features = tf.io.parse_single_example(serialized, tfrecord.LABELLED_SPEC)
        if jpeg:
            image = augment.preprocess_train(features, 224, 3, "imagenet", tf.stack([tf.constant(1, tf.int64),
                                                                                     index]))
        else:
            image = augment.preprocess_train(features, 0, 3, "none", None)
        return image, features[tfrecord.LABEL]

    return fn


def _files(data_dir: str):
    from tfgpu.data.schema import tfrecord

    manifest = tfrecord.read_manifest(data_dir)
    return [os.path.join(data_dir, s["file"]) for s in manifest["splits"]["train"]["shards"]]


def bare(data_dir: str, jpeg: bool):
    import tensorflow as tf

    records = tf.data.TFRecordDataset(_files(data_dir)).repeat()
    ds = tf.data.Dataset.zip(tf.data.Dataset.counter(), records).map(_decode(jpeg), num_parallel_calls=tf.data.AUTOTUNE)
    return ds.batch(BATCH, drop_remainder=True).prefetch(tf.data.AUTOTUNE)


def bare_pipeline(data_dir: str, jpeg: bool, shuffle_buffer: int):
    import tensorflow as tf

    auto = tf.data.AUTOTUNE
    files = _files(data_dir)
    names = tf.data.Dataset.from_tensor_slices(files).shuffle(len(files), seed=1).repeat()
    records = names.interleave(tf.data.TFRecordDataset, cycle_length=min(16, len(files)), num_parallel_calls=auto)
    records = records.shuffle(shuffle_buffer, seed=2)
    ds = tf.data.Dataset.zip(tf.data.Dataset.counter(), records).map(_decode(jpeg), num_parallel_calls=auto)
    return ds.batch(BATCH, drop_remainder=True).prefetch(auto)


def rate(ds, seconds: float, warmup: int = 3):
    """(records per wall second, records per CPU second of this process) over ``seconds`` after ``warmup``
    batches. On a shared host the CPU rate is the steadier one: other jobs change the wall time, not the work."""
    it = iter(ds)
    for _ in range(warmup):
        next(it)
    n, start, cpu = 0, time.perf_counter(), time.process_time()
    while time.perf_counter() - start < seconds:
        next(it)
        n += 1
    return n * BATCH / (time.perf_counter() - start), n * BATCH / max(1e-9, time.process_time() - cpu)


def throughput(data_dir: str, jpeg: bool, seconds: float, repeats: int, shuffle_buffer: int) -> dict:
    """records/s (wall and CPU) of each pipeline, ``repeats`` interleaved rounds; the medians and every round."""
    makers = {"tfgpu": lambda: tfgpu_pipeline(data_dir, jpeg), "bare": lambda: bare(data_dir, jpeg),
              "bare_pipeline": lambda: bare_pipeline(data_dir, jpeg, shuffle_buffer)}
    rounds = {name: [] for name in makers}
    for _ in range(repeats):
        for name, make in makers.items():
            rounds[name].append(rate(make(), seconds))
    row = {name: statistics.median(w for w, _ in r) for name, r in rounds.items()}
    row.update({f"{name}_per_cpu_s": statistics.median(c for _, c in r) for name, r in rounds.items()})
    row.update(rounds={k: [(round(w), round(c)) for w, c in v] for k, v in rounds.items()},
               tfgpu_vs_bare=row["tfgpu"] / row["bare"], tfgpu_vs_bare_pipeline=row["tfgpu"] / row["bare_pipeline"],
               cpu_tfgpu_vs_bare=row["tfgpu_per_cpu_s"] / row["bare_per_cpu_s"],
               cpu_tfgpu_vs_bare_pipeline=row["tfgpu_per_cpu_s"] / row["bare_pipeline_per_cpu_s"])
    return row


MEMORY = """
import sys
sys.path.insert(0, {root!r})
import tools.bench_input as b
import tensorflow as tf
def rss():
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:")) / 1024
ds = b.{maker}
before = peak = rss()
it = iter(ds)
for _ in range({batches}):
    next(it)
    peak = max(peak, rss())
print(peak - before)
"""


def shuffle_memory(data_dir: str, batches: int, maker: str) -> float:
    """MB of resident memory gained (the peak, sampled after each batch) reading ``batches`` batches of the
    pipeline ``maker`` builds (a subprocess)."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    code = MEMORY.format(root=root, maker=maker, batches=batches)
    out = subprocess.run([sys.executable, "-c", code],
                         capture_output=True, text=True, env={**os.environ, "PYTHONPATH": root}, timeout=1800)
    if out.returncode:
        raise RuntimeError(out.stderr[-2000:])
    return float(out.stdout.strip().splitlines()[-1])


def first_batch(data_dir: str, start_step: int) -> float:
    """Seconds from building tfgpu's pipeline at ``start_step`` to its first batch."""
    started = time.perf_counter()
    next(iter(tfgpu_pipeline(data_dir, False, start_step)))
    return time.perf_counter() - started


def resume_cost(data_dir: str, count: int, repeats: int, audit: bool) -> dict:
    """First-batch seconds fresh, at mid-epoch and at the epoch's last step (medians of ``repeats``, interleaved),
    and the index audit of one epoch (seconds)."""
    steps = count // BATCH
    at = {"fresh": 0, "mid_epoch": steps // 2, "end_of_epoch": steps - 1}
    rounds = {name: [] for name in at}
    first_batch(data_dir, 0)  # the shard verdicts cached, TensorFlow warm
    for _ in range(repeats):
        for name, step in at.items():
            rounds[name].append(first_batch(data_dir, step))
    row = {name: statistics.median(r) for name, r in rounds.items()}
    row.update(records=count, steps_per_epoch=steps, rounds={k: [round(x, 2) for x in v] for k, v in rounds.items()})
    if audit:
        from tfgpu import audit_input

        config = _config(data_dir, False)
        started = time.perf_counter()
        result = audit_input.audit(config, 1, 1, 1)
        row["audit_s"] = time.perf_counter() - started
        row["audit_epoch"] = result["epochs"][0]
    return row


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--work_dir", default="/tmp/tfgpu_bench_input", help="Where generated data goes (kept).")
    p.add_argument("--raw_records", type=int, default=100_000, help="Raw 16x16 records for the throughput rows.")
    p.add_argument("--jpeg_records", type=int, default=2000, help="~100 KB JPEG records; 0 = no JPEG rows.")
    p.add_argument("--resume_sizes", default="10000,100000,1000000", help="Comma-separated record counts of the "
                   "resume rows; empty = none.")
    p.add_argument("--seconds", type=float, default=8.0, help="Timed seconds per throughput measurement.")
    p.add_argument("--repeats", type=int, default=2, help="Interleaved rounds per measurement (the median).")
    p.add_argument("--shuffle_buffer", type=int, default=10000, help="The bare pipeline's record shuffle buffer.")
    p.add_argument("--memory_batches", type=int, default=40, help="JPEG batches read for the shuffle memory; 0 = skip.")
    p.add_argument("--audit", action="store_true", help="Also time tfgpu.audit_input's index audit per resume size.")
    p.add_argument("--max_seconds", type=float, default=3600, help="Stop starting new rows after this long.")
    p.add_argument("--output", default="", help="Write the results as JSON here.")
    o = p.parse_args(argv)
    import tensorflow as tf

    started = time.perf_counter()
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    print(f"tf {tf.__version__}; {cores} usable cores; load average {os.getloadavg()[0]:.1f}; batch {BATCH}",
          flush=True)
    result = {"command": " ".join([os.path.basename(sys.executable), *sys.argv]), "cores": cores, "rows": {}}

    def over() -> bool:
        if time.perf_counter() - started > o.max_seconds:
            print(f"stopped: --max_seconds={o.max_seconds:.0f} reached", flush=True)
            return True
        return False

    if o.raw_records:
        row = throughput(raw_dataset(o.work_dir, o.raw_records), False, o.seconds, o.repeats, o.shuffle_buffer)
        result["rows"]["raw16"] = row
        print(f"raw 16x16 ({o.raw_records} records): tfgpu {row['tfgpu']:.0f}/s, bare read+parse {row['bare']:.0f}/s, "
              f"bare pipeline {row['bare_pipeline']:.0f}/s; tfgpu/bare {row['tfgpu_vs_bare']:.2f}, "
              f"tfgpu/bare pipeline {row['tfgpu_vs_bare_pipeline']:.2f}; per CPU second: tfgpu/bare "
              f"{row['cpu_tfgpu_vs_bare']:.2f}, tfgpu/bare pipeline {row['cpu_tfgpu_vs_bare_pipeline']:.2f}  "
              f"(wall, cpu) {row['rounds']}", flush=True)
    if o.jpeg_records and not over():
        data = jpeg_dataset(o.work_dir, o.jpeg_records)
        row = throughput(data, True, o.seconds, o.repeats, o.shuffle_buffer)
        result["rows"]["jpeg100k"] = row
        print(f"JPEG ~100 KB ({o.jpeg_records} records): tfgpu {row['tfgpu']:.0f}/s, bare read+decode "
              f"{row['bare']:.0f}/s, bare pipeline {row['bare_pipeline']:.0f}/s; "
              f"tfgpu/bare {row['tfgpu_vs_bare']:.2f}, "
              f"tfgpu/bare pipeline {row['tfgpu_vs_bare_pipeline']:.2f}; per CPU second: tfgpu/bare "
              f"{row['cpu_tfgpu_vs_bare']:.2f}, tfgpu/bare pipeline {row['cpu_tfgpu_vs_bare_pipeline']:.2f}  "
              f"(wall, cpu) {row['rounds']}", flush=True)
        if o.memory_batches:
            ours = shuffle_memory(data, o.memory_batches, f"tfgpu_pipeline({data!r}, True)")
            theirs = shuffle_memory(data, o.memory_batches, f"bare_pipeline({data!r}, True, {o.shuffle_buffer})")
            result["rows"]["jpeg100k"].update(memory_mb_tfgpu=ours, memory_mb_bare_pipeline=theirs)
            print(f"JPEG ~100 KB, resident memory gained over {o.memory_batches} batches: tfgpu {ours:.0f} MB, bare "
                  f"pipeline with a {o.shuffle_buffer}-record shuffle buffer {theirs:.0f} MB", flush=True)
    for size in (int(s) for s in o.resume_sizes.split(",") if s):
        if over():
            break
        row = resume_cost(raw_dataset(o.work_dir, size), size, o.repeats, o.audit)
        result["rows"][f"resume{size}"] = row
        audit = f"; index audit of one epoch {row['audit_s']:.1f} s {row['audit_epoch']}" if o.audit else ""
        print(f"resume at {size} records: first batch fresh {row['fresh']:.2f} s, mid-epoch {row['mid_epoch']:.2f} s "
              f"(+{row['mid_epoch'] - row['fresh']:.2f}), end of epoch {row['end_of_epoch']:.2f} s "
              f"(+{row['end_of_epoch'] - row['fresh']:.2f}){audit}  {row['rounds']}", flush=True)
    result["seconds"] = time.perf_counter() - started
    result["max_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    if o.output:
        with open(o.output, "w") as f:
            json.dump(result, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
