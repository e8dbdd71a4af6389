"""tfgpu.fit: the same run as python -m tfgpu.train on the same data converted, options checked as flags are, one
clear error for wrong data or a wrong model before training, resume without writing the data again, and a cheap
``import tfgpu``. The example script and the multi-worker run are in tests/examples/test_fit_dataset.py."""
import json
import logging
import os
import signal
import subprocess
import sys

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfgpu
from tests.conftest import checkpoint_weights, read_history, read_metrics
from tfgpu.data import builtin, tfrecord
from tfgpu.training import fit as fit_lib
from tfgpu.training import run_dir

TIMING = ("examples_per_sec", "eval_time_s", "wall_time_s")
SMALL = dict(global_batch_size=32, steps_per_loop=1, checkpoint_every_steps=1, verbose=0, seed=7)


@pytest.fixture(scope="module")
def digits():
    """256 train and 64 val digits (uint8 8x8x1, int64 labels)."""
    splits = builtin.load_builtin("digits")["splits"]
    (xt, yt), (xv, yv) = splits["train"], splits["val"]
    return (xt[:256], yt[:256]), (xv[:64], yv[:64])


def _ds(arrays):
    return tf.data.Dataset.from_tensor_slices(arrays)


def build_model():
    inputs = keras.Input((8, 8, 1))
    x = keras.layers.Conv2D(4, 3, activation="relu")(inputs)
    x = keras.layers.BatchNormalization()(keras.layers.Flatten()(x))
    return keras.Model(inputs, keras.layers.Dense(10)(x))


@pytest.fixture
def run_state(monkeypatch):
    """Restores what a run in this process changes for the next test: tfgpu's logger, the dtype policy, Keras's
    session and (after deterministic=True) TensorFlow's op determinism. Runs write no report.md (its plots take
    seconds; the report has tests of its own)."""
    from tensorflow.python.framework import config as tf_config

    from tfgpu.training import experiment

    monkeypatch.setattr(experiment, "_write_report", lambda model_dir: None)
    logger = logging.getLogger("tfgpu")
    saved = logger.handlers[:], logger.level, logger.propagate
    yield
    logger.handlers[:], logger.level, logger.propagate = saved
    keras.mixed_precision.set_global_policy("float32")
    keras.backend.clear_session(free_memory=False)
    tf_config.disable_op_determinism()


def test_fit_on_a_dataset_equals_train_on_the_same_data_converted(digits, tmp_path, run_state, capsys):
    """Same seed, deterministic=True: tfgpu.fit on tf.data Datasets and tfgpu.train's main on the directory the
    built-in datasets' writer (tfrecord.write_arrays) makes from the same arrays end with identical checkpoints
    and metrics."""
    from tfgpu import train

    (xt, yt), (xv, yv) = digits
    options = dict(SMALL, train_steps=3, deterministic=True, input_range="0,255")  # fit's model sees the pixels
    fitted = tfgpu.fit(build_model, _ds((xt, yt)), eval_data=_ds((xv, yv)), model_dir=str(tmp_path / "fit"),
                       **options).results
    converted = str(tmp_path / "converted")
    splits = {split: tfrecord.write_arrays(converted, split, x, y, num_shards=1)
              for split, (x, y) in (("train", (xt, yt)), ("val", (xv, yv)))}
    tfrecord.write_manifest(converted, {"name": "digits", "classes": [str(c) for c in range(10)], "splits": splits,
                                        "compression": "none",
                                        "image_shape": {"height": 8, "width": 8, "channels": 1}})
    flags = [f"--{k}={v}" for k, v in options.items()]
    assert train.main(flags + [f"--model={fit_lib.register(build_model)}", f"--data_dir={converted}",
                               f"--model_dir={tmp_path / 'train'}"]) == 0
    trained = read_metrics(tmp_path / "train")
    assert fitted == read_metrics(tmp_path / "fit")
    assert {k: v for k, v in fitted.items() if k not in TIMING} == {k: v for k, v in trained.items()
                                                                    if k not in TIMING}
    assert fitted["step"] == 3 and fitted["val_examples"] == 64
    a, b = checkpoint_weights(tmp_path / "fit"), checkpoint_weights(tmp_path / "train")
    assert a.keys() == b.keys() and len(a) > 5
    for name in a:
        np.testing.assert_array_equal(a[name], b[name], err_msg=name)


@pytest.mark.parametrize("options, flag, message", [
    (dict(global_batch_sise=64), "global_batch_sise", "unknown argument (did you mean global_batch_size"),
    (dict(global_batch_size="many"), "global_batch_size", "expected int, got 'many'"),
    (dict(global_batch_size=0), "global_batch_size", "must be positive"),
    (dict(precision="fp8"), "precision", "'fp8' is not one of float32"),
    (dict(input_range=(1, 0)), "input_range", "MIN < MAX"),
    (dict(data_dir="/data"), "data_dir", "pass the directory as x"),
    (dict(eval_split="test"), "eval_split", "written as split 'val'"),
    (dict(sync_batch_norm=True), "sync_batch_norm", "synchronized=True"),
    (dict(task="gan"), "task", "trains classifiers"),
])
def test_a_bad_option_is_a_config_error_naming_it_before_anything_is_written(options, flag, message, digits,
                                                                              tmp_path):
    with pytest.raises(tfgpu.ConfigError) as e:
        tfgpu.fit(build_model, _ds(digits[0]), model_dir=str(tmp_path / "run"), **options)
    assert e.value.flag == flag and str(e.value).startswith(f"tfgpu.fit: {flag}: ") and message in str(e.value)
    assert not os.path.exists(tmp_path / "run")


def test_wrong_data_is_one_error_before_training(digits, tmp_path):
    (xt, yt), (xv, yv) = digits
    cases = [
        (dict(train_data=_ds((xt, yt)).batch(8).batch(2)), "train_data", "look batched"),
        (dict(train_data=_ds(xt)), "train_data", "no label"),
        (dict(train_data=_ds((xt.astype("int32"), yt))), "train_data", "uint8 or float pixels in [0, 255]"),
        (dict(train_data=(xt, yt)), "train_data", "pass x and y as two arguments"),
        (dict(train_data=_ds((xt, yt)), eval_data=_ds((np.repeat(xv, 3, -1), yv))), "eval_data", "3 channels"),
        (dict(train_data=_ds((xt, yt)), eval_data=str(tmp_path)), "eval_data", "must be (x_val, y_val) arrays or a tf.data.Dataset"),
        (dict(train_data=str(tmp_path / "converted"), eval_data=_ds((xv, yv))), "eval_data", "eval split"),
        (dict(train_data=str(tmp_path / "converted")), "train_data", "no dataset.json in it"),
        (dict(train_data="s3://bucket/converted"), "train_data", "has no s3:// file system"),
    ]
    for data, flag, message in cases:
        with pytest.raises(tfgpu.ConfigError) as e:
            tfgpu.fit(build_model, model_dir=str(tmp_path / "run"), **data)
        assert e.value.flag == flag and message in str(e.value), (data, str(e.value))
    assert not os.path.exists(tmp_path / "run")


def test_image_dataset_from_directory_output_trains_unchanged_with_its_class_names(digits, tmp_path, run_state,
                                                                                  capsys):
    """A folder of PNGs read by keras.utils.image_dataset_from_directory (batches of float32 pixels, one-hot
    labels, class_names) goes straight into tfgpu.fit: it trains, and the run's classes are the folder names."""
    from PIL import Image

    names = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]
    (xt, yt), _ = digits
    for i, (image, label) in enumerate(zip(xt, yt)):
        folder = tmp_path / "images" / names[label]
        folder.mkdir(parents=True, exist_ok=True)
        Image.fromarray(image[..., 0]).save(folder / f"{i}.png")
    train, val = keras.utils.image_dataset_from_directory(
        tmp_path / "images", label_mode="categorical", color_mode="grayscale", image_size=(8, 8), batch_size=16,
        validation_split=0.25, subset="both", seed=3, verbose=False)
    assert train.element_spec[0].shape.rank == 4 and train.element_spec[0].dtype == tf.float32
    metrics = tfgpu.fit(build_model, train, eval_data=val, model_dir=str(tmp_path / "run"),
                        **dict(SMALL, train_steps=60, checkpoint_every_steps=60)).results
    assert metrics["val_examples"] == 64 and metrics["val_accuracy"] > 0.7, metrics
    log = capsys.readouterr().err
    assert "x: elements are batches" in log and "float32 images: stored as uint8" in log
    manifest = tfrecord.read_manifest(str(tmp_path / "run" / "data"))
    assert manifest["classes"] == sorted(names) == train.class_names
    with open(tmp_path / "run" / "export" / "model.input.json") as f:
        assert json.load(f)["classes"] == train.class_names


def test_model_fn_is_built_in_the_scope_under_the_policy_and_checked_against_the_data(digits, tmp_path, run_state):
    seen = {}

    def three_classes():
        seen.update(policy=keras.mixed_precision.global_policy().name, in_scope=tf.distribute.has_strategy())
        inputs = keras.Input((8, 8, 1))
        return keras.Model(inputs, keras.layers.Dense(3)(keras.layers.Flatten()(inputs)))

    with pytest.raises(tfgpu.ConfigError, match="model: its model has 3 outputs, but the data has 10 classes"):
        tfgpu.fit(three_classes, _ds(digits[0]), model_dir=str(tmp_path), train_steps=1, precision="mixed_bfloat16",
                  **SMALL)
    assert seen == {"policy": "mixed_bfloat16", "in_scope": True}
    assert not os.path.exists(tmp_path / run_dir.CHECKPOINTS_DIR)
    with pytest.raises(tfgpu.ConfigError, match="model: returned str, not a keras.Model"):
        tfgpu.fit(lambda: "model", _ds(digits[0]), model_dir=str(tmp_path), train_steps=1, **SMALL)

    class Apply(keras.layers.Layer):  # a function as constructor argument: Keras cannot save it
        def __init__(self, function):
            super().__init__()
            self.function = function

        def call(self, x):
            return self.function(x)

    def unsaveable():
        inputs = keras.Input((8, 8, 1))
        return keras.Model(inputs, keras.layers.Dense(10)(keras.layers.Flatten()(Apply(lambda x: x * 2)(inputs))))

    with pytest.raises(tfgpu.ConfigError, match="model: .*unsaveable's model cannot be saved"):
        tfgpu.fit(unsaveable, _ds(digits[0]), model_dir=str(tmp_path), train_steps=1, **SMALL)


def test_fitting_again_resumes_without_writing_the_data_again(digits, tmp_path, run_state, capsys):
    """A second call with more train_steps continues from the checkpoint on the data written by the first (its
    fingerprint checked: a shuffled copy of the same examples matches); other data is refused."""
    (xt, yt), _ = digits
    tfgpu.fit(build_model, _ds((xt, yt)), model_dir=str(tmp_path), train_steps=1, **SMALL)
    shard = tmp_path / "data" / "train-00000-of-00001.tfrecord"
    written = shard.stat().st_mtime_ns
    metrics = tfgpu.fit(build_model, _ds((xt, yt)).shuffle(256), model_dir=str(tmp_path), train_steps=2,
                        **SMALL).results
    assert metrics["step"] == 2 and [r["step"] for r in read_history(tmp_path)] == [1, 2]
    assert shard.stat().st_mtime_ns == written
    assert capsys.readouterr().err.count("tfgpu.fit: writing 256 examples") == 1
    with pytest.raises(tfgpu.ConfigError, match="x: its content differs .*use a new model_dir"):
        tfgpu.fit(build_model, _ds((xt, (yt + 1) % 10)), model_dir=str(tmp_path), train_steps=3, **SMALL)


def test_a_sigterm_under_fit_raises_preempted_to_the_caller_after_the_checkpoint(digits, tmp_path, run_state,
                                                                                   monkeypatch):
    """A real SIGTERM mid-run under tfgpu.fit: the checkpoint is saved, then tfgpu.Preempted reaches the caller
    (before: SystemExit(143), which ended the user's Python process) with the caller's own SIGTERM handler back in
    place; calling fit again resumes from that checkpoint and trains each remaining step once."""
    from tfgpu.training import history

    write = history.History.write

    def sigterm_after_step_1(self, kind, step, values):
        write(self, kind, step, values)
        if kind == "train" and step == 1:
            os.kill(os.getpid(), signal.SIGTERM)  # the trainer's handler: save at the end of this loop, stop

    (xt, yt), _ = digits
    options = dict(SMALL, checkpoint_every_steps=0)  # the preemption's checkpoint is the only one
    monkeypatch.setattr(history.History, "write", sigterm_after_step_1)
    callers_handler = signal.getsignal(signal.SIGTERM)
    with pytest.raises(tfgpu.Preempted) as stopped:
        tfgpu.fit(build_model, _ds((xt, yt)), model_dir=str(tmp_path), train_steps=3, **options)
    monkeypatch.setattr(history.History, "write", write)
    assert signal.getsignal(signal.SIGTERM) is callers_handler
    saved = tf.train.latest_checkpoint(run_dir.checkpoints(tmp_path))
    assert stopped.value.step == 1 and stopped.value.checkpoint == saved
    assert saved.endswith(run_dir.CHECKPOINT_PREFIX + "1")
    assert "checkpoint saved at step 1" in str(stopped.value) and not (tmp_path / "metrics.json").exists()
    metrics = tfgpu.fit(build_model, _ds((xt, yt)), model_dir=str(tmp_path), train_steps=3, **options).results
    assert metrics["step"] == 3 and [r["step"] for r in read_history(tmp_path)] == [1, 2, 3]


def test_a_ctrl_c_under_fit_saves_then_raises_a_keyboard_interrupt_that_is_a_preemption(digits, tmp_path, run_state,
                                                                                         monkeypatch):
    """A real SIGINT mid-run under tfgpu.fit: the step's checkpoint is saved, then the caller gets what Ctrl-C gives
    in Python, a KeyboardInterrupt, which is also a tfgpu.Preempted naming the checkpoint; the caller's own SIGINT
    handler is back; calling fit again resumes there."""
    from tfgpu.training import history

    write = history.History.write

    def sigint_after_step_1(self, kind, step, values):
        write(self, kind, step, values)
        if kind == "train" and step == 1:
            os.kill(os.getpid(), signal.SIGINT)

    (xt, yt), _ = digits
    options = dict(SMALL, checkpoint_every_steps=0)
    monkeypatch.setattr(history.History, "write", sigint_after_step_1)
    callers_handler = signal.getsignal(signal.SIGINT)
    with pytest.raises(KeyboardInterrupt) as stopped:
        tfgpu.fit(build_model, _ds((xt, yt)), model_dir=str(tmp_path), train_steps=3, **options)
    monkeypatch.setattr(history.History, "write", write)
    assert signal.getsignal(signal.SIGINT) is callers_handler
    assert isinstance(stopped.value, tfgpu.Preempted) and stopped.value.step == 1
    assert stopped.value.checkpoint.endswith(run_dir.CHECKPOINT_PREFIX + "1")
    assert "interrupted by SIGINT (Ctrl-C)" in str(stopped.value)
    metrics = tfgpu.fit(build_model, _ds((xt, yt)), model_dir=str(tmp_path), train_steps=3, **options).results
    assert metrics["step"] == 3 and [r["step"] for r in read_history(tmp_path)] == [1, 2, 3]


@pytest.mark.slow
def test_fit_with_model_dir_on_ram_writes_reuses_and_resumes_there(digits, tmp_path, run_state, monkeypatch, capsys):
    """model_dir on a TensorFlow file system (ram://, standing in for gs://): the Dataset is written into
    <model_dir>/data there once, a second call resumes on it without writing it again, and that directory serves
    as train_data of another run; nothing lands on the local disk (a "ram://" path written through os would
    appear in the working directory as ./ram:)."""
    import uuid

    from tfgpu.runtime import fileio

    monkeypatch.chdir(tmp_path)
    (xt, yt), _ = digits
    root = f"ram://tfgpu-test-{uuid.uuid4().hex[:8]}"
    try:
        tfgpu.fit(build_model, _ds((xt[:64], yt[:64])), model_dir=f"{root}/a", train_steps=1, **SMALL)
        metrics = tfgpu.fit(build_model, _ds((xt[:64], yt[:64])), model_dir=f"{root}/a", train_steps=2,
                            **SMALL).results
        assert metrics["step"] == 2 and capsys.readouterr().err.count("tfgpu.fit: writing 64 examples") == 1
        assert fileio.exists(f"{root}/a/data/dataset.json") and fileio.exists(f"{root}/a/checkpoints")
        again = tfgpu.fit(build_model, f"{root}/a/data", model_dir=f"{root}/b", train_steps=1, **SMALL).results
        assert again["step"] == 1 and fileio.exists(f"{root}/b/metrics.json")
        assert os.listdir(tmp_path) == []
    finally:
        fileio.rmtree(root)


def test_import_tfgpu_stays_cheap_and_keras_fit_stays_reachable():
    code = ("import sys, tfgpu; tfgpu.ConfigError; tfgpu.fit; "
            "assert 'tensorflow' not in sys.modules and 'keras' not in sys.modules, 'TensorFlow imported'")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
    from tfgpu.training import keras_fit

    assert tfgpu.keras_fit is keras_fit and tfgpu.fit is fit_lib.fit
    assert tfgpu.ConfigError is fit_lib.ConfigError and issubclass(fit_lib.FitError, tfgpu.ConfigError)


def test_two_calls_on_several_replicas_in_one_process_each_all_reduce_their_own_model(digits, tmp_path, run_state,
                                                                                      capsys):
    """A second fit on 2 replicas in the same process, of another model, trains: TensorFlow keeps the last run's
    collective shapes by key, so fit starts its runtime afresh after a run that all-reduced (else "Shape mismatch in
    the collective instance")."""
    (x, y), _ = digits

    def model(width):
        keras.utils.set_random_seed(1)
        built = keras.Sequential([keras.Input((8, 8, 1)), keras.layers.Flatten(), keras.layers.Dense(width),
                                  keras.layers.Dense(10)])
        built.compile(optimizer="sgd", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        return built

    for width in (8, 4):
        history = tfgpu.fit(model(width), x[:64], y[:64], batch_size=32, epochs=1, verbose=0, steps_per_loop=2,
                            tensorboard=False, model_dir=str(tmp_path / f"w{width}"), cpu_logical_devices=2,
                            distribution_strategy="mirrored")
        assert history.results["num_replicas"] == 2 and np.isfinite(history.history["loss"][0])
    assert "the last run in this process all-reduced over several replicas" in capsys.readouterr().err
