"""tfgpu.tasks.gan.evaluation: FID/KID on the chief, sample grids, the EMA generator's own BatchNorm statistics."""
import json
import os

import keras
import numpy as np
import pytest

from tests.tasks.gan.test_task import _batch, make_task  # noqa: F401 (fixture)
from tfgpu.tasks.gan import fid
from tfgpu.tasks.base import EvalRun, Stopped


class _CountedFeatures(fid.FeatureExtractor):
    """Stands in for the feature classifier (training one takes seconds): the images' pixels as features,
    counting the batches; ``on_batch`` runs inside each (a signal arriving while a batch is scored)."""
    name = "pixels"

    def __init__(self, on_batch=lambda: None):
        self.batches = 0
        self.on_batch = on_batch

    def _features(self, images):
        self.batches += 1
        self.on_batch()
        return np.reshape(images, (len(images), -1))[:, :16]


def test_a_stop_signal_during_fid_ends_the_evaluation_after_the_batch_in_flight(make_task, tmp_path):
    """A SIGTERM while the chief scored FID was seen only once every sample of every score was drawn and scored
    (minutes with InceptionV3 on a CPU, past a cluster's grace period). Now the batch in flight finishes, nothing
    else is computed or written, and ``Stopped`` lets the trainer save and stop."""
    import signal

    import tensorflow as tf

    from tfgpu.training import loop

    # 4 batches of 256 per score; no EMA, whose BatchNorm statistics take seconds of a loaded CPU before any score
    task, _ = make_task(fid_num_samples=1000, ema_decay=0.0, tensorboard=False)
    model_dir = str(tmp_path / "run")
    task._real_features = np.random.default_rng(0).normal(size=(1000, 16)).astype(np.float32)
    stop = loop.StopFlag(tf.distribute.get_strategy(), 1)
    task._extractor = features = _CountedFeatures(on_batch=lambda: stop.request(signal.SIGTERM))
    with pytest.raises(Stopped):
        task.evaluate(EvalRun(lambda: {}, stop), 4, model_dir)
    assert features.batches == 1 and not os.path.exists(os.path.join(model_dir, "samples"))
    assert float(task.state.fid_initial.numpy()) < 0  # no score recorded from part of the samples


@pytest.mark.slow
def test_evaluation_scores_the_untrained_generator_and_writes_a_grid(make_task, tmp_path):
    """At step 0 the EMA generator is the untrained one: fid == fid_initial, same extractor and count."""
    task, _ = make_task(fid_num_samples=300)
    model_dir = str(tmp_path / "run")
    os.makedirs(model_dir, exist_ok=True)
    metrics = task.evaluate(EvalRun(None, None), 0, model_dir)
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

    from tfgpu.config import TrainerConfig
    from tfgpu.tasks.registry import input_config
    from tfgpu.training.trainer import Trainer

    task, _ = make_task(eval_every_steps=4, checkpoint_every_steps=0)
    info = dataclasses.replace(task.info, eval_split="")
    trainer = Trainer(TrainerConfig.of(task.config), input_config(task.config), task.placement, task, info,
                      total_steps=10)
    assert trainer._boundaries() == [4, 8, 10]


# Slow: (21 s loaded); the GAN evaluation path stays in the default suite through the FID tests and the step test above.
@pytest.mark.slow
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


@pytest.mark.slow
def test_a_gan_run_on_ram_evaluates_and_resumes_there(train_here, tmp_path, monkeypatch):
    """--model_dir on a TensorFlow file system (ram://, standing in for gs://), in this process (ram:// lives in
    one): the feature classifier is trained into <model_dir>/fid_features there and reused on resume, the sample
    grids and metrics land there, and nothing is written in the working directory (a "ram://" path written
    through os would appear there as ./ram:)."""
    import uuid

    from tfgpu.runtime import fileio
    from tfgpu.tasks.gan import fid

    train_classifier = fid.train_feature_classifier
    monkeypatch.setattr(fid, "train_feature_classifier",  # one epoch: the files matter here, not the features
                        lambda *args, **kwargs: train_classifier(*args, **{**kwargs, "epochs": 1}))
    monkeypatch.chdir(tmp_path)
    model_dir = f"ram://tfgpu-test-{uuid.uuid4().hex[:8]}/gan"
    common = ["--task=gan", "--dataset=digits", "--model=dcgan", "--global_batch_size=16", "--latent_dim=8",
              "--steps_per_loop=1", "--fid_num_samples=64", "--tensorboard=false", f"--model_dir={model_dir}"]
    try:
        first = train_here(*common, "--train_steps=1")
        second = train_here(*common, "--train_steps=2")
        assert "training a feature classifier" in first.output
        assert "training a feature classifier" not in second.output and "resuming at step 1" in second.output
        metrics = json.loads(fileio.read_bytes(f"{model_dir}/metrics.json"))
        assert metrics["step"] == 2 and metrics["fid"] > 0
        assert metrics["samples"] == f"{model_dir}/samples/step_2.png" and fileio.isfile(metrics["samples"])
        assert metrics["feature_extractor"].startswith(f"classifier_penultimate:{model_dir}/fid_features/")
        assert fileio.listdir(f"{model_dir}/fid_features/export") == ["model.keras"]
        assert os.listdir(tmp_path) == []
    finally:
        fileio.rmtree(model_dir.rsplit("/", 1)[0])


@pytest.mark.slow  # a GAN run in-process (about 20 s on 2 loaded cores)
def test_a_sigterm_during_fid_saves_at_the_evaluated_step_and_records_no_evaluation(tmp_path, data_cache,
                                                                                     monkeypatch):
    """Through the trainer: the stop during the chief's FID at step 2 is a checkpoint at step 2 and
    ``Preempted`` (exit 143), no evaluation recorded from part of it."""
    import signal

    import keras

    from tests.conftest import read_history
    from tfgpu import config_sources
    from tfgpu.tasks.gan.task import GanTask
    from tfgpu.runtime import failures
    from tfgpu.training import checkpoint, experiment

    config = config_sources.build(task="gan", model="dcgan", dataset="digits", model_dir=str(tmp_path / "run"),
                                  data_cache_dir=data_cache, global_batch_size=8, latent_dim=8, seed=3,
                                  train_steps=4, steps_per_loop=2, eval_every_steps=2, checkpoint_every_steps=0,
                                  fid_num_samples=600, ema_decay=0.0, tensorboard=False, verbose=0)
    monkeypatch.setattr(experiment, "_write_report", lambda model_dir: None)
    built = experiment.setup(config)
    features = _CountedFeatures(on_batch=lambda: built.trainer.stopping.flag.request(signal.SIGTERM))
    monkeypatch.setattr(GanTask, "feature_extractor", lambda self, model_dir, check_stop=None: features)
    monkeypatch.setattr(GanTask, "_real_feature_matrix", lambda self, extractor, check_stop=None:
                        np.zeros((600, 16), np.float32))
    try:
        with pytest.raises(failures.Preempted):
            built.trainer.train()
    finally:
        keras.backend.clear_session(free_memory=False)
    assert features.batches == 1
    assert checkpoint.latest(config.model_dir).endswith("ckpt-2")
    assert read_history(config.model_dir, "eval") == [] and read_history(config.model_dir)[-1]["step"] == 2
