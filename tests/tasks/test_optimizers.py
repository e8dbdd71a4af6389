"""Learning-rate scaling and schedules, weight decay that skips BN/bias, global-norm clipping."""
import dataclasses

import keras
import numpy as np
import pytest
import tensorflow as tf

from tfgpu.tasks import optimizers
from tfgpu.config import Config, ConfigError

BASE = Config(model_dir="unused", dataset="digits", global_batch_size=1024, base_learning_rate=0.1)


def test_peak_learning_rate_scales_linearly_with_global_batch():
    assert optimizers.peak_learning_rate(BASE) == pytest.approx(0.4)
    assert optimizers.peak_learning_rate(dataclasses.replace(BASE, global_batch_size=256)) == pytest.approx(0.1)


def test_warmup_then_cosine_to_zero():
    schedule = optimizers.learning_rate_schedule(dataclasses.replace(BASE, warmup_epochs=5), 1000, 10.0, 1024)
    lrs = [float(schedule(s)) for s in (0, 24, 49, 50, 525, 999)]
    assert lrs[0] == pytest.approx(0.4 / 50) and lrs[1] == pytest.approx(0.4 * 25 / 50)
    assert lrs[2] == pytest.approx(0.4) and lrs[3] == pytest.approx(0.4)
    assert lrs[4] == pytest.approx(0.2, rel=1e-3) and lrs[5] < 1e-5


def test_step_schedule_decays_at_epoch_boundaries():
    config = dataclasses.replace(BASE, lr_schedule="step", lr_decay_epochs=(30.0, 60.0), lr_decay_factor=0.1)
    schedule = optimizers.learning_rate_schedule(config, 900, 10.0, 1024)
    assert [round(float(schedule(s)), 6) for s in (0, 299, 300, 599, 600)] == [0.4, 0.4, 0.04, 0.04, 0.004]


@pytest.mark.parametrize("warmup,decay_points", [("50", "300,600"), ("5ep", "30ep,60ep"),
                                                 ("51200ex", "307200examples,614400ex")])
def test_warmup_and_decay_points_in_steps_epochs_or_examples_give_the_older_flags_schedule(warmup, decay_points):
    """10 steps of 1024 examples per epoch: 5 epochs of warmup are 50 steps, decay at 30 and 60 epochs."""
    older = dataclasses.replace(BASE, lr_schedule="step", warmup_epochs=5, lr_decay_epochs=(30.0, 60.0))
    newer = dataclasses.replace(BASE, lr_schedule="step", warmup=warmup, lr_decay_at=decay_points)
    expected = optimizers.learning_rate_schedule(older, 900, 10.0, 1024).get_config()
    assert optimizers.learning_rate_schedule(newer, 900, 10.0, 1024).get_config() == expected
    assert expected["warmup_steps"] == 50 and expected["boundaries"] == [300, 600]


def test_after_a_batch_change_warmup_and_decay_in_epochs_end_where_those_epochs_records_do():
    """10 steps of 512 (5,120 of 10,240 records an epoch), resumed at 1024 (10 steps an epoch): the first epoch
    ends at step 15, the second at 25 (counted at the new batch from step 0: 10 and 20)."""
    config = dataclasses.replace(BASE, lr_schedule="step", warmup="1ep", lr_decay_at="2ep,40960ex")
    schedule = optimizers.learning_rate_schedule(config, 60, 10.0, 1024, resumed=(10, 5120)).get_config()
    assert (schedule["warmup_steps"], schedule["boundaries"]) == (15, [25, 45])
    fresh = optimizers.learning_rate_schedule(config, 60, 10.0, 1024).get_config()
    assert (fresh["warmup_steps"], fresh["boundaries"]) == (10, [20, 40])


def test_an_unknown_schedule_name_raises_naming_the_flag_instead_of_a_constant_rate():
    with pytest.raises(ConfigError, match="^--lr_schedule: unknown schedule 'cosin'; known: cosine, step, constant$"):
        optimizers.WarmupSchedule(0.1, 100, kind="cosin")
    saved = optimizers.WarmupSchedule(0.1, 100).get_config()
    with pytest.raises(ConfigError, match="--lr_schedule: unknown schedule 'linear'"):
        optimizers.WarmupSchedule.from_config({**saved, "kind": "linear"})


def _flag(name):
    (field,) = [f for f in dataclasses.fields(Config) if f.name == name]
    return field.metadata["choices"], field.metadata["help"]


@pytest.mark.parametrize("flag,registry", [("lr_schedule", optimizers.SCHEDULES),
                                           ("optimizer", optimizers.OPTIMIZERS)])
def test_every_name_the_flag_offers_is_registered_and_its_help_names_each(flag, registry):
    choices, help_text = _flag(flag)
    assert set(choices) == set(registry)
    assert all(name in help_text for name in registry), help_text


@pytest.mark.parametrize("name", sorted(optimizers.OPTIMIZERS))
def test_every_registered_optimizer_builds_and_moves_a_weight_against_its_gradient(name):
    config = dataclasses.replace(BASE, optimizer=name, weight_decay=1e-4)
    optimizer = optimizers.create_optimizer(config, 0.1)
    weight = keras.Variable(np.ones((2, 2), "float32"))
    optimizer.build([weight])
    optimizer.apply_gradients([(tf.ones((2, 2)), weight)])
    assert np.all(weight.numpy() < 1.0)
    decoupled = optimizers.OPTIMIZERS[name].decoupled_decay
    penalty = optimizers.l2_term(optimizers.l2_coefficient(config), [weight], 1)
    assert float(penalty) == (0.0 if decoupled else pytest.approx(0.5 * 1e-4 * float(tf.reduce_sum(tf.square(weight)))))


def test_an_unknown_optimizer_name_raises_naming_the_flag():
    known = ", ".join(optimizers.OPTIMIZERS)
    with pytest.raises(ConfigError, match=f"^--optimizer: unknown optimizer 'lamb'; known: {known}$"):
        optimizers.create_optimizer(dataclasses.replace(BASE, optimizer="lamb"), 0.1)


def test_the_l2_term_adds_wd_times_w_to_kernels_only():
    config = dataclasses.replace(BASE, weight_decay=1e-2)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(4), keras.layers.BatchNormalization()])
    with tf.GradientTape() as tape:
        penalty = optimizers.l2_term(optimizers.l2_coefficient(config), model.trainable_variables, num_replicas=2)
    grads = tape.gradient(penalty, model.trainable_variables)
    for var, grad in zip(model.trainable_variables, grads):
        if len(var.shape) > 1:
            np.testing.assert_allclose(2 * grad, 1e-2 * var.numpy(), rtol=1e-6)  # summed over 2 replicas
        else:
            assert grad is None  # bias, BN gamma and beta never decay
    adamw = optimizers.l2_coefficient(dataclasses.replace(config, optimizer="adamw"))
    assert float(optimizers.l2_term(adamw, model.variables, 1)) == 0


def test_adamw_excludes_bn_and_bias_from_decoupled_decay():
    config = dataclasses.replace(BASE, optimizer="adamw", weight_decay=0.5)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    opt = optimizers.create_optimizer(config, 0.1)
    optimizers.exclude_from_decay(opt, model.trainable_variables)
    kernel, bias = (v.numpy().copy() for v in model.trainable_variables)
    model.trainable_variables[1].assign(np.ones(2, np.float32))
    opt.apply([tf.zeros_like(v) for v in model.trainable_variables], model.trainable_variables)
    np.testing.assert_allclose(model.trainable_variables[0].numpy(), kernel * (1 - 0.1 * 0.5), rtol=1e-6)
    np.testing.assert_allclose(model.trainable_variables[1].numpy(), np.ones(2))
