"""training/fit/records: a ``tfgpu.data.load`` Dataset given to ``tfgpu.fit`` trains on ``model.fit``'s batches on one
device; read by index, every record comes once per epoch on any number of workers and replicas, and a run resumed
at any step on another topology trains on the global batches of the run it continues (properties over workers x
replicas x batch x resume step; workers simulated in-process by their replica ids, as the pipeline's own tests
simulate input pipelines by their ids)."""
import keras
import numpy as np
import pytest
import tensorflow as tf

import tfgpu
from tfgpu.config import ConfigError
from tfgpu.data.conversion import convert
from tfgpu.data.input import loader
from tfgpu.training.fit import arrays, inputs, records


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
