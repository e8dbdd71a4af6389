"""training/fit/records: a ``tfgpu.data.load`` Dataset given to ``tfgpu.fit`` trains on ``model.fit``'s batches on one
device; read by index, every record comes once per epoch on any number of workers and replicas, and a run resumed
at any step on another topology trains on the global batches of the run it continues (properties over workers x
replicas x batch x resume step; workers simulated in-process by their replica ids, as the pipeline's own tests
simulate input pipelines by their ids)."""
import dataclasses
import os
import signal

import keras
import numpy as np
import pytest
import tensorflow as tf
from hypothesis import given, settings, strategies as st

import tfgpu
from tfgpu.config import ConfigError
from tfgpu.data.conversion import convert
from tfgpu.data.input import loader
from tfgpu.training.fit import arrays, inputs, records
from tests.training.fit import helpers


@pytest.fixture(scope="module")
def digits_dir(tmp_path_factory):
    """sklearn's digits converted by tfgpu's converter into 2 shards a split: train 1,438, val 359."""
    directory = str(tmp_path_factory.mktemp("digits"))
    convert.convert(convert.Options(source="digits", output_dir=directory, num_shards="2"))
    return directory


def _model():
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((8, 8, 1)), keras.layers.Rescaling(1 / 255), keras.layers.Flatten(),
                              keras.layers.Dense(16, activation="relu"), keras.layers.Dense(10)])
    model.compile(keras.optimizers.SGD(0.1), keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    return model


def _assert_same_weights(a, b):
    for x, y in zip(a.get_weights(), b.get_weights()):
        np.testing.assert_array_equal(x, y)


def test_tfgpu_fit_trains_on_the_batches_model_fit_draws_from_the_same_dataset(digits_dir, tmp_path):
    keras_model, tfgpu_model = _model(), _model()
    keras_history = keras_model.fit(loader.load(digits_dir, batch_size=100), epochs=2, verbose=0)
    history = tfgpu.fit(tfgpu_model, loader.load(digits_dir, batch_size=100), epochs=2, verbose=0,
                        model_dir=str(tmp_path / "run"))
    _assert_same_weights(keras_model, tfgpu_model)
    assert history.history["loss"] == keras_history.history["loss"]
    assert history.history["loss"][1] < history.history["loss"][0]


class _SigtermAt(keras.callbacks.Callback):
    """Sends this process SIGTERM after batch ``batch`` of epoch ``epoch``: tfgpu.fit saves there and raises."""

    def __init__(self, epoch, batch):
        super().__init__()
        self.at, self.epoch = (epoch, batch), None

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_end(self, batch, logs=None):
        if (self.epoch, batch) == self.at:
            os.kill(os.getpid(), signal.SIGTERM)


def test_a_run_stopped_inside_an_epoch_resumes_to_the_uninterrupted_weights(digits_dir, tmp_path):
    whole = _model()
    tfgpu.fit(whole, loader.load(digits_dir, batch_size=128, seed=7), epochs=2, verbose=0,
              model_dir=str(tmp_path / "whole"))
    with pytest.raises(tfgpu.Preempted):
        tfgpu.fit(_model(), loader.load(digits_dir, batch_size=128, seed=7), epochs=2, verbose=0,
                  model_dir=str(tmp_path / "split"), steps_per_loop=1, callbacks=[_SigtermAt(0, 4)])
    resumed = _model()
    tfgpu.fit(resumed, loader.load(digits_dir, batch_size=128, seed=7), epochs=2, verbose=0,
              model_dir=str(tmp_path / "split"))
    assert int(resumed.optimizer.iterations.numpy()) == 2 * 12
    _assert_same_weights(whole, resumed)


def _global_batches(data, epoch, workers, local, first_step):
    """{step: the keys of its global batch}, gathered from every simulated worker's pipeline (its parts, replica by
    replica), with every part's size."""
    replicas = workers * local
    batches, sizes = {}, {}
    for worker in range(workers):
        parts = data.parts(epoch, first_step, replicas, range(worker * local, (worker + 1) * local))
        for j, (keys, _) in enumerate(parts.as_numpy_iterator()):
            step = first_step + j // local
            batches.setdefault(step, []).extend(keys.tolist())
            sizes.setdefault(step, []).append(len(keys))
    return batches, sizes


@pytest.fixture(scope="module")
def val_records(digits_dir):
    """The val split's Records, its images held: each property example reads them in its own order and batches."""
    return loader.records_of(loader.load(digits_dir, "val", shuffle=True))


def _property(val_records, batch, before, after, local, seed, epoch, held, data):
    base = val_records
    chosen = loader.Records(base.info, dataclasses.replace(base.config, seed=seed), batch, held=base.held())
    chosen.in_memory = held  # False: every global batch read from the shards, then cut in the graph
    data_input = records.RecordsInput(chosen)
    order = data_input.records.epoch_keys(epoch)
    steps = arrays.num_steps(len(order), batch)
    k = data.draw(st.integers(0, steps))
    whole, sizes = _global_batches(data_input, epoch, before, local, 0)
    assert sorted(whole) == list(range(steps))
    for step, keys in whole.items():  # each step's parts are the loader's global batch, cut nearly evenly
        assert sorted(keys) == sorted(order[step * batch:(step + 1) * batch].tolist())
        assert max(sizes[step]) - min(sizes[step]) <= 1 and len(sizes[step]) == before * local
    resumed, _ = _global_batches(data_input, epoch, after, local, k)
    assert {s: sorted(b) for s, b in resumed.items()} == {s: sorted(b) for s, b in whole.items() if s >= k}
    trained = [key for s in range(k) for key in whole[s]] + [key for b in resumed.values() for key in b]
    assert sorted(trained) == sorted(order.tolist()) and len(set(trained)) == 359  # every record once


SHAPES = dict(batch=st.integers(24, 200), before=st.integers(1, 3), after=st.integers(1, 3), local=st.integers(1, 2),
              seed=st.integers(0, 2**20), epoch=st.integers(0, 3), held=st.booleans(), data=st.data())


@settings(max_examples=4, deadline=None)
@given(**SHAPES)
def test_every_record_once_per_epoch_and_the_same_global_batches_on_resume_on_another_topology(val_records, **shape):
    _property(val_records, **shape)


@pytest.mark.slow  # the same property over many more shapes: 60 took 434 s on 2 cores at load 7-9
@settings(max_examples=30, deadline=None)
@given(**SHAPES)
def test_every_record_once_per_epoch_and_the_same_global_batches_many_shapes(val_records, **shape):
    _property(val_records, **shape)


def test_part_bounds_are_the_arrays_replica_bounds():
    for n in range(0, 12):
        for replicas in range(1, 5):
            expected = arrays.replica_bounds(n, replicas)
            for first in range(replicas):
                ids = range(first, replicas)
                np.testing.assert_array_equal(records.part_bounds(tf.constant(n), replicas, ids).numpy(),
                                              expected[first:])


def test_each_workers_parts_are_the_records_of_their_keys(digits_dir):
    """Two workers of one replica each: worker 1's parts are the second halves of the loader's batches."""
    dataset = loader.load(digits_dir, "val", batch_size=100, shuffle=True, seed=1)
    data_input = inputs.make(dataset)
    assert isinstance(data_input, records.RecordsInput)
    whole = list(dataset)  # the loader's epoch 0
    parts = list(data_input.epoch_dataset(0, 1, num_replicas=2, replica_ids=[1]))
    assert len(parts) == 3
    for (images, labels), (all_images, all_labels) in zip(parts, whole[1:]):
        half = (len(all_labels) + 1) // 2
        np.testing.assert_array_equal(images, all_images[half:])
        np.testing.assert_array_equal(labels, all_labels[half:])


@pytest.mark.parametrize("argument", ["y", "batch_size", "sample_weight", "class_weight"])
def test_what_the_dataset_holds_is_not_given_again(digits_dir, argument):
    value = {"y": np.zeros(3), "batch_size": 32, "sample_weight": np.ones(3), "class_weight": {0: 1.0}}[argument]
    with pytest.raises(ConfigError) as raised:
        tfgpu.fit(_model(), loader.load(digits_dir, "val"), **{argument: value}, verbose=0)
    assert raised.value.flag == argument and "tfgpu.data.load" in str(raised.value)


def _audit_data(directory) -> str:
    """203 records in 3 shards (tfgpu's writer) whose 2x2 images carry their index, 10 classes."""
    from tfgpu.data.schema import tfrecord

    ids = np.arange(203)
    images = np.random.default_rng(0).integers(0, 256, (203, 2, 2, 1)).astype(np.uint8)
    images[:, 0, 0, 0], images[:, 0, 1, 0] = ids % 256, ids // 256
    entry = tfrecord.write_arrays(str(directory), "train", images, ids % 10, num_shards=3)
    tfrecord.write_manifest(str(directory), {
        "name": "ids", "classes": [str(i) for i in range(10)], "compression": "none", "splits": {"train": entry},
        "image_shape": {"height": 2, "width": 2, "channels": 1}})
    return str(directory)


def _audits(args, cwd, **options):
    return helpers.printed("records_audit_script.py", "AUDIT", args, cwd, **options)


@pytest.mark.slow  # four runs, on 1, 2, 2 and 3 workers: minutes on 2 cores
def test_workers_read_every_record_once_and_a_resume_on_other_workers_trains_the_uninterrupted_batches(tmp_path):
    """Real workers (tfgpu.launch): every step's global batch on two workers is the one-device run's, each record
    once an epoch; stopped on two workers at epoch 0, batch 5 and resumed on three, the run trains the very global
    batches of the uninterrupted run."""
    data = _audit_data(tmp_path / "data")
    whole, = _audits([data, str(tmp_path / "one"), "2"], tmp_path)
    for epoch in range(2):
        assert sorted(i for step in whole["steps"][epoch * 13:(epoch + 1) * 13] for i in step) == list(range(203))
    assert [len(step) for step in whole["steps"]] == ([16] * 12 + [11]) * 2
    for worker in _audits([data, str(tmp_path / "two"), "2"], tmp_path, launch_workers=2):
        assert worker["steps"] == whole["steps"]
    _audits([data, str(tmp_path / "moved"), "2", "0:5"], tmp_path, launch_workers=2, expect=143)
    resumed = _audits([data, str(tmp_path / "moved"), "2"], tmp_path, launch_workers=3)
    assert len(resumed) == 3
    for worker in resumed:
        assert worker["steps"] == whole["steps"]
        # the batches are the same; the weights only close: a batch of 16 cut 6/5/5 over three replicas is
        # averaged as tf.distribute averages replicas' means (5e-4 apart at most here), not as one device's mean
        np.testing.assert_allclose(worker["weights"], whole["weights"], rtol=1e-2, atol=1e-3)
