"""What a classification step computes: micro-batch accumulation, clipping and smoothing, run in-process."""
import dataclasses
import json
import logging
import os

import keras
import numpy as np
import pytest
import tensorflow as tf

from tests.conftest import checkpoint_weights
from tfgpu.training import experiment
from tfgpu.config import Config, ConfigError, InputConfig
from tfgpu.data.input import records
from tfgpu.models import register_model
from tfgpu.tasks.base import register_task
from tfgpu.tasks.classification import ClassificationTask
from tfgpu.tasks.classifier_head import check_model
from tfgpu.runtime import run_dir


@register_model("test_mlp_without_bn")
def _mlp(input_shape, num_classes, **_):
    """No BatchNorm: its gradient does not depend on how the batch is split."""
    inputs = keras.Input(input_shape)
    x = keras.layers.Dense(32, activation="relu")(keras.layers.Flatten()(inputs))
    return keras.Model(inputs, keras.layers.Dense(num_classes)(x))


def _base(model_dir, data_cache):
    return Config(model_dir=model_dir, dataset="digits", data_cache_dir=data_cache,
                  model="test_mlp_without_bn", global_batch_size=64, train_steps=6, steps_per_loop=3,
                  deterministic=True, eval_split="none", tensorboard=False, verbose=0, lr_schedule="constant",
                  weight_decay=1e-3)


@pytest.fixture
def base(tmp_path, data_cache):
    return _base(str(tmp_path / "a"), data_cache)


def _train(config):
    metrics = experiment.run(config)
    keras.backend.clear_session(free_memory=False)
    weights = checkpoint_weights(config.model_dir)
    assert sum("_trainable_variables" in k for k in weights) == 4  # two kernels, two biases
    return metrics, weights


@pytest.fixture(scope="module")
def plain_step(tmp_path_factory, data_cache):
    """(metrics, weights, model_dir) of ``base`` trained with the plain step, once per module: the deterministic run
    the accumulated, XLA-compiled and clipped steps are compared with (issue 54: each trained it again)."""
    config = _base(str(tmp_path_factory.mktemp("plain") / "a"), data_cache)
    return (*_train(config), config.model_dir)


def test_gradient_accumulation_equals_the_full_batch_step(base, plain_step, tmp_path):
    full_metrics, full, _ = plain_step
    accum_metrics, accum = _train(dataclasses.replace(base, model_dir=str(tmp_path / "b"), grad_accum_steps=4))
    assert accum_metrics["train_loss"] == pytest.approx(full_metrics["train_loss"], rel=1e-5)
    for name in full:
        np.testing.assert_allclose(accum[name], full[name], rtol=1e-5, atol=1e-6, err_msg=name)


class _ZeroTrainWeightsEvenEvalWeights(records.Examples):
    """Train examples of weight 0; eval examples of weight 1 for an even digit, 0 for an odd one."""

    def example(self, serialized, split, key, seed=None):
        x, y = super().example(serialized, split, key, seed)
        return x, y, tf.zeros([]) if seed is not None else tf.cast(y % 2 == 0, tf.float32)


@register_task("test_weighted_classification")
class _WeightedClassification(ClassificationTask):
    def examples(self):
        return _ZeroTrainWeightsEvenEvalWeights(InputConfig.of(self.config, self.batches_per_step(self.config)), self.info)


def test_sample_weights_from_a_tasks_records_weight_the_loss_and_the_evaluation(base, data_cache):
    """Keras' (x, y, sample_weight): examples of weight 0 add nothing to the loss, evaluation counts the weighted."""
    from tfgpu.data.sources import builtin

    metrics, _ = _train(dataclasses.replace(base, task="test_weighted_classification", eval_split="val",
                                            train_steps=2, steps_per_loop=2))
    assert metrics["train_loss"] == 0 and metrics["train_accuracy"] == 0
    val_digits = builtin.load_builtin("digits")["splits"]["val"][1]
    assert metrics["val_examples"] == int(np.sum(val_digits % 2 == 0)) < len(val_digits)


@pytest.mark.parametrize("grad_accum_steps", [1, 4])
def test_the_xla_step_trains_as_the_plain_step(base, plain_step, tmp_path, grad_accum_steps):
    """--jit_compile=true compiles the forward and backward pass, micro-batches included, into the same step."""
    plain_metrics, plain, _ = plain_step
    xla_metrics, xla = _train(dataclasses.replace(base, model_dir=str(tmp_path / "b"), jit_compile=True,
                                                  grad_accum_steps=grad_accum_steps))
    assert xla_metrics["train_loss"] == pytest.approx(plain_metrics["train_loss"], rel=1e-4)
    assert xla_metrics["train_nonfinite_steps"] == 0
    for name in plain:
        np.testing.assert_allclose(xla[name], plain[name], rtol=1e-4, atol=1e-5, err_msg=name)


def test_global_norm_clipping_limits_the_update(base, plain_step, tmp_path):
    _, free, free_dir = plain_step
    metrics, clipped = _train(dataclasses.replace(base, model_dir=str(tmp_path / "b"), grad_clip_norm=0.05))
    assert metrics["train_grad_norm"] > 0.05  # the measured norm is the unclipped one
    kernels = [k for k in free if "_trainable_variables" in k]
    assert any(not np.allclose(free[k], clipped[k], atol=1e-4) for k in kernels)
    with open(f"{free_dir}/history.jsonl") as f:
        assert all("grad_norm" not in json.loads(line) for line in f)  # only measured when clipping


@pytest.mark.parametrize("precision", ["float32", "mixed_bfloat16"])
def test_200_skipped_steps_leave_every_variable_bit_identical(base, tmp_path, precision):
    """Without float16 there is no loss scale to back off: 200 poisoned steps (Keras' scale-1 guard reached 0
    after about 150 and then wrote NaN) leave every variable of the model and optimizer (weights, slots,
    iterations, BatchNorm statistics, the scale) bit-identical, and the next finite step trains finitely."""
    import tensorflow as tf

    config = dataclasses.replace(base, model="small_cnn", model_dir=str(tmp_path / "nan"), weight_decay=0.0,
                                 precision=precision, global_batch_size=16)
    try:
        built = experiment.setup(config)
        built.trainer.restore()
        task, strategy = built.task, built.placement.strategy
        labels = np.arange(16) % 10
        rng = np.random.default_rng(0)

        @tf.function
        def run(images, n):
            skipped = tf.constant(0.0)
            for _ in tf.range(n):
                skipped += strategy.run(task.train_step, args=((images, labels),))["nonfinite_steps"]
            return skipped

        def steps(images, n):
            return run(tf.constant(images), tf.constant(n))

        steps(rng.normal(size=(16, 8, 8, 1)).astype(np.float32), 3)  # slots and BN statistics away from init
        state = task.model.variables + task.optimizer.variables
        assert any("moving_mean" in v.path for v in state) and any("momentum" in v.path for v in state)
        before = [v.numpy().copy() for v in state]
        assert float(steps(np.full((16, 8, 8, 1), np.nan, np.float32), 200)) == 200.0
        for var, value in zip(state, before):
            np.testing.assert_array_equal(var.numpy(), value, err_msg=var.path)
        assert float(steps(rng.normal(size=(16, 8, 8, 1)).astype(np.float32), 1)) == 0.0
        assert all(np.isfinite(v.numpy()).all() for v in state)
        assert any(not np.array_equal(v.numpy(), b) for v, b in zip(state, before))
    finally:
        keras.backend.clear_session(free_memory=False)
        keras.mixed_precision.set_global_policy("float32")


# -- fine-tuning: --init_weights, --init_skip_mismatch, --freeze, --unfreeze_at_step ---------------------------
_FIRST_BLOCK = "^(conv2d|batch_normalization)$"  # small_cnn's first conv and its BatchNorm


def _pretrained(path, num_classes=10, seed=3):
    """small_cnn weights as a plain Keras script saves them, every value (BN statistics too) away from init."""
    from tfgpu.models.small_cnn import small_cnn

    # Layer names as a fresh script gets them, whatever ran before in this process.
    keras.backend.clear_session(free_memory=False)
    keras.utils.set_random_seed(seed)
    model = small_cnn((8, 8, 1), num_classes)
    rng = np.random.default_rng(seed)
    model.set_weights([np.abs(rng.normal(1.0, 0.2, w.shape)).astype("float32") if "variance" in v.path else
                       rng.normal(0.0, 0.3, w.shape).astype("float32")
                       for v, w in zip(model.weights, model.get_weights())])
    model.save_weights(str(path))
    keras.backend.clear_session(free_memory=False)
    return {layer.name: layer.get_weights() for layer in model.layers if layer.weights}


@pytest.fixture
def finetune(tmp_path, data_cache):
    return Config(model_dir=str(tmp_path / "run"), dataset="digits", data_cache_dir=data_cache, model="small_cnn",
                  global_batch_size=32, train_steps=4, steps_per_loop=4, deterministic=True, eval_split="none",
                  tensorboard=False, verbose=0, lr_schedule="constant", weight_decay=1e-3,
                  init_weights=str(tmp_path / "pretrained.weights.h5"))


def _train_in_process(config):
    """Trains like python -m tfgpu.train (without export and report); returns (final metrics, layer weights)."""
    try:
        built = experiment.setup(config)
        metrics = built.trainer.train().to_dict()  # as metrics.json holds them
        return metrics, {layer.name: layer.get_weights() for layer in built.task.model.layers if layer.weights}
    finally:
        keras.backend.clear_session(free_memory=False)


def _equal(a, b) -> bool:
    return len(a) == len(b) and all(np.array_equal(x, y) for x, y in zip(a, b))


def test_evaluation_before_the_first_step_equals_plain_keras_evaluate(finetune):
    """The same weights and the same eval pixels (tfgpu's eval dataset, whatever its input range) give the same
    loss and accuracy in tfgpu's evaluation at step 0 and in Keras' model.evaluate."""
    import tensorflow as tf

    from tfgpu.data.input import pipeline
    from tfgpu.models.small_cnn import small_cnn

    _pretrained(finetune.init_weights)
    config = dataclasses.replace(finetune, eval_split="val")
    try:
        built = experiment.setup(config)
        assert built.trainer.start_weights() == 0
        ours = built.trainer.evaluate(0, record=False)
        steps = pipeline.eval_steps(config, built.info, 1, 1)
        batches = list(pipeline.eval_dataset_fn(config, built.info, steps)(tf.distribute.InputContext()))
    finally:
        keras.backend.clear_session(free_memory=False)
    keep = np.concatenate([w.numpy() for _, _, w in batches]) > 0
    images = np.concatenate([x.numpy() for x, _, _ in batches])[keep]
    labels = np.concatenate([y.numpy() for _, y, _ in batches])[keep]
    plain = small_cnn((8, 8, 1), 10)
    plain.load_weights(finetune.init_weights)
    plain.compile(loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
    loss, accuracy = plain.evaluate(images, labels, batch_size=64, verbose=0)
    keras.backend.clear_session(free_memory=False)
    assert ours["val_examples"] == len(labels) == 359
    assert ours["val_loss"] == pytest.approx(loss, rel=1e-5)
    assert ours["val_accuracy"] == pytest.approx(accuracy, abs=1e-7)


def test_a_new_head_needs_skip_mismatch_and_a_resume_restores_instead_of_reloading(finetune, tmp_path):
    pretrained = _pretrained(finetune.init_weights, num_classes=3)
    with pytest.raises(ConfigError) as e:
        _train_in_process(finetune)
    assert "\n" not in str(e.value) and "layer logits: weight kernel has shape (64, 3) in the file, (64, 10)" in \
        str(e.value)
    config = dataclasses.replace(finetune, init_skip_mismatch=True, train_steps=2, steps_per_loop=2, freeze="^conv2d$")
    _, trained = _train_in_process(config)
    assert _equal(trained["conv2d"], pretrained["conv2d"])  # frozen: still the file's
    os.remove(finetune.init_weights)  # a resumed run neither needs nor reads the file
    try:
        built = experiment.setup(dataclasses.replace(config, train_steps=4))
        assert built.trainer.start_weights() == 2
        restored = {layer.name: layer.get_weights() for layer in built.task.model.layers if layer.weights}
    finally:
        keras.backend.clear_session(free_memory=False)
    assert all(_equal(restored[name], trained[name]) for name in trained)
    assert not _equal(trained["conv2d_1"], pretrained["conv2d_1"])  # so a reload would have shown


@pytest.mark.parametrize("optimizer", ["sgd", pytest.param("adamw", marks=pytest.mark.slow)])
def test_frozen_layers_stay_bit_identical_and_the_count_says_what_trains(finetune, optimizer):
    """No gradient, momentum, weight decay (L2 for sgd, decoupled for adamw) or BatchNorm statistics update
    reaches a frozen layer; the others train."""
    pretrained = _pretrained(finetune.init_weights)
    metrics, trained = _train_in_process(dataclasses.replace(finetune, freeze=_FIRST_BLOCK, optimizer=optimizer))
    for name in ("conv2d", "batch_normalization"):
        assert _equal(trained[name], pretrained[name]), name
    for name in ("conv2d_1", "batch_normalization_1", "logits"):
        assert all(not np.array_equal(a, b) for a, b in zip(trained[name], pretrained[name])), name
    frozen = 3 * 3 * 1 * 32 + 2 * 32  # the first conv's kernel, the BatchNorm's gamma and beta
    assert metrics["parameters"] == metrics["trainable_parameters"] + frozen == 19562


def _first_kernel(model_dir, step):
    """small_cnn's first conv kernel (the only model variable of shape (3, 3, 1, 32)) in a checkpoint."""
    import tensorflow as tf

    reader = tf.train.load_checkpoint(run_dir.checkpoint(model_dir, step))
    found = [reader.get_tensor(name) for name, shape in reader.get_variable_to_shape_map().items()
             if shape == [3, 3, 1, 32] and ("_trainable_variables" in name or name.startswith("model/"))]
    assert len(found) == 1, reader.get_variable_to_shape_map()
    return found[0]


def test_unfreeze_at_step_trains_every_layer_from_that_step(finetune):
    pretrained = _pretrained(finetune.init_weights)
    config = dataclasses.replace(finetune, freeze=_FIRST_BLOCK, unfreeze_at_step=2, checkpoint_every_steps=2)
    metrics, trained = _train_in_process(config)
    np.testing.assert_array_equal(_first_kernel(config.model_dir, 2), pretrained["conv2d"][0])  # steps 0, 1
    assert not np.array_equal(trained["conv2d"][0], pretrained["conv2d"][0])  # steps 2, 3
    assert metrics["trainable_parameters"] == metrics["parameters"] == 19562
    assert metrics["trainable_parameters_before_unfreeze"] == 19562 - 352


@pytest.mark.slow  # three training runs
def test_a_resume_on_either_side_of_the_unfreeze_step_is_exact(finetune, tmp_path):
    _pretrained(finetune.init_weights)
    config = dataclasses.replace(finetune, freeze=_FIRST_BLOCK, unfreeze_at_step=2)
    _, straight = _train_in_process(config)
    for stop in (2, 3):  # at the unfreeze step (the restore unfreezes), and after it
        resumed = dataclasses.replace(config, model_dir=str(tmp_path / f"stopped_at_{stop}"))
        _train_in_process(dataclasses.replace(resumed, train_steps=stop))
        _, continued = _train_in_process(resumed)
        assert all(_equal(continued[name], straight[name]) for name in straight), stop


@pytest.mark.parametrize("args, expected", [
    (["--init_weights={tmp}/missing.weights.h5"], "error: --init_weights: {tmp}/missing.weights.h5: no such file"),
    (["--init_weights={tmp}/weights.npz"], "error: --init_weights: {tmp}/weights.npz: expected a local .weights.h5"),
    (["--freeze=^nothing$"], "error: --freeze: '^nothing$' matches no layer name of the model (its layers: "),
    (["--task=gan", "--model=dcgan", "--latent_dim=16", "--init_weights={tmp}/g.weights.h5"],
     "error: --init_weights: --task=gan does not support it (classification does)"),
    (["--task=gan", "--model=dcgan", "--latent_dim=16", "--freeze=conv"],
     "error: --freeze: --task=gan does not support it (classification does)"),
])
def test_bad_fine_tuning_flags_are_one_line_before_training(train_here, tmp_path, args, expected):
    tmp = str(tmp_path)
    result = train_here("--dataset=digits", "--model=small_cnn", "--global_batch_size=16", "--train_steps=2",
                        "--eval_split=none", f"--model_dir={tmp}/run", *(a.format(tmp=tmp) for a in args),
                        check=False)
    errors = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert result.returncode == 1 and len(errors) == 1 and errors[0].startswith(expected.format(tmp=tmp))
    assert "Traceback" not in result.output
    assert not os.path.exists(run_dir.checkpoints(os.path.join(tmp, "run")))  # refused before a step or checkpoint


# -- a softmax head on the user's model (issue 28 item 8) ------------------------------------------------------------
@register_model("test_mlp_softmax_head")
def _mlp_softmax_head(input_shape, num_classes, **_):
    """test_mlp_without_bn's layers, created in the same order (so the same initial weights), ending in a softmax."""
    inputs = keras.Input(input_shape)
    x = keras.layers.Dense(32, activation="relu")(keras.layers.Flatten()(inputs))
    return keras.Model(inputs, keras.layers.Dense(num_classes, activation="softmax")(x))


def test_a_softmax_head_trains_and_evaluates_exactly_as_the_same_model_giving_logits(base, tmp_path, caplog,
                                                                                     monkeypatch):
    """Without the head check the softmax model learned against softmax(softmax(x)): a different loss from step 1."""
    monkeypatch.setattr(experiment, "_write_report", lambda model_dir: None)  # its plots take seconds
    evaluated = dict(eval_split="", eval_every_steps=6)
    logits_metrics, logits_weights = _train(dataclasses.replace(base, **evaluated))
    softmax = dataclasses.replace(base, model_dir=str(tmp_path / "b"), model="test_mlp_softmax_head", **evaluated)
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="tfgpu"):
        softmax_metrics, softmax_weights = _train(softmax)
    said = [r.getMessage() for r in caplog.records if "ends in a softmax" in r.getMessage()]
    assert said == ["model test_mlp_softmax_head ends in a softmax (layer 'dense_1'): it gives probabilities (as its "
                    "export does); the loss is computed from the logits that softmax takes (the same weights), in "
                    "float32 (metrics.json: model_output=probabilities)"]
    for name in ("train_loss", "val_loss", "val_accuracy"):
        assert softmax_metrics[name] == pytest.approx(logits_metrics[name], rel=1e-5), name
    for ours, theirs in zip(sorted(softmax_weights), sorted(logits_weights)):
        np.testing.assert_allclose(softmax_weights[ours], logits_weights[theirs], rtol=1e-5, atol=1e-6)
    assert (logits_metrics["model_output"], logits_metrics["loss_from"]) == ("logits", "logits")
    assert (softmax_metrics["model_output"], softmax_metrics["loss_from"]) == ("probabilities", "pre_softmax_logits")
    with open(os.path.join(softmax.model_dir, "export", "model.input.json")) as f:
        assert json.load(f)["output"]["kind"] == "probabilities"
    exported = keras.saving.load_model(os.path.join(softmax.model_dir, "export", "model.keras"))
    probabilities = exported(np.random.default_rng(0).uniform(-1, 1, (4, 8, 8, 1)).astype("float32"))
    np.testing.assert_allclose(np.sum(probabilities, -1), 1.0, rtol=1e-5)  # the user's model, softmax and all


def _classifier(*layers_in_order, input_shape=(8, 8, 1)):
    inputs = keras.Input(input_shape)
    x = inputs
    for layer in layers_in_order:
        x = layer(x)
    return keras.Model(inputs, x)


@pytest.mark.parametrize("activation", ["sigmoid", "hard_sigmoid"])
def test_a_sigmoid_head_is_one_line_naming_model(activation):
    model = _classifier(keras.layers.Flatten(), keras.layers.Dense(10, activation=activation, name="scores"))
    with pytest.raises(ConfigError) as error:
        check_model(model, "net.py:build", 10, (-1.0, 1.0))
    assert str(error.value) == (
        f"--model: net.py:build ends in a {activation} (layer 'scores'), which scores each of the 10 classes on its "
        "own; the classification task trains one softmax over them: remove the activation (activation=None, "
        "logits) or end in softmax")


@pytest.mark.parametrize("input_range, refused", [((-1.0, 1.0), True), ((0.0, 1.0), True), ((0.0, 255.0), False)])
def test_a_leading_rescaling_to_0_1_needs_input_range_0_255(input_range, refused):
    model = _classifier(keras.layers.Rescaling(1.0 / 255, name="scale"), keras.layers.Flatten(), keras.layers.Dense(10))
    if not refused:
        assert check_model(model, "net.py:build", 10, input_range).activation is None
        return
    with pytest.raises(ConfigError) as error:
        check_model(model, "net.py:build", 10, input_range)
    low, high = input_range
    assert str(error.value) == (
        "--input_range: net.py:build begins with Rescaling(scale=0.00392157, offset=0) (layer 'scale'), so it "
        f"expects pixels in 0..255, but --input_range={low:g},{high:g} feeds it {low:g}..{high:g}: set "
        "--input_range=0,255")


# A keras-io style model, copied as tutorials write it: pixels 0..255 in, probabilities out.
TUTORIAL = """
import keras
from keras import layers


def tutorial(input_shape, num_classes):
    return keras.Sequential([keras.Input(input_shape), layers.Rescaling(1.0 / 255), layers.Flatten(),
                             layers.Dense(32, activation="relu"), layers.Dense(num_classes, activation="softmax")])


def multi_label(input_shape, num_classes):
    inputs = keras.Input(input_shape)
    return keras.Model(inputs, layers.Dense(num_classes, activation="sigmoid")(layers.Flatten()(inputs)))
"""


@pytest.mark.parametrize("function, expected", [
    ("tutorial", "error: --input_range: {file}:tutorial begins with Rescaling(scale=0.00392157, offset=0) "
                     "(layer 'rescaling'), so it expects pixels in 0..255, but --input_range=-1,1 feeds it -1..1: "
                     "set --input_range=0,255"),
    ("multi_label", "error: --model: {file}:multi_label ends in a sigmoid (layer 'dense'), which scores each of "
                        "the 10 classes on its own"),
])
def test_a_users_model_with_the_wrong_ends_stops_before_training_in_one_line(train_here, tmp_path, function, expected):
    file = tmp_path / "tutorial_model.py"
    file.write_text(TUTORIAL)
    result = train_here("--dataset=digits", f"--model={file}:{function}", "--global_batch_size=16",
                        "--train_steps=2", "--eval_split=none", f"--model_dir={tmp_path}/run", check=False)
    errors = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert result.returncode == 1 and len(errors) == 1 and errors[0].startswith(expected.format(file=file))
    assert "Traceback" not in result.output
    assert not os.path.exists(tmp_path / "run" / run_dir.CHECKPOINTS_DIR)


HEADS = """
import keras
import tensorflow as tf
from keras import layers


@keras.saving.register_keras_serializable(package="tfgpu_test_heads")
class Net(keras.Model):
    \"\"\"A subclassed model: its softmax, if any, is inside call, where no layer walk sees it.\"\"\"

    def __init__(self, num_classes, softmax=False, **kwargs):
        super().__init__(**kwargs)
        self.num_classes, self.softmax = num_classes, softmax
        self.flatten, self.hidden = layers.Flatten(), layers.Dense(64, activation="relu")
        self.out = layers.Dense(num_classes)

    def call(self, x):
        logits = self.out(self.hidden(self.flatten(x)))
        return tf.nn.softmax(logits) if self.softmax else logits

    def get_config(self):
        return {**super().get_config(), "num_classes": self.num_classes, "softmax": self.softmax}


def subclassed_logits(input_shape, num_classes):
    return Net(num_classes)


def subclassed_softmax(input_shape, num_classes):
    return Net(num_classes, softmax=True)
"""


@pytest.mark.slow  # two runs of 60 steps
def test_a_subclassed_softmax_trains_from_its_probabilities_like_the_same_model_giving_logits(train_here, tmp_path):
    """Its softmax cannot be separated, so the loss is taken from the probabilities in float32: 60 steps on digits
    reach the accuracy and loss of the logits model (before the check, softmax(softmax(x)): 0.20 against 0.84)."""
    file = tmp_path / "heads_models.py"
    file.write_text(HEADS)
    metrics = {}
    for function in ("subclassed_logits", "subclassed_softmax"):
        model_dir = tmp_path / function
        train_here("--dataset=digits", f"--model={file}:{function}", "--global_batch_size=32", "--train_steps=60",
                   "--steps_per_loop=20", "--deterministic", "--lr_schedule=constant", "--base_learning_rate=0.05",
                   f"--model_dir={model_dir}", "--tensorboard=false")
        with open(model_dir / "metrics.json") as f:
            metrics[function] = json.load(f)
    logits, softmax = metrics["subclassed_logits"], metrics["subclassed_softmax"]
    assert logits["val_accuracy"] > 0.8
    assert (softmax["val_accuracy"], softmax["val_loss"]) == pytest.approx((logits["val_accuracy"], logits["val_loss"]),
                                                                           rel=1e-3)
    assert (softmax["model_output"], softmax["loss_from"]) == ("probabilities", "probabilities")
