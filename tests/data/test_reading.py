"""Reading converted data for training: corrupt shards are named, can be skipped; tf.data service mode."""
import os
import shutil

import pytest

from tests.conftest import read_history

RUN = ["--model=small_cnn", "--global_batch_size=32", "--train_steps=6", "--steps_per_loop=3", "--verbose=2"]


@pytest.fixture
def digits_copy(run_train, data_cache, tmp_path):
    """A private copy of the converted digits, to damage."""
    run_train("--dataset=digits", *RUN[:1], "--train_steps=1", "--eval_split=none", f"--model_dir={tmp_path / 'w'}")
    source = os.path.join(data_cache, "digits-v1")
    target = tmp_path / "digits"
    shutil.copytree(source, target)
    return target


def _corrupt(path, offset_fraction=0.5):
    data = bytearray(path.read_bytes())
    data[int(len(data) * offset_fraction)] ^= 0xFF
    path.write_bytes(bytes(data))


def test_corrupt_shard_stops_the_run_naming_file_and_record(run_train, digits_copy, tmp_path):
    shard = digits_copy / "val-00001-of-00002.tfrecord"
    _corrupt(shard)
    proc = run_train(*RUN, f"--data_dir={digits_copy}", f"--model_dir={tmp_path / 'run'}", check=False)
    assert proc.returncode == 1, proc.output[-2000:]
    error = [line for line in proc.output.splitlines() if line.startswith("error: ")]
    assert error and "--data_dir" in error[0] and str(shard) in error[0] and "record " in error[0], error


def test_skip_corrupt_records_trains_and_counts_the_skipped(run_train, digits_copy, tmp_path):
    _corrupt(digits_copy / "val-00001-of-00002.tfrecord")
    model_dir = tmp_path / "run"
    run_train(*RUN, f"--data_dir={digits_copy}", "--skip_corrupt_records", f"--model_dir={model_dir}")
    last_eval = read_history(model_dir, "eval")[-1]
    assert last_eval["skipped_corrupt_records"] >= 1
    assert last_eval["val_examples"] + last_eval["skipped_corrupt_records"] == 359


def test_training_through_a_tf_data_service(run_train, tmp_path):
    import tensorflow as tf

    dispatcher = tf.data.experimental.service.DispatchServer()
    address = dispatcher.target.split("://")[1]
    worker = tf.data.experimental.service.WorkerServer(  # noqa: F841  (serves until the test ends)
        tf.data.experimental.service.WorkerConfig(dispatcher_address=address))
    model_dir = tmp_path / "run"
    run_train("--dataset=digits", *RUN, f"--data_service={dispatcher.target}", "--eval_split=none",
              f"--model_dir={model_dir}")
    history = read_history(model_dir)
    assert [r["step"] for r in history] == [3, 6]


def test_training_on_a_tfds_dataset_prepared_locally(run_train, tfds_dir, tmp_path):
    """--dataset=tfds:NAME reads a prepared TFDS dir offline, converts it once into the cache, and trains."""
    model_dir = tmp_path / "run"
    proc = run_train("--dataset=tfds:tfgpu_tiny_shapes", f"--tfds_data_dir={tfds_dir}", "--model=small_cnn",
                     "--global_batch_size=8", "--train_steps=4", "--steps_per_loop=2", f"--model_dir={model_dir}")
    assert "data: tfgpu_tiny_shapes (12, 10, 3)" in proc.output or "(12, 10, 3)" in proc.output, proc.output[-2000:]
    assert [r["step"] for r in read_history(model_dir)] == [2, 4]
    missing = run_train("--dataset=tfds:tfgpu_not_prepared_anywhere", f"--tfds_data_dir={tmp_path}",
                        f"--model_dir={tmp_path / 'x'}", check=False)
    assert missing.returncode == 1 and "error: --" in missing.output
