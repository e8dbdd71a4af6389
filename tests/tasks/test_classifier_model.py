"""tasks/classifier_model: the classification step as a keras.Model. ``tfgpu.fit`` trains it on tfgpu's converted
records; ``model.fit`` and ``tfgpu.fit`` train it bit for bit alike; its evaluation weighs as Keras' compiled metrics
do; skipped non-finite steps change no variable; the flag command's task hands out its own step as that model; on two
logical CPU replicas it reaches the one-device weights (slow: a subprocess of its own)."""

import keras
import numpy as np
import pytest

import tfgpu
from tests.conftest import results_of_script
from tests.training.fit import helpers
from tfgpu.data.conversion import convert
from tfgpu.data.input import loader
from tfgpu.models import create_model
from tfgpu.tasks import classifier_model


@pytest.fixture(scope="module")
def digits_dir(tmp_path_factory):
    """sklearn's digits converted by tfgpu's converter: train 1,438, val 359, uint8 8x8x1."""
    directory = str(tmp_path_factory.mktemp("digits"))
    convert.convert(convert.Options(source="digits", output_dir=directory, num_shards="2"))
    return directory


def _pixels_classifier(seed=0, **options):
    """The registry's small_cnn behind a Rescaling of 0..255 pixels (tfgpu.data.load gives them as stored), in
    training with the flag command's options."""
    keras.utils.set_random_seed(seed)
    network = keras.Sequential([keras.Input((8, 8, 1)), keras.layers.Rescaling(1 / 255),
                                create_model("small_cnn", (8, 8, 1), 10)], name="pixels_small_cnn")
    options = {"label_smoothing": 0.1, "weight_decay": 5e-4, "grad_accum_steps": 2, "grad_clip_norm": 5.0, **options}
    return classifier_model.for_network(network, keras.optimizers.SGD(0.05, momentum=0.9), **options)


def test_tfgpu_fit_trains_it_on_converted_records(digits_dir, tmp_path):
    model = _pixels_classifier()
    history = tfgpu.fit(model, tfgpu.data.load(digits_dir, batch_size=64), epochs=2, verbose=0,
                        validation_data=tfgpu.data.load(digits_dir, "val", batch_size=128),
                        model_dir=str(tmp_path / "run")).history
    assert set(history) == {"loss", "accuracy", "grad_norm", "nonfinite_steps", "val_loss", "val_accuracy",
                            "val_top5_accuracy"}
    assert history["loss"][1] < 0.8 * history["loss"][0]
    assert history["accuracy"][1] > history["accuracy"][0] + 0.2
    # 45 steps leave BatchNorm's moving statistics near their start (momentum 0.99), so the evaluation is not yet
    # the trained one (test_its_evaluation_weighs_as_keras_compiled_loss_and_metrics checks its values)
    assert 0 <= history["val_accuracy"][1] <= history["val_top5_accuracy"][1] <= 1
    assert history["nonfinite_steps"] == [0.0, 0.0]


def test_model_fit_and_tfgpu_fit_train_it_bit_for_bit_alike(digits_dir, tmp_path):
    by_keras, by_tfgpu = _pixels_classifier(), _pixels_classifier()
    keras_history = by_keras.fit(loader.load(digits_dir, batch_size=128), epochs=2, verbose=0).history
    history = tfgpu.fit(by_tfgpu, loader.load(digits_dir, batch_size=128), epochs=2, verbose=0,
                        model_dir=str(tmp_path / "run")).history
    assert history == keras_history
    for ours, theirs in zip(by_tfgpu.network.weights + by_tfgpu.optimizer.variables,
                            by_keras.network.weights + by_keras.optimizer.variables):
        np.testing.assert_array_equal(ours.numpy(), theirs.numpy(), err_msg=ours.path)
    assert history["loss"][1] < history["loss"][0]


def test_its_evaluation_weighs_as_keras_compiled_loss_and_metrics():
    x, y = helpers.digits(300)
    x = x.reshape(-1, 8, 8, 1)
    weights = np.random.default_rng(0).uniform(0.0, 2.0, len(y)).astype("float32")
    model = _pixels_classifier(label_smoothing=0.0)
    plain = keras.Model(model.network.inputs, model.network.outputs)
    plain.compile(loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), weighted_metrics=[
        keras.metrics.SparseCategoricalAccuracy(name="accuracy"),
        keras.metrics.SparseTopKCategoricalAccuracy(5, name="top5_accuracy")])
    ours = model.evaluate(x, y, sample_weight=weights, batch_size=64, verbose=0, return_dict=True)
    theirs = plain.evaluate(x, y, sample_weight=weights, batch_size=64, verbose=0, return_dict=True)
    assert ours.keys() == theirs.keys() == {"loss", "accuracy", "top5_accuracy"}
    for name in ours:
        assert ours[name] == pytest.approx(theirs[name], rel=1e-5), name


def test_a_network_ending_in_a_softmax_trains_from_the_logits_under_it():
    """A Keras tutorial's network (softmax at the end) trains as the same network giving logits, and still gives
    probabilities."""
    x, y = helpers.digits(256)

    def trained(activation):
        keras.utils.set_random_seed(0)
        network = keras.Sequential([keras.Input((64,)), keras.layers.Dense(16, activation="relu"),
                                    keras.layers.Dense(10, activation=activation)])
        model = classifier_model.for_network(network, keras.optimizers.SGD(0.1), label_smoothing=0.1)
        return network, model.fit(x, y, batch_size=64, shuffle=False, verbose=0).history

    softmax, softmax_history = trained("softmax")
    logits, logits_history = trained(None)
    assert softmax_history == pytest.approx(logits_history, rel=1e-6)
    for a, b in zip(softmax.get_weights(), logits.get_weights()):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(softmax.predict(x[:4], verbose=0).sum(-1), 1.0, rtol=1e-5)


def test_skipped_non_finite_steps_leave_every_variable_bit_identical():
    """Poisoned batches through the model's own train_step: every variable of the network and the optimizer
    (weights, BatchNorm statistics, momentum, iterations) stays bit-identical, the steps are counted, and the next
    finite step trains."""
    rng = np.random.default_rng(0)
    model = _pixels_classifier(grad_accum_steps=1)
    labels = np.arange(160) % 10
    model.fit(rng.uniform(0, 255, (48, 8, 8, 1)).astype("float32"), labels[:48], batch_size=16, verbose=0)
    state = model.network.variables + model.optimizer.variables
    assert any("moving_mean" in v.path for v in state) and any("momentum" in v.path for v in state)
    before = [v.numpy().copy() for v in state]
    history = model.fit(np.full((160, 8, 8, 1), np.nan, np.float32), labels, batch_size=16, verbose=0).history
    assert history["nonfinite_steps"] == [10.0]
    for variable, value in zip(state, before):
        np.testing.assert_array_equal(variable.numpy(), value, err_msg=variable.path)
    history = model.fit(rng.uniform(0, 255, (16, 8, 8, 1)).astype("float32"), labels[:16], verbose=0).history
    assert history["nonfinite_steps"] == [0.0]
    assert all(np.isfinite(v.numpy()).all() for v in state)
    assert any(not np.array_equal(v.numpy(), b) for v, b in zip(state, before))


def test_a_keras_loss_scale_optimizer_is_refused_by_name():
    network = keras.Sequential([keras.Input((8, 8, 1)), keras.layers.Flatten(), keras.layers.Dense(10)])
    with pytest.raises(ValueError, match="LossScaleOptimizer"):
        classifier_model.for_network(network, keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD()))


def test_the_flag_commands_task_hands_out_its_step_as_a_keras_model(tmp_path, data_cache):
    """``ClassificationTask.keras_model()``: the task's network and optimizer behind the task's own step, which
    ``model.fit`` runs; each step advances the run's step counter, as the flag command's loop does."""
    from tfgpu.config import Config
    from tfgpu.training import experiment

    config = Config(model_dir=str(tmp_path / "run"), dataset="digits", data_cache_dir=data_cache, model="small_cnn",
                    global_batch_size=32, train_steps=4, steps_per_loop=4, deterministic=True, eval_split="none",
                    tensorboard=False, verbose=0, lr_schedule="constant", grad_clip_norm=1.0)
    try:
        built = experiment.setup(config)
        task = built.task
        model = task.keras_model()
        assert model is task.keras_model() and model.network is task.model and model.optimizer is task.optimizer
        before = [w.copy() for w in task.model.get_weights()]
        x, y = helpers.digits(96)
        history = model.fit(x.reshape(-1, 8, 8, 1), y, batch_size=32, shuffle=False, verbose=0).history
        assert set(history) == {"loss", "accuracy", "grad_norm", "nonfinite_steps"}
        assert int(task.global_step.numpy()) == 3
        assert helpers.weights_changed(before, task.model)
    finally:
        keras.backend.clear_session(free_memory=False)


def test_the_multilabel_task_hands_out_its_step_too_scored_per_label(tmp_path):
    """``MultiLabelTask.keras_model()``: trains under ``model.fit``; its evaluation gives the loss (binary
    cross-entropy averaged over the labels), the per-label accuracy and the exact match of the network's logits."""
    from tfgpu.config import Config
    from tfgpu.tasks import multilabel
    from tfgpu.training import experiment

    data_dir = multilabel.write_digits(str(tmp_path / "data"))
    config = Config(model_dir=str(tmp_path / "run"), task="multilabel", data_dir=data_dir, model="small_cnn",
                    global_batch_size=32, train_steps=4, steps_per_loop=4, deterministic=True, eval_split="none",
                    tensorboard=False, verbose=0, lr_schedule="constant")
    try:
        model = experiment.setup(config).task.keras_model()
        x, digits = helpers.digits(128)
        x, labels = x.reshape(-1, 8, 8, 1), multilabel.digit_labels(digits)
        history = model.fit(x, labels, batch_size=32, shuffle=False, verbose=0).history
        assert set(history) == {"loss", "accuracy", "nonfinite_steps"} and history["nonfinite_steps"] == [0.0]
        logs = model.evaluate(x, labels, batch_size=64, verbose=0, return_dict=True)
        logits = model.network.predict(x, verbose=0).astype("float64")
        losses = np.maximum(logits, 0) - logits * labels + np.log1p(np.exp(-np.abs(logits)))
        right = (logits > 0) == (labels == 1)
        assert logs == pytest.approx({"loss": losses.mean(), "accuracy": right.mean(),
                                      "exact_match": right.all(-1).mean()}, rel=1e-5)
    finally:
        keras.backend.clear_session(free_memory=False)


TWO_REPLICAS = r'''
import json, sys
import tensorflow as tf
cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
import keras
import numpy as np
import tfgpu
from tfgpu.tasks import classifier_model
from tests.training.fit import helpers

x, y = helpers.digits(512)
x = x.reshape(-1, 8, 8, 1)


def make():
    """A network without BatchNorm, whose gradient is the same however the global batch is split (into replicas or
    micro-batches), with every option of the step that depends on the replicas: each replica's share of the L2 term,
    the norm of the all-reduced gradient (clipped: the norms are near 0.5), micro-batches, the loss share."""
    keras.utils.set_random_seed(0)
    network = keras.Sequential([keras.Input((8, 8, 1)), keras.layers.Flatten(),
                                keras.layers.Dense(32, activation="relu"), keras.layers.Dense(10)])
    return classifier_model.for_network(network, keras.optimizers.SGD(0.1, momentum=0.9), label_smoothing=0.1,
                                        weight_decay=5e-4, grad_accum_steps=2, grad_clip_norm=0.5)


args = dict(batch_size=64, epochs=2, shuffle=False, verbose=0, validation_data=(x[:128], y[:128]))
one = make()
initial = one.network.get_weights()
one_history = one.fit(x, y, **args).history
strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
with strategy.scope():
    two = make()
    two.network.set_weights(initial)  # the same weights, whatever the seed draws under the strategy
two_history = tfgpu.fit(two, x, y, model_dir=sys.argv[1], **args).history
print("RESULTS " + json.dumps(dict(
    replicas=two.distribute_strategy.num_replicas_in_sync, one=one_history, two=two_history,
    weights=float(max(np.abs(a - b).max() for a, b in zip(one.network.get_weights(), two.network.get_weights()))),
    iterations=[int(one.optimizer.iterations.numpy()), int(two.optimizer.iterations.numpy())])))
'''


@pytest.mark.slow  # a subprocess of its own (logical devices are set before TensorFlow starts)
def test_on_two_replicas_it_reaches_the_one_device_weights(tmp_path):
    result = results_of_script(tmp_path, TWO_REPLICAS, "two_replicas.py", timeout=600)
    assert result["replicas"] == 2
    assert result["iterations"] == [16, 16]
    assert result["two"].keys() == result["one"].keys()
    examples = {"accuracy": 512, "val_accuracy": 128, "val_top5_accuracy": 128}
    for name, values in result["one"].items():
        # an accuracy counts examples: weights 1e-7 apart may flip one whose two top logits are that close
        tol = 2.0 / examples[name] if name in examples else 1e-5
        np.testing.assert_allclose(result["two"][name], values, rtol=0, atol=tol, err_msg=name)
    assert result["weights"] < 1e-5
