"""tfgpu.fit runs a Dataset, a generator or a PyDataset as written, as ``model.fit`` does (datasets.py): a generator
with ``steps_per_epoch`` runs on across epochs, a random map is drawn again each epoch, an unshuffled pipeline keeps
its order, a PyDataset's ``on_epoch_end`` runs once per epoch, and the Dataset still iterates after fit."""
import warnings

import keras
import numpy as np
import pytest
import tensorflow as tf

from tests.training.fit import helpers
from tests.training.fit.helpers import both


@pytest.fixture(scope="module")
def data():
    return helpers.digits(320)


@pytest.fixture(autouse=True)
def _no_shuffle_warning():
    """Keras warns that ``shuffle=True`` (fit's default) is ignored for these inputs; both fits do."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*shuffle=True.*was passed")
        yield


def test_a_python_generator_with_steps_per_epoch(data, tmp_path):
    x, y = data

    def args(record):
        record["drawn"] = 0

        def batches():  # endless: 10 batches of 32, over and over
            i = 0
            while True:
                record["drawn"] += 1
                yield x[32 * i:32 * (i + 1)], y[32 * i:32 * (i + 1)]
                i = (i + 1) % 10

        return (batches(),), dict(steps_per_epoch=4, epochs=3, verbose=0)

    plain, ours = both(helpers.classifier, args, tmp_path)
    # one generator across the epochs: epoch 2 trains on batches 4-7, not on 0-3 again (that would change the loss)
    assert ours.iterations == plain.iterations == 12
    assert ours.record["drawn"] >= 12


def test_a_random_map_is_drawn_again_each_epoch(data, tmp_path):
    x, y = data

    def args(record):
        record["calls"] = calls = tf.Variable(0, dtype=tf.int64)

        def noisy(image, label):
            calls.assign_add(1)
            return image + tf.random.uniform(tf.shape(image), 0.0, 0.2), label

        return (tf.data.Dataset.from_tensor_slices((x, y)).map(noisy).batch(32),), dict(epochs=3, verbose=0)

    plain, ours = both(helpers.classifier, args, tmp_path)  # the same noise: the same losses
    assert int(plain.record["calls"].numpy()) == 3 * len(x)  # Keras maps every example once per epoch
    assert int(ours.record["calls"].numpy()) == 3 * len(x)


def test_an_unshuffled_label_sorted_dataset_keeps_its_order(data, tmp_path):
    x, y = data
    order = np.argsort(y, kind="stable")
    sorted_x, sorted_y = x[order], y[order]

    def args(record):
        return (tf.data.Dataset.from_tensor_slices((sorted_x, sorted_y)).batch(32),), dict(epochs=2, verbose=0)

    # a label-sorted order trains very differently from any shuffled one: equal histories mean the same order
    plain, ours = both(helpers.classifier, args, tmp_path)
    shuffled = helpers.keras_run(helpers.classifier, lambda r: ((x, y), dict(batch_size=32, epochs=2, verbose=0)))
    assert abs(shuffled.history.history["loss"][-1] - ours.history.history["loss"][-1]) > 1e-3


class Batches(keras.utils.PyDataset):
    """Arrays in batches of 32 that reshuffle their order in ``on_epoch_end`` (the PyDataset docs' pattern, from a
    seeded generator) and count ``on_epoch_begin``/``on_epoch_end`` calls."""

    def __init__(self, x, y, shuffle=True):
        super().__init__()
        self.x, self.y, self.shuffle, self.calls = x, y, shuffle, []
        self.order, self.rng = np.arange(len(x)), np.random.default_rng(7)

    def __len__(self):
        return -(-len(self.x) // 32)

    def __getitem__(self, i):
        rows = self.order[32 * i:32 * (i + 1)]
        return self.x[rows], self.y[rows]

    def on_epoch_begin(self):
        self.calls.append("begin")

    def on_epoch_end(self):
        self.calls.append("end")
        if self.shuffle:
            self.order = self.rng.permutation(len(self.x))


def test_a_py_datasets_epoch_hooks_run_as_under_model_fit(data, tmp_path):
    """Keras' fit calls ``on_epoch_end`` once before the first epoch (its epoch iterator's reset after the model's
    build) and after every epoch; a validation PyDataset gets a reset, then begin and end, at every validation. The
    shuffling PyDataset trains on the same batches only if tfgpu makes the same calls."""
    x, y = data

    def args(record):
        record["train"], record["val"] = Batches(x[:256], y[:256]), Batches(x[256:], y[256:], shuffle=False)
        return (record["train"],), dict(epochs=3, verbose=0, validation_data=record["val"])

    plain, ours = both(helpers.classifier, args, tmp_path)
    assert plain.record["train"].calls == ["end"] + ["begin", "end"] * 3  # what Keras 3.15 does
    assert ours.record["train"].calls == plain.record["train"].calls
    assert plain.record["val"].calls == ["end", "begin", "end"] * 3
    assert ours.record["val"].calls == plain.record["val"].calls


def test_a_py_dataset_with_steps_per_epoch(data, tmp_path):
    """With ``steps_per_epoch`` Keras' iterator runs on across epochs, and still calls the epoch hooks each epoch."""
    x, y = data

    def args(record):
        record["train"] = Batches(x, y, shuffle=False)
        return (record["train"],), dict(epochs=2, steps_per_epoch=4, verbose=0)

    plain, ours = both(helpers.classifier, args, tmp_path)
    assert ours.iterations == plain.iterations == 8
    assert ours.record["train"].calls == plain.record["train"].calls == ["end"] + ["begin", "end"] * 2


@pytest.mark.slow  # the default set stays near a minute on 2 cores
def test_a_dataset_made_before_fit_iterates_after_it(data, tmp_path):
    x, y = data

    def args(record):
        record["data"] = tf.data.Dataset.from_tensor_slices((x, y)).batch(64)
        return (record["data"],), dict(epochs=2, verbose=0)

    plain, ours = both(helpers.classifier, args, tmp_path)
    dataset = ours.record["data"]
    labels = np.concatenate([batch_y.numpy() for _, batch_y in dataset])
    np.testing.assert_array_equal(labels, y)
    after = ours.model.evaluate(dataset, verbose=0, return_dict=True)
    assert after == pytest.approx(plain.model.evaluate(plain.record["data"], verbose=0, return_dict=True), abs=1e-5)


def test_a_finite_dataset_shorter_than_its_steps_per_epoch_is_rerun(data, tmp_path):
    """10 batches, 4 an epoch: Keras' third epoch ends after the last 2 (with its warning), the fourth reruns the
    Dataset from its start; training does not stop."""
    x, y = data

    def args(record):
        return (tf.data.Dataset.from_tensor_slices((x, y)).batch(32),), dict(epochs=4, steps_per_epoch=4, verbose=0)

    plain, ours = both(helpers.classifier, args, tmp_path)
    assert ours.iterations == plain.iterations == 14 and ours.history.epoch == [0, 1, 2, 3]


def test_a_pipeline_may_end_with_a_smaller_batch_unless_it_drops_the_remainder():
    from tfgpu.training.fit import inputs

    rows = tf.data.Dataset.from_tensor_slices((np.zeros((10, 2), "float32"), np.zeros((10,), "int64")))
    assert inputs.make(rows.batch(4)).last_batch_smaller()
    assert not inputs.make(rows.batch(4, drop_remainder=True)).last_batch_smaller()


@pytest.fixture
def deterministic_ops():
    """``tf.config.experimental.enable_op_determinism()``, as a script that wants bit-for-bit runs sets it."""
    from tensorflow.python.framework import config

    was = config.is_op_determinism_enabled()
    config.enable_op_determinism()
    yield
    if not was:
        config.disable_op_determinism()


def reshuffled(x, y, buffer=128, **shuffle):
    return tf.data.Dataset.from_tensor_slices((x, y)).shuffle(buffer, **shuffle)


@pytest.mark.parametrize("steps_per_execution", [1, 2, 3])
def test_a_reshuffling_dataset_gives_model_fits_history_bit_for_bit_every_epoch(data, tmp_path, deterministic_ops,
                                                                             steps_per_execution):
    """Making an iterator draws a reshuffling pipeline's next order: Keras makes one at each epoch's start and one
    more at the end of each epoch that ran out its pipeline (10 batches: with 1 or 2 steps a host call; with 3 its
    last call runs out instead). Epochs 2 and 3 trained on other orders than under model.fit before."""
    x, y = data

    def args(record):
        noisy = lambda image, label: (image + tf.random.uniform(tf.shape(image), 0.0, 0.2), label)  # noqa: E731
        return (reshuffled(x, y).batch(32),), dict(
            epochs=4, verbose=0, validation_data=reshuffled(x[:96], y[:96], 64).map(noisy).batch(32))

    plain, ours = both(lambda: helpers.classifier(steps_per_execution=steps_per_execution), args, tmp_path, tol=0)
    assert ours.iterations == plain.iterations == 40


def test_a_shuffled_randomly_mapped_dataset_trains_as_under_model_fit_bit_for_bit(data, tmp_path, deterministic_ops):
    x, y = data

    def args(record):
        def noisy(image, label):
            return image + tf.random.uniform(tf.shape(image), 0.0, 0.3), label

        pipeline = reshuffled(x, y, 64, seed=3).map(noisy, num_parallel_calls=2).batch(32).prefetch(2)
        return (pipeline,), dict(epochs=3, verbose=0)

    both(helpers.classifier, args, tmp_path, tol=0)


def digit_folder(root, per_class=16):
    """sklearn's digits as a folder of 8x8 grayscale PNGs, one subfolder per class, as a photo script reads them."""
    from PIL import Image

    x, y = helpers.digits()
    for label in range(10):
        (root / str(label)).mkdir(parents=True)
        for i, image in enumerate(x[y == label][:per_class]):
            Image.fromarray((image.reshape(8, 8) * 255).astype("uint8")).save(root / str(label) / f"{i}.png")
    return root


def test_image_dataset_from_directory_trains_as_under_model_fit_bit_for_bit(tmp_path, deterministic_ops):
    folder = digit_folder(tmp_path / "digits")

    def model():
        keras.utils.set_random_seed(0)
        m = keras.Sequential([keras.Input((8, 8, 1)), keras.layers.Rescaling(1 / 255), keras.layers.Flatten(),
                              keras.layers.Dense(16, activation="relu"), keras.layers.Dense(10, activation="softmax")])
        m.compile(optimizer=keras.optimizers.SGD(0.1), loss="sparse_categorical_crossentropy", metrics=["accuracy"])
        return m

    def args(record):
        images = keras.utils.image_dataset_from_directory(folder, image_size=(8, 8), color_mode="grayscale",
                                                          batch_size=16, seed=7, verbose=False)
        return (images,), dict(epochs=4, verbose=0)

    plain, ours = both(model, args, tmp_path / "fit", tol=0)
    assert ours.iterations == plain.iterations == 40


def test_a_resumed_run_on_a_reshuffling_dataset_trains_the_uninterrupted_runs_orders(data, tmp_path,
                                                                                   deterministic_ops):
    """Three epochs, or one and then two more in a fresh process-like run (the script seeded alike): the resumed
    run makes the iterators the first one made, so its epochs 2 and 3 see the uninterrupted run's orders (training
    and validation) and it ends with the same weights, bit for bit."""
    import tfgpu

    x, y = data

    def trained(model_dir, epochs):
        model = helpers.classifier()
        keras.utils.set_random_seed(1)
        tfgpu.fit(model, reshuffled(x, y).batch(32), validation_data=reshuffled(x[:96], y[:96], 64).batch(32),
                  epochs=epochs, verbose=0, model_dir=str(model_dir))
        return model

    whole = trained(tmp_path / "whole", 3)
    trained(tmp_path / "split", 1)
    resumed = trained(tmp_path / "split", 3)
    assert int(resumed.optimizer.iterations.numpy()) == 30
    helpers.assert_same_weights(whole, resumed, tol=0)
