"""Input pipeline throughput, measured in one run on the same JPEG TFRecord data (images/sec):

  (a) tfgpu's training pipeline (tfgpu.data.pipeline, --augment=imagenet: fused decode_and_crop_jpeg);
  (b) a tfds-style tf.data pipeline (parallel interleave and map, full-image decode, then crop) and a naive one
      (sequential map, no prefetch);
  (c) the decode limit: single-thread decode + random-resized crop + resize rate times the usable cores.

    python tools/bench_input.py --make_jpegs=2000 --work_dir=/tmp/bench_input --image_sizes=64,224
    python tools/bench_input.py --data_dir=/data/imagenet-tfr --image_sizes=224 --seconds=30

Goal: (a) >= 0.8 x (c) and (a) >= (b). Prints a table and writes it as JSON (--output).
"""
import argparse
import json
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def make_jpeg_folder(root: str, count: int, seed: int = 0) -> None:
    """``count`` ImageNet-like JPEGs (about 500x375, smooth content plus noise) in 10 class folders."""
    import tensorflow as tf

    rng = np.random.default_rng(seed)
    for i in range(count):
        h, w = int(rng.integers(300, 500)), int(rng.integers(350, 560))
        y, x = np.mgrid[0:h, 0:w].astype(np.float32)
        phase = rng.uniform(0, 6.28, 3)
        base = np.stack([127 + 100 * np.sin(x / rng.uniform(15, 80) + phase[c] + y / rng.uniform(20, 90))
                         for c in range(3)], -1)
        image = np.clip(base + rng.normal(0, 18, base.shape), 0, 255).astype(np.uint8)
        folder = os.path.join(root, f"class{i % 10}")
        os.makedirs(folder, exist_ok=True)
        with open(os.path.join(folder, f"{i:06d}.jpg"), "wb") as f:
            f.write(tf.io.encode_jpeg(image, quality=90).numpy())


def _rate(ds, batch_size: int, seconds: float, warmup_batches: int) -> float:
    it = iter(ds)
    for _ in range(warmup_batches):
        next(it)
    n, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        next(it)
        n += 1
    return n * batch_size / (time.perf_counter() - start)


def tfgpu_pipeline(data_dir, size, batch, deterministic):
    import tensorflow as tf

    from tfgpu.config import Config, DatasetConfig
    from tfgpu.data import catalog, pipeline
    from tfgpu.tasks.registry import input_config

    config = Config(model_dir="unused", data_dir=data_dir, image_size=size, augment="imagenet",
                    global_batch_size=batch, deterministic_input=deterministic)
    info = catalog.prepare(DatasetConfig.of(config))
    return pipeline.train_dataset_fn(input_config(config), info, 0)(tf.distribute.InputContext())


def _full_decode_crop(serialized, size, seed):
    """The tfds-style per-example work: decode the whole JPEG, then take a random-resized crop."""
    import tensorflow as tf

    from tfgpu.data import augment, tfrecord

    features = tfrecord.parse_example(serialized)
    image = tf.io.decode_jpeg(features[tfrecord.ENCODED], channels=3)
    window = augment.crop_window(tf.shape(image), seed)
    image = tf.slice(image, [window[0], window[1], 0], [window[2], window[3], -1])
    image = tf.image.resize(image, [size, size])
    return tf.image.stateless_random_flip_left_right(image, seed) / 127.5 - 1.0


def baseline(files, size, batch, parallel: bool):
    import tensorflow as tf

    auto = tf.data.AUTOTUNE
    files_ds = tf.data.Dataset.from_tensor_slices(files).repeat()
    if parallel:
        records = files_ds.interleave(tf.data.TFRecordDataset, cycle_length=min(16, len(files)),
                                      num_parallel_calls=auto)
    else:
        records = files_ds.flat_map(tf.data.TFRecordDataset)
    ds = tf.data.Dataset.zip(tf.data.Dataset.counter(), records.shuffle(1000 if parallel else 1, seed=1))
    ds = ds.map(lambda i, r: (_full_decode_crop(r, size, tf.stack([tf.constant(1, tf.int64), i])), 0),
                num_parallel_calls=auto if parallel else None)
    ds = ds.batch(batch, drop_remainder=True)
    return ds.prefetch(auto) if parallel else ds


def single_thread_limit(files, size, seconds):
    """Fused decode + crop + resize on one thread (the work tfgpu's pipeline does per image)."""
    import tensorflow as tf

    from tfgpu.data import augment, tfrecord

    ds = tf.data.Dataset.zip(tf.data.Dataset.counter(), tf.data.TFRecordDataset(files).repeat())
    ds = ds.map(lambda i, r: augment.preprocess_train(tfrecord.parse_example(r), size, 3, "imagenet",
                                                      tf.stack([tf.constant(2, tf.int64), i])))
    options = tf.data.Options()
    options.threading.private_threadpool_size = 1
    options.threading.max_intra_op_parallelism = 1
    options.autotune.enabled = False
    return _rate(ds.with_options(options), 1, seconds, 20)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data_dir", default="", help="A converted JPEG dataset (tfgpu.convert --image_format=keep).")
    p.add_argument("--make_jpegs", type=int, default=2000, help="Without --data_dir: generate this many JPEGs.")
    p.add_argument("--work_dir", default="/tmp/tfgpu_bench_input", help="Where generated data goes.")
    p.add_argument("--image_sizes", default="64,224")
    p.add_argument("--batch_size", type=int, default=128)
    p.add_argument("--seconds", type=float, default=10.0, help="Timed seconds per measurement (after warmup).")
    p.add_argument("--warmup_batches", type=int, default=5)
    p.add_argument("--deterministic", action="store_true", help="Measure tfgpu with --deterministic_input "
                   "(exact resume order); default off, the throughput setting.")
    p.add_argument("--output", default="", help="Write the results as JSON here.")
    o = p.parse_args(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf

    from tfgpu.data import convert, tfrecord

    data_dir = o.data_dir
    if not data_dir:
        src, data_dir = os.path.join(o.work_dir, f"jpegs-{o.make_jpegs}"), os.path.join(o.work_dir, "tfr")
        if not os.path.isdir(src):
            print(f"generating {o.make_jpegs} JPEGs in {src}", file=sys.stderr)
            make_jpeg_folder(src + ".partial", o.make_jpegs)
            os.rename(src + ".partial", src)
        convert.convert(convert.Options(source=src, output_dir=data_dir, image_format="keep", num_shards="16"))
    manifest = tfrecord.read_manifest(data_dir)
    files = [os.path.join(data_dir, s["file"]) for s in manifest["splits"]["train"]["shards"]]
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    shape = manifest["image_shape"]
    print(f"data: {data_dir}: {manifest['splits']['train']['num_examples']} train images, "
          f"{shape.get('height_mean')}x{shape.get('width_mean')} mean; {cores} usable cores; tf {tf.__version__}")
    rows = []
    for size in (int(s) for s in o.image_sizes.split(",")):
        one = single_thread_limit(files, size, o.seconds)
        limit = one * cores
        ours = _rate(tfgpu_pipeline(data_dir, size, o.batch_size, o.deterministic), o.batch_size, o.seconds,
                     o.warmup_batches)
        tfds_style = _rate(baseline(files, size, o.batch_size, True), o.batch_size, o.seconds, o.warmup_batches)
        naive = _rate(baseline(files, size, o.batch_size, False), o.batch_size, o.seconds, o.warmup_batches)
        rows.append({"image_size": size, "tfgpu": ours, "tfds_style": tfds_style, "naive": naive,
                     "single_thread": one, "decode_limit": limit, "cores": cores,
                     "tfgpu_vs_limit": ours / limit, "tfgpu_vs_tfds_style": ours / tfds_style})
    print("\n| crop | tfgpu (a) | tfds-style (b) | naive (b') | 1 thread | decode limit (c) | a/c | a/b |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['image_size']} | {r['tfgpu']:.0f} | {r['tfds_style']:.0f} | {r['naive']:.0f} | "
              f"{r['single_thread']:.0f} | {r['decode_limit']:.0f} ({r['cores']} x) | {r['tfgpu_vs_limit']:.2f} | "
              f"{r['tfgpu_vs_tfds_style']:.2f} |")
    if o.output:
        with open(o.output, "w") as f:
            json.dump({"command": " ".join(sys.argv), "rows": rows}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
