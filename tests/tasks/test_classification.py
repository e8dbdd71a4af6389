"""What a classification step computes: micro-batch accumulation, clipping and smoothing, run in-process."""
import dataclasses
import json

import keras
import numpy as np
import pytest

from tests.conftest import checkpoint_weights
from tfgpu.training import experiment
from tfgpu.config import Config
from tfgpu.models import register_model


@register_model("test_mlp_without_bn")
def _mlp(input_shape, num_classes, **_):
    """No BatchNorm: its gradient does not depend on how the batch is split."""
    inputs = keras.Input(input_shape)
    x = keras.layers.Dense(32, activation="relu")(keras.layers.Flatten()(inputs))
    return keras.Model(inputs, keras.layers.Dense(num_classes)(x))


@pytest.fixture
def base(tmp_path, data_cache):
    return Config(model_dir=str(tmp_path / "a"), dataset="digits", data_cache_dir=data_cache,
                  model="test_mlp_without_bn", global_batch_size=64, train_steps=6, steps_per_loop=3,
                  deterministic=True, eval_split="none", tensorboard=False, verbose=0, lr_schedule="constant",
                  weight_decay=1e-3)


def _train(config):
    metrics = experiment.run(config)
    keras.backend.clear_session()
    weights = checkpoint_weights(config.model_dir)
    assert sum("_trainable_variables" in k for k in weights) == 4  # two kernels, two biases
    return metrics, weights


def test_gradient_accumulation_equals_the_full_batch_step(base, tmp_path):
    full_metrics, full = _train(base)
    accum_metrics, accum = _train(dataclasses.replace(base, model_dir=str(tmp_path / "b"), grad_accum_steps=4))
    assert accum_metrics["train_loss"] == pytest.approx(full_metrics["train_loss"], rel=1e-5)
    for name in full:
        np.testing.assert_allclose(accum[name], full[name], rtol=1e-5, atol=1e-6, err_msg=name)


def test_global_norm_clipping_limits_the_update(base, tmp_path):
    _, free = _train(base)
    metrics, clipped = _train(dataclasses.replace(base, model_dir=str(tmp_path / "b"), grad_clip_norm=0.05))
    assert metrics["train_grad_norm"] > 0.05  # the measured norm is the unclipped one
    kernels = [k for k in free if "_trainable_variables" in k]
    assert any(not np.allclose(free[k], clipped[k], atol=1e-4) for k in kernels)
    with open(f"{base.model_dir}/history.jsonl") as f:
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
        keras.backend.clear_session()
        keras.mixed_precision.set_global_policy("float32")
