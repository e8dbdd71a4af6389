"""tfgpu.tasks.gan.evaluation: FID/KID on the chief, sample grids, the EMA generator's own BatchNorm statistics."""
import json
import os

import keras
import numpy as np
import pytest

from tests.tasks.gan.test_task import _batch, make_task  # noqa: F401 (fixture)


@pytest.mark.slow
def test_evaluation_scores_the_untrained_generator_and_writes_a_grid(make_task, tmp_path):
    """At step 0 the EMA generator is the untrained one: fid == fid_initial, same extractor and count."""
    task, _ = make_task(fid_num_samples=300)
    model_dir = str(tmp_path / "run")
    os.makedirs(model_dir, exist_ok=True)
    metrics = task.evaluate(None, 0, model_dir)
    assert metrics["fid"] == pytest.approx(metrics["fid_initial"], rel=1e-6) and metrics["fid"] > 0
    assert metrics["fid_num_samples"] == 300 and metrics["kid"] > 0
    assert metrics["feature_extractor"].startswith("classifier_penultimate:")
    assert "fid_features" in metrics["feature_extractor"] and metrics["feature_extractor_trained"] is True
    assert os.path.isfile(os.path.join(model_dir, "samples", "step_0.png"))
    with open(os.path.join(model_dir, "fid_features", "metrics.json")) as f:
        assert json.load(f)["val_accuracy"] > 0.85  # the extractor really knows digits


def test_fid_evaluations_keep_their_steps_without_an_eval_split(make_task):
    """A GAN scores FID/KID on its train split, so --eval_every_steps still ends loops when the data has no eval
    split (the trainer dropped those boundaries, and the GAN's evaluations silently never ran)."""
    import dataclasses

    from tfgpu.config import InputConfig, TrainerConfig
    from tfgpu.training.trainer import Trainer

    task, _ = make_task(eval_every_steps=4, checkpoint_every_steps=0)
    info = dataclasses.replace(task.info, eval_split="")
    trainer = Trainer(TrainerConfig.of(task.config), InputConfig.of(task.config), task.placement, task, info,
                      total_steps=10)
    assert trainer._boundaries() == [4, 8, 10]


def test_ema_generator_gets_batchnorm_statistics_of_its_own_weights(make_task):
    """The EMA weights come with BatchNorm statistics recomputed for them: the first BatchNorm's moving mean
    is the mean of its input (the EMA dense layer's output) over the fixed standing-statistics latents, not
    the raw generator's moving average copied into the EMA."""
    from tfgpu.tasks.gan.evaluation import STANDING_STATS_BATCHES

    task, step = make_task()
    step(_batch())
    weights = task.generator_weights()
    generator, _ = task._evaluation_generator()
    generator.set_weights(weights)
    norm = next(layer for layer in generator.layers if isinstance(layer, keras.layers.BatchNormalization))
    before_norm = keras.Model(generator.input, norm.input)
    z = np.concatenate([task._evaluation_latents(256, 256 * k, seed=3)[0] for k in range(STANDING_STATS_BATCHES)])
    expected = before_norm(z).numpy().mean(axis=(0, 1, 2))
    np.testing.assert_allclose(norm.moving_mean.numpy(), expected, rtol=1e-4, atol=1e-6)
    copied = [v.numpy() for v in task.state.ema][[w.path for w in generator.weights].index(norm.moving_mean.path)]
    assert not np.allclose(copied, expected, rtol=1e-2, atol=1e-4)
    assert task.generator_weights(ema=False)[0].shape == weights[0].shape  # the raw weights are unchanged
