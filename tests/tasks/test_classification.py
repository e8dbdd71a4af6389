"""What a classification step computes: micro-batch accumulation, clipping and smoothing, run in-process."""
import dataclasses
import json

import keras
import numpy as np
import pytest

from tests.conftest import checkpoint_weights
from tfgpu import experiment
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


def test_a_poisoned_step_is_skipped_without_touching_weights_slots_or_bn(base, tmp_path):
    import tensorflow as tf

    config = dataclasses.replace(base, model="small_cnn", model_dir=str(tmp_path / "nan"), weight_decay=0.0)
    built = experiment.setup(config)
    built.trainer.restore()
    task = built.task
    state = task.model.variables + [v for v in task.optimizer.variables if "iteration" not in v.path
                                    and "step_counter" not in v.path and "scale" not in v.path]
    before = [v.numpy().copy() for v in state]
    images = np.full((64, 8, 8, 1), np.nan, np.float32)
    labels = np.zeros(64, np.int64)
    step = tf.function(lambda batch: built.placement.strategy.run(task.train_step, args=(batch,)))
    out = step((images, labels))
    assert float(out["nonfinite_steps"]) == 1.0
    for var, value in zip(state, before):
        np.testing.assert_array_equal(var.numpy(), value, err_msg=var.path)
    good = step((np.zeros((64, 8, 8, 1), np.float32), labels))
    assert float(good["nonfinite_steps"]) == 0.0
    assert any(not np.array_equal(v.numpy(), b) for v, b in zip(state, before))
    keras.backend.clear_session()
