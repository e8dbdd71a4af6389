"""tfgpu.fit's data arguments as Keras takes them: arrays cut by validation_split (the tail validates), [0, 1] floats
fed back in [0, 1], a batched Dataset's batch as the batch size, a PyDataset read once, Keras' refusals."""
import keras
import numpy as np
import pytest
import tensorflow as tf

from tfgpu.config import ConfigError
from tfgpu.training import fit_arguments, fit_data

NAMES = {name: name for name in fit_arguments.KERAS_ARGUMENTS}


def args(**given):
    values = dict(x=None, y=None, batch_size=None, validation_split=0.0, validation_data=None, shuffle=True,
                  sample_weight=None)
    values.update(given)
    return values


def images(n, dtype="uint8"):
    return (np.arange(n * 16).reshape(n, 4, 4) % 256).astype(dtype)


def test_arrays_the_last_fraction_validates_and_unit_floats_come_back_in_unit_range():
    x, y = images(10).astype("float32") / 255.0, np.arange(10) % 3
    data = fit_data.resolve(args(x=x, y=y, validation_split=0.3), NAMES)
    assert data.input_range == (0.0, 1.0) and not data.one_hot
    train = list(data.datasets["train"].as_numpy_iterator())
    val = list(data.datasets["val"].as_numpy_iterator())
    assert len(train) == 7 and len(val) == 3 and train[0][0].shape == (4, 4, 1) and train[0][0].dtype == np.uint8
    np.testing.assert_array_equal([label for _, label in val], y[7:])
    np.testing.assert_array_equal(val[0][0][..., 0], np.rint(x[7] * 255))
    assert fit_data.resolve(args(x=images(4), y=np.eye(3)[[0, 1, 2, 0]]), NAMES).one_hot
    assert fit_data.resolve(args(x=images(4), y=np.zeros(4)), NAMES).input_range == (0.0, 255.0)


def test_sample_weights_are_cut_with_the_arrays_and_taken_from_a_datasets_elements():
    x, y, w = images(10), np.arange(10) % 3, np.linspace(0, 2, 10)
    data = fit_data.resolve(args(x=x, y=y, validation_split=0.3, sample_weight=w, shuffle=False), NAMES)
    np.testing.assert_allclose(data.sample_weights["train"], w[:7], rtol=1e-6)
    np.testing.assert_allclose(data.sample_weights["val"], w[7:], rtol=1e-6)
    assert data.in_order and data.sample_weights["train"].dtype == np.float32
    dataset = tf.data.Dataset.from_tensor_slices((x[..., None], y, w)).batch(4)
    data = fit_data.resolve(args(x=dataset, validation_data=(x[:2], y[:2], w[:2])), NAMES)
    np.testing.assert_allclose(data.sample_weights["train"], w, rtol=1e-6)
    np.testing.assert_allclose(data.sample_weights["val"], w[:2], rtol=1e-6)
    assert not data.in_order and data.batch_size == 4 and len(data.datasets["train"].element_spec) == 2


def test_a_batched_dataset_gives_its_batch_and_is_unbatched():
    ds = tf.data.Dataset.from_tensor_slices((images(10)[..., None], np.arange(10))).batch(4)
    data = fit_data.resolve(args(x=ds), NAMES)
    assert data.batch_size == 4 and len(list(data.datasets["train"])) == 10
    assert fit_data.resolve(args(x=ds.unbatch()), NAMES).batch_size == 0


def test_a_pydataset_without_workers_is_read_once():
    class Batches(keras.utils.PyDataset):
        def __len__(self):
            return 3

        def __getitem__(self, i):
            return images(5)[..., None] if i < 2 else images(2)[..., None], np.full(5 if i < 2 else 2, i)

    data = fit_data.resolve(args(x=Batches()), NAMES)
    assert data.batch_size == 5 and len(list(data.datasets["train"])) == 12


@pytest.mark.parametrize("given, argument, message", [
    (dict(x=images(4)), "y", "pass their labels as y"),
    (dict(x=images(4), y=np.zeros(4), shuffle="batch"), "shuffle", "True (shuffled every epoch"),
    (dict(x=np.zeros((4, 7), "float32"), y=np.zeros(4)), "x", "image classifiers"),
    (dict(x=images(4).astype("int32") * 100, y=np.zeros(4)), "x", "integer pixels span"),
    (dict(x=images(4), y=np.zeros(3)), "y", "one class index"),
    (dict(x=tf.data.Dataset.from_tensor_slices((images(4)[..., None], np.zeros(4))), validation_split=0.5),
     "validation_split", "only supported for Tensors or NumPy arrays"),
    (dict(x=tf.data.Dataset.from_tensor_slices((images(4)[..., None], np.zeros(4))), y=np.zeros(4)), "y",
     "not supported when using dataset"),
    (dict(x=images(4), y=np.zeros(4), validation_data=(images(2), np.zeros(2), np.ones(3))), "validation_data",
     "weights of shape (3,) for 2 examples"),
    (dict(x=(images(4), np.zeros(4))), "x", "pass x and y as two arguments"),
])
def test_what_keras_refuses_is_one_line_naming_the_argument(given, argument, message):
    with pytest.raises(ConfigError) as e:
        fit_data.resolve(args(**given), NAMES)
    assert e.value.flag == argument and message in str(e.value), str(e.value)
