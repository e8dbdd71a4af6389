"""Reading converted data for training: corrupt shards are named, can be skipped; tf.data service mode.

Every run is ``tfgpu.train.main`` in this process (``train_here``): one device, nothing process-wide."""
import re
import shutil

import pytest

from tests.conftest import read_history, read_metrics

RUN = ["--model=small_cnn", "--global_batch_size=32", "--train_steps=6", "--steps_per_loop=3", "--verbose=2"]


@pytest.fixture
def digits_copy(data_cache, tmp_path):
    """A private copy of the converted digits, to damage."""
    from tfgpu.config import Config
    from tfgpu.data import catalog

    info = catalog.prepare(Config(model_dir=str(tmp_path / "unused"), dataset="digits", data_cache_dir=data_cache))
    target = tmp_path / "digits"
    shutil.copytree(info.directory, target)
    return target


def _corrupt(path, offset_fraction=0.5):
    data = bytearray(path.read_bytes())
    data[int(len(data) * offset_fraction)] ^= 0xFF
    path.write_bytes(bytes(data))


def test_corrupt_shard_stops_the_run_naming_file_and_record(train_here, digits_copy, tmp_path):
    shard = digits_copy / "val-00001-of-00002.tfrecord"
    _corrupt(shard)
    proc = train_here(*RUN, f"--data_dir={digits_copy}", f"--model_dir={tmp_path / 'run'}", check=False)
    assert proc.returncode == 1, proc.output[-2000:]
    error = [line for line in proc.output.splitlines() if line.startswith("error: ")]
    assert error and "--data_dir" in error[0] and str(shard) in error[0] and "record " in error[0], error


def test_skip_corrupt_records_trains_and_counts_the_skipped(train_here, digits_copy, tmp_path):
    """One flipped byte costs one record (it used to cost the rest of its shard), named once in the log and
    counted in metrics.json."""
    shard = digits_copy / "val-00001-of-00002.tfrecord"
    _corrupt(shard)
    model_dir = tmp_path / "run"
    proc = train_here(*RUN, f"--data_dir={digits_copy}", "--skip_corrupt_records", f"--model_dir={model_dir}")
    last_eval = read_history(model_dir, "eval")[-1]
    assert last_eval["skipped_corrupt_records"] == 1
    assert last_eval["val_examples"] == 358
    assert read_metrics(model_dir)["skipped_records"] == {"train": 0, "val": 1}
    assert proc.output.count(f"unreadable record(s) of {shard}") == 1


def test_one_based_labels_stop_the_run_in_one_line_naming_the_record(train_here, tmp_path):
    """Labels 1..10 in a 10-class dataset (the Model Garden ImageNet convention) used to train label 10 as an
    all-zero target."""
    import numpy as np

    from tfgpu.data.schema import tfrecord

    labels = np.arange(40) % 10 + 1
    entry = tfrecord.write_arrays(str(tmp_path / "d"), "train", np.zeros((40, 8, 8, 1), np.uint8), labels, 1)
    tfrecord.write_manifest(str(tmp_path / "d"), {"name": "one-based", "classes": [str(c) for c in range(10)],
                                                  "splits": {"train": entry}, "compression": "none",
                                                  "image_shape": {"height": 8, "width": 8, "channels": 1}})
    proc = train_here("--model=small_cnn", "--global_batch_size=8", "--train_steps=2", f"--data_dir={tmp_path / 'd'}",
                      f"--model_dir={tmp_path / 'run'}", "--shuffle_buffer=1", check=False)
    errors = [line for line in proc.output.splitlines() if line.startswith("error: ")]
    assert proc.returncode == 1 and "Traceback" not in proc.output, proc.output[-2000:]
    named = re.search(r"d/train-00000-of-00001.tfrecord: record (\d+) has label 10, outside \[0, 10\)", errors[0])
    assert len(errors) == 1 and named and int(named[1]) % 10 == 9, errors  # records 9, 19, ... have label 10


# Slow: a whole run through a tf.data service (18 s loaded); exactly-once through two service workers stays in
# tests/data/test_exactly_once.py.
@pytest.mark.slow
def test_training_through_a_tf_data_service(train_here, tmp_path):
    import tensorflow as tf

    dispatcher = tf.data.experimental.service.DispatchServer()
    address = dispatcher.target.split("://")[1]
    worker = tf.data.experimental.service.WorkerServer(  # noqa: F841  (serves until the test ends)
        tf.data.experimental.service.WorkerConfig(dispatcher_address=address))
    model_dir = tmp_path / "run"
    train_here("--dataset=digits", *RUN, f"--data_service={dispatcher.target}", "--eval_split=none",
              f"--model_dir={model_dir}")
    history = read_history(model_dir)
    assert [r["step"] for r in history] == [3, 6]


def test_training_on_a_tfds_dataset_prepared_locally(train_here, tfds_dir, tmp_path):
    """--dataset=tfds:NAME reads a prepared TFDS dir offline, converts it once into the cache, and trains."""
    model_dir = tmp_path / "run"
    proc = train_here("--dataset=tfds:tfgpu_tiny_shapes", f"--tfds_data_dir={tfds_dir}", "--model=small_cnn",
                     "--global_batch_size=8", "--train_steps=4", "--steps_per_loop=2", f"--model_dir={model_dir}")
    assert "data: tfgpu_tiny_shapes (12, 10, 3)" in proc.output or "(12, 10, 3)" in proc.output, proc.output[-2000:]
    assert [r["step"] for r in read_history(model_dir)] == [2, 4]
    missing = train_here("--dataset=tfds:tfgpu_not_prepared_anywhere", f"--tfds_data_dir={tmp_path}",
                        f"--model_dir={tmp_path / 'x'}", check=False)
    assert missing.returncode == 1 and "error: --" in missing.output
