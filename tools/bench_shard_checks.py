"""What the shard checks (tfgpu.data.schema.shards) cost: ``python tools/bench_shard_checks.py WORK_DIR``.

Times ``prepare`` on the built-in digits (first use of the checks, then cached; the digits are converted into
WORK_DIR/cache first if needed) and ``shards.scan`` on two generated shards in WORK_DIR (100 MB of 1,000 records;
100,000 records of 200 bytes), each read once beforehand so the page cache holds it: the CPU's share, not the
disk's.
"""
import os
import shutil
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from tfgpu.config import Config  # noqa: E402
from tfgpu.data import catalog
from tfgpu.data.schema import shards  # noqa: E402


def shard(path: str, records: int, record_bytes: int) -> str:
    if not os.path.exists(path):
        rng = np.random.default_rng(0)
        with tf.io.TFRecordWriter(path) as writer:
            for _ in range(records):
                writer.write(rng.bytes(record_bytes))
    with open(path, "rb") as f:
        while f.read(1 << 24):
            pass
    return path


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main(work: str) -> None:
    config = Config(model_dir="unused", dataset="digits", data_cache_dir=os.path.join(work, "cache"))
    catalog.prepare(config)  # converted, if it was not
    shutil.rmtree(os.path.join(work, "cache", "verified"), ignore_errors=True)
    print(f"digits prepare: first {timed(lambda: catalog.prepare(config)):.4f} s, "
          f"cached {timed(lambda: catalog.prepare(config)):.4f} s")
    big = shard(os.path.join(work, "big.tfrecord"), 1000, 100_000)
    size = os.path.getsize(big) / 1e6
    for name, checks in (("length headers", {}), ("length headers + sha256", {"sha256": True}),
                         ("length headers + every record's checksum", {"data": True})):
        seconds = timed(lambda: shards.scan(big, "none", **{"sha256": False, "data": False, **checks}))
        print(f"{size:.0f} MB shard, 1,000 records, {name}: {seconds:.3f} s ({size / seconds:.0f} MB/s)")
    small = shard(os.path.join(work, "small.tfrecord"), 100_000, 200)
    seconds = timed(lambda: shards.scan(small, "none", sha256=False, data=False))
    print(f"100,000 records of 200 bytes, length headers: {seconds:.3f} s ({seconds / 1e5 * 1e6:.1f} us a record)")


if __name__ == "__main__":
    main(sys.argv[1])
