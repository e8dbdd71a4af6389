"""Writing shards: one task per shard, in this process or in worker processes, with progress.

A task's shard is written atomically (``tfrecord.write_shard``), then a sidecar in
``<out>/.tfgpu-convert/`` records its sha256, the plan it was built from and its
statistics; ``verified_shard`` is what lets a rerun reuse it. Worker processes end
with the converter: each watches its parent and exits when it is gone (a SIGKILLed
parent runs no cleanup), so no orphan goes on writing.

Importing this module does not import TensorFlow (workers do, when they start).
"""
import concurrent.futures
from concurrent.futures.process import BrokenProcessPool
import contextlib
import json
import multiprocessing
import os
import sys
import threading
import time

from tfgpu.data.conversion import outdir
from tfgpu.runtime import fileio
from tfgpu.runtime import progress as progress_lib
from tfgpu.runtime.fileio import atomic_write_bytes


class WorkerDiedError(RuntimeError):
    """A worker process ended abruptly (killed, out of memory) while writing shards."""


def exit_with_parent(parent_pid: int, interval: float = 0.5) -> threading.Thread:
    """Starts a daemon thread that ends this process as soon as ``parent_pid`` is no longer its parent."""

    def watch():
        while os.getppid() == parent_pid:
            time.sleep(interval)
        os._exit(1)

    thread = threading.Thread(target=watch, name="tfgpu-parent-watch", daemon=True)
    thread.start()
    return thread


class _LocalCounter:
    """In-process stand-in for the shared multiprocessing counter; reports progress as it counts."""

    def __init__(self, on_change=None):
        self.value = 0
        self.on_change = on_change

    def add(self, k):
        self.value += k
        if self.on_change:
            self.on_change(self.value)


class _SharedCounter:
    def __init__(self, value):
        self.shared = value

    def add(self, k):
        with self.shared.get_lock():
            self.shared.value += k


_COUNTER = _LocalCounter()


def _init_worker(shared_value, parent_pid):
    global _COUNTER
    exit_with_parent(parent_pid)
    _COUNTER = _SharedCounter(shared_value)
    import tensorflow as tf

    # One process per core: keep each worker's TensorFlow ops single-threaded.
    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)


def build_shard(task: dict) -> dict:
    """Writes one shard (atomically, to ``task["write_path"]``) and its sidecar; returns the sidecar content
    (plus ``staged``: whether the shard waits under its staged name)."""
    from tfgpu.data.conversion import encode
    from tfgpu.data.schema import tfrecord

    stats = encode.Stats()
    enc = task["encoding"]

    def records():
        pending = 0
        for name, label, data, origin in task["payload"].examples():
            try:
                record, shape, adjusted = encode.example_to_record(name, label, data, enc, origin)
            except encode.BadImageError as e:
                if not enc.skip_bad:
                    raise
                stats.skipped.append({"path": e.path, "reason": e.reason})
            else:
                stats.add(label, shape, adjusted)
                yield record
            pending += 1
            if pending == 16:
                _COUNTER.add(pending)
                pending = 0
        _COUNTER.add(pending)

    fileio.remove(task["sidecar"], missing_ok=True)
    entry = tfrecord.write_shard(task["write_path"], records(), task["compression"])
    entry["file"] = os.path.basename(task["path"])
    outdir.make_readable(task["write_path"])
    result = {"plan": task["plan"], "entry": entry, "stats": stats.to_json()}
    atomic_write_bytes(task["sidecar"], json.dumps(result, sort_keys=True).encode())
    return {**result, "staged": task["write_path"] != task["path"]}


def verified_shard(task: dict):
    """The sidecar of a shard already built from this plan whose file (in place, or staged) still matches its
    sha256, else None."""
    from tfgpu.data.schema import tfrecord

    try:
        done = json.loads(fileio.read_bytes(task["sidecar"]))
        if done.get("plan") != task["plan"]:
            return None
        if done["stats"]["skipped"] and not task["encoding"].skip_bad:
            return None  # rebuild it, so the bad image stops this run as it should without --skip_bad
        for path, staged in ((task["path"], False), (outdir.staged_path(task["path"]), True)):
            if fileio.exists(path) and tfrecord.sha256_file(path) == done["entry"]["sha256"]:
                return {**done, "staged": staged}
        return None
    except (OSError, ValueError, KeyError, TypeError):
        return None


def conversion_progress(total: int, stream=None) -> progress_lib.Progress:
    """The converter's progress (``runtime.progress``, as training's): images done as a bar on a terminal, else a
    line with images per second and the ETA every 10 s and at the end (``close``)."""
    return progress_lib.Progress(total, stream or sys.stderr, label="convert: images ", unit="image",
                                 interval=10.0, rate=True)


def run_in_process(tasks, progress):
    global _COUNTER
    _COUNTER = _LocalCounter(progress.update)
    try:
        return [build_shard(t) for t in tasks]
    finally:
        _COUNTER = _LocalCounter()


def run_in_pool(tasks, workers, progress, directory):
    ctx = multiprocessing.get_context("spawn")  # TensorFlow is not fork-safe
    shared = ctx.Value("q", 0)
    saved = os.environ.get("TF_CPP_MIN_LOG_LEVEL")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    try:
        pool = concurrent.futures.ProcessPoolExecutor(workers, mp_context=ctx, initializer=_init_worker,
                                                      initargs=(shared, os.getpid()))
        futures = [pool.submit(build_shard, t) for t in tasks]
    finally:
        if saved is None:
            os.environ.pop("TF_CPP_MIN_LOG_LEVEL", None)
    try:
        while True:
            done, pending = concurrent.futures.wait(futures, timeout=0.2,
                                                    return_when=concurrent.futures.FIRST_EXCEPTION)
            progress.update(shared.value)
            for f in done:
                if f.exception() is not None:
                    raise f.exception()
            if not pending:
                break
        progress.update(shared.value)
        pool.shutdown()
        return [f.result() for f in futures]
    except BrokenProcessPool:
        _stop(pool, directory)
        raise WorkerDiedError("a worker process died while writing shards (killed, or out of memory?); the "
                              "shards it finished are kept: rerun the same command to finish") from None
    except BaseException:
        _stop(pool, directory)
        raise


def _stop(pool, directory):
    """Stops the workers now (their half-written shards are temp files, removed here) rather than letting them
    finish their shards."""
    for process in list((getattr(pool, "_processes", None) or {}).values()):
        with contextlib.suppress(Exception):
            process.terminate()
    pool.shutdown(wait=True, cancel_futures=True)
    outdir.remove_temp_files(directory)
