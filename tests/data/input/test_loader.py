"""data/input/loader: ``tfgpu.data.load`` gives a converted split's records as stored, in Keras' batches, one epoch
an iteration in the flag command's order, held in memory or read, and ``model.fit`` trains on it."""
import numpy as np
import pytest
import tensorflow as tf

from tfgpu.config import ConfigError
from tfgpu.data.conversion import convert
from tfgpu.data.input import loader
from tfgpu.data.sources import builtin


@pytest.fixture(scope="module")
def digits_dir(tmp_path_factory):
    """sklearn's digits converted by tfgpu's converter (``python -m tfgpu.convert --source=digits
    --num_shards=2``): splits train (1,438) and val (359)."""
    directory = str(tmp_path_factory.mktemp("digits"))
    convert.convert(convert.Options(source="digits", output_dir=directory, num_shards="2"))
    return directory


def _epoch(dataset):
    images, labels = zip(*[(x.numpy(), y.numpy()) for x, y in dataset])
    return images, labels


def test_batches_are_the_split_as_stored_in_keras_batches(digits_dir):
    """shuffle=False: the val split's records in shard order, uint8 images, the last batch partial."""
    dataset = loader.load(digits_dir, "val", batch_size=100)
    images, labels = _epoch(dataset)
    assert [len(b) for b in labels] == [100, 100, 100, 59] and int(dataset.cardinality()) == 4
    assert images[0].dtype == np.uint8 and images[0].shape == (100, 8, 8, 1)
    keys = loader.records_of(dataset).epoch_keys(0)
    assert (np.diff(keys) > 0).all()  # (shard, record) order
    source_images, source_labels = builtin.load_builtin("digits")["splits"]["val"]  # what the converter read

    def rows(images, labels):
        return sorted(image.tobytes() + bytes([label]) for image, label in zip(images, labels))

    assert rows(np.concatenate(images), np.concatenate(labels)) == rows(source_images, source_labels)


def test_each_iteration_is_the_next_epoch_every_record_once(digits_dir):
    dataset = loader.load(digits_dir, batch_size=128, seed=3)
    records = loader.records_of(dataset)
    held_images, held_labels = records.held()
    for epoch in range(2):
        images, labels = _epoch(dataset)
        positions = records.order.positions(tf.constant(records.epoch_keys(epoch))).numpy()
        assert sorted(positions.tolist()) == list(range(1438))  # every record once
        np.testing.assert_array_equal(np.concatenate(images), held_images.numpy()[positions])
        np.testing.assert_array_equal(np.concatenate(labels), held_labels.numpy()[positions])
    assert not np.array_equal(records.epoch_keys(0), records.epoch_keys(1))
    assert not np.array_equal(records.epoch_keys(0), loader.records_of(loader.load(digits_dir, seed=4)).epoch_keys(0))


def test_records_read_each_epoch_give_the_held_batches(digits_dir):
    """A split too large to hold (here: told so) is read at its offsets and decoded a batch at a time: the same
    batches as held in memory."""
    held = loader.records_of(loader.load(digits_dir, batch_size=300, seed=5))
    read = loader.Records(held.info, held.config, 300)
    read.in_memory = False
    assert held.in_memory
    batches = [list(r.global_batches(1, 2).map(r.fetch)) for r in (held, read)]
    assert len(batches[0]) == len(batches[1]) == 3  # batches 2, 3 and the partial 4 of epoch 1
    for a, b in zip(*batches):
        for x, y in zip(a, b):
            np.testing.assert_array_equal(x, y)


def test_model_fit_trains_on_it(digits_dir):
    import keras

    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((8, 8, 1)), keras.layers.Rescaling(1 / 255), keras.layers.Flatten(),
                              keras.layers.Dense(10)])
    model.compile(keras.optimizers.Adam(0.02), keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    history = model.fit(loader.load(digits_dir, batch_size=64), epochs=2, verbose=0,
                        validation_data=loader.load(digits_dir, "val", batch_size=128))
    assert history.history["val_accuracy"][-1] > 0.8  # 10 classes: chance is 0.1


def test_image_size_resizes_as_the_flag_does(digits_dir):
    images, _ = next(iter(loader.load(digits_dir, "val", batch_size=8, image_size=4)))
    assert images.shape == (8, 4, 4, 1) and images.dtype == tf.uint8


def test_only_the_datasets_load_made_are_its_own(digits_dir):
    dataset = loader.load(digits_dir, "val", batch_size=64)
    assert loader.records_of(dataset) is not None
    assert loader.records_of(dataset.take(2)) is None and loader.records_of([1, 2]) is None


@pytest.mark.parametrize("kwargs, named", [
    (dict(batch_size=0), "batch_size"), (dict(batch_size=True), "batch_size"), (dict(split="tets"), "split"),
    (dict(seed=-1), "seed"), (dict(shuffle="yes"), "shuffle"), (dict(image_size=-2), "image_size")])
def test_a_bad_argument_is_one_line_naming_it(digits_dir, kwargs, named):
    with pytest.raises(ConfigError) as raised:
        loader.load(digits_dir, **kwargs)
    assert raised.value.flag == named and str(raised.value).startswith(f"tfgpu.data.load: {named}: ")
    assert "\n" not in str(raised.value)


def test_a_directory_without_a_manifest_names_data_dir(tmp_path):
    with pytest.raises(ConfigError) as raised:
        loader.load(str(tmp_path))
    assert raised.value.flag == "data_dir" and "dataset.json" in str(raised.value)
