"""The GAN's evaluation: FID/KID of the (EMA) generator against the train split on the chief, sample grids, the
EMA weights with BatchNorm statistics of their own, and the feature extractor FID is measured with.

A mixin of ``GanTask`` (``tfgpu.tasks.gan.task``): it reads the task's config, GAN options (``self.options``),
placement, networks and state.
Its files (the sample grids, the feature classifier in ``<model_dir>/fid_features``) go through
``tfgpu.runtime.fileio``, so ``model_dir`` may be on ``gs://`` or ``ram://``.
"""
import logging
import math
import os

import keras
import numpy as np
import tensorflow as tf

from tfgpu.config import ConfigError
from tfgpu.runtime import fileio
from tfgpu.runtime import feed as feed_lib
from tfgpu.runtime import run_dir
from tfgpu.tasks.base import Stopped

log = logging.getLogger("tfgpu")

SAMPLE_GRID_SIZE = 64
STANDING_STATS_BATCHES = 8  # x 256 latents: BatchNorm statistics recomputed for the EMA generator


class GanEvaluation:
    """FID/KID, samples and EMA weights of a ``GanTask``."""

    def evaluate(self, run_eval, step, model_dir):
        """FID and KID of the EMA generator (and, once per run, of the untrained one) against the train split,
        and a sample grid ``<model_dir>/samples/step_N.png``, computed on the chief.

        The other workers wait for the chief in a collective with no timeout: an evaluation (the first one
        trains a feature classifier) can outlast any --collective_timeout_s, which would otherwise fail the
        next training collective they wait in (exit 129, and a requeue loop). A worker that dies meanwhile
        still ends the wait (the peers' health checks do not depend on timeouts).

        A stop signal (Ctrl-C, SIGTERM) ends it after the batch in flight: the chief checks ``run_eval.check_stop``
        between the batches of the feature classifier's training, the images it reads, samples and scores; the
        barrier tells the other workers, and every worker raises ``base.Stopped`` (the trainer saves and
        stops; the resumed run evaluates this step first)."""
        if self.config.eval_split == "none":
            return {}
        result, stopped = {}, False
        if self.placement.is_chief:
            try:
                result = self._evaluate_on_chief(step, model_dir, run_eval.check_stop)
            except Stopped:
                stopped = True
        if self._wait_for_chief(stopped):
            raise Stopped()
        return result

    def _wait_for_chief(self, stopped: bool) -> bool:
        """Waits for the chief's evaluation on every worker; returns whether the chief's was ``stopped``."""
        if self.placement.num_workers == 1:
            return stopped
        if self._barrier is None:
            strategy = self.placement.strategy
            no_timeout = tf.distribute.experimental.CommunicationOptions(timeout_seconds=0)  # 0: wait forever

            @tf.function
            def barrier(value):
                # The value copied inside the replica's function, on its device (a host tensor passed as the
                # run's argument has no destination for the all-reduce)
                return strategy.run(lambda: tf.distribute.get_replica_context().all_reduce(
                    tf.distribute.ReduceOp.SUM, tf.identity(value), options=no_timeout))

            self._barrier = barrier
        summed = self._barrier(tf.constant(1.0 if stopped else 0.0))
        return float(self.placement.strategy.experimental_local_results(summed)[0]) > 0

    def _evaluate_on_chief(self, step, model_dir, check_stop):
        from tfgpu.tasks.gan import fid, images

        extractor = self.feature_extractor(model_dir, check_stop)
        real = self._real_feature_matrix(extractor, check_stop)
        n = len(real)
        if float(self.state.fid_initial.numpy()) < 0:
            initial = self._initial_generator_weights
            if self.options.ema_decay:  # scored as the EMA generator is (generator_weights)
                initial = self._with_standing_statistics(initial, check_stop)
            initial_fake = extractor(self._sample(n, initial, seed=1, check_stop=check_stop), check_stop)
            self.state.fid_initial.assign(fid.fid_from_features(real, initial_fake))
        weights = self.generator_weights(check_stop=check_stop)
        fake = extractor(self._sample(n, weights, seed=1, check_stop=check_stop), check_stop)
        result = fid.scores(real, fake, extractor.name)
        grid_path = run_dir.evaluation_samples(model_dir, step)
        fileio.makedirs(os.path.dirname(grid_path))  # model_dir may be gs://, ram://
        grid = images.save_grid(self._sample(SAMPLE_GRID_SIZE, weights, seed=2), grid_path)
        self._image_summary(model_dir, step, grid)
        result["fid_initial"] = float(self.state.fid_initial.numpy())
        result["fid_num_samples"] = n
        result["feature_extractor_trained"] = extractor.trained
        result["samples"] = grid_path
        result["sampled_with"] = "ema" if self.options.ema_decay else "generator"
        if n < self.options.fid_num_samples:
            log.warning("FID/KID used %d images, fewer than --fid_num_samples=%d: the train split has no more",
                        n, self.options.fid_num_samples)
        return result

    def generator_weights(self, ema: bool = True, check_stop=None) -> list:
        """The generator's weights as numpy arrays: the EMA copy (when on and ``ema``) or the raw ones.

        The EMA copy's BatchNorm statistics are recomputed for the EMA weights (``_with_standing_statistics``);
        the raw generator's moving averages were measured on other weights. ``check_stop``: called between
        batches (``EvalRun.check_stop``)."""
        if ema and self.options.ema_decay:
            return self._with_standing_statistics([v.numpy() for v in self.state.ema], check_stop)
        return [w.numpy() for w in self.generator.weights]

    def _with_standing_statistics(self, weights: list, check_stop=None) -> list:
        """``weights`` with every BatchNorm moving mean and variance replaced by the average of its batch
        statistics over ``STANDING_STATS_BATCHES`` x 256 latents (fixed seed), the generator in training mode:
        BigGAN's "standing statistics" for its EMA generator. Deterministic; a generator without BatchNorm
        comes back unchanged."""
        generator, _ = self._evaluation_generator()
        norms = [layer for layer in generator._flatten_layers(include_self=False)
                 if isinstance(layer, keras.layers.BatchNormalization)]
        generator.set_weights(weights)
        if not norms:
            return list(weights)
        momenta = [layer.momentum for layer in norms]
        try:
            for k in range(STANDING_STATS_BATCHES):
                if check_stop:
                    check_stop()
                for layer in norms:
                    layer.momentum = k / (k + 1)  # a running mean: batch k gets weight 1 / (k + 1)
                z, labels = self._evaluation_latents(256, start=256 * k, seed=3)
                self._generate(generator, z, labels, training=True)
        finally:
            for layer, momentum in zip(norms, momenta):
                layer.momentum = momentum
        return generator.get_weights()

    def sample(self, num: int, ema: bool = True, seed: int = 0) -> np.ndarray:
        """``num`` generated images in [-1, 1] (NHWC float32) from the current (or restored) weights."""
        return self._sample(num, self.generator_weights(ema), seed)

    def _evaluation_latents(self, size, start, seed):
        """Latents and labels (classes in turn) for evaluation draws, fixed by --seed and ``seed``."""
        draw_seed = tf.constant([self.config.seed + 7919 * seed, start], tf.int64)
        z = tf.random.stateless_normal([size, self.options.latent_dim], draw_seed)
        labels = tf.cast(tf.range(start, start + size) % max(self.info.num_classes, 1), tf.int32)
        return z, labels

    def _sample(self, num, weights, seed, batch_size=256, check_stop=None):
        generator, generate = self._evaluation_generator()
        generator.set_weights(weights)
        out = []
        for start in range(0, num, batch_size):
            if check_stop:
                check_stop()
            z, labels = self._evaluation_latents(min(batch_size, num - start), start, seed)
            out.append(generate(z, labels).numpy())
        return np.concatenate(out)

    def _evaluation_generator(self):
        """A generator copy outside the strategy (plain variables) that evaluation loads weights into."""
        if self._eval_generator is None:
            generator, = self._networks(("generator",))

            @tf.function(reduce_retracing=True)
            def generate(z, labels):
                return self._generate(generator, z, labels, training=False)

            self._eval_generator = (generator, generate)
        return self._eval_generator

    def feature_extractor(self, model_dir: str, check_stop=None):
        """The extractor FID and KID use: Keras's ImageNet InceptionV3 (--inception_weights), a classifier run
        (--fid_feature_model_dir), or else a small classifier trained once on this run's data into
        ``<model_dir>/fid_features`` (left untrained, and named so, when the data has one class; ``check_stop``
        is called between its training batches, and a stopped training leaves no classifier)."""
        if self._extractor is not None:
            return self._extractor
        from tfgpu.tasks.gan import fid

        config, options = self.config, self.options
        if options.inception_weights:
            try:
                self._extractor = fid.InceptionFeatures(options.inception_weights)
            except ValueError as e:
                raise ConfigError("inception_weights", str(e)) from None
        elif options.fid_feature_model_dir:
            self._extractor = fid.ClassifierFeatures(options.fid_feature_model_dir)
        else:
            directory = run_dir.fid_features(model_dir)
            if not fileio.isfile(fid.classifier_model_path(directory)):
                train = self._read_split(self.info.train_split, options.fid_num_samples, check_stop)
                val = (self._read_split(self.info.eval_split, options.fid_num_samples, check_stop)
                       if self.info.eval_split else None)
                epochs = max(5, math.ceil(600 * 64 / len(train[0])))  # about 600 steps of batch 64
                log.info("training a feature classifier for FID/KID on %d %s images (%d epochs) into %s; pass "
                         "--fid_feature_model_dir or --inception_weights to use another extractor", len(train[0]),
                         self.info.train_split, epochs, directory)
                metrics = fid.train_feature_classifier(train, val, directory, config.seed, epochs=epochs,
                                                       between_batches=check_stop)
                log.info("feature classifier: %s", metrics)
            self._extractor = fid.ClassifierFeatures(directory, label=f"auto-trained on {self.info.name}")
        log.info("FID/KID features: %s; %d real and %d generated images per evaluation (an FID compares only "
                 "with FIDs of the same extractor and sample count; raise it with --fid_num_samples)",
                 self._extractor.name, self.options.fid_num_samples, self.options.fid_num_samples)
        return self._extractor

    def _real_feature_matrix(self, extractor, check_stop=None):
        if self._real_features is None:
            images, _ = self._read_split(self.info.train_split, self.options.fid_num_samples, check_stop)
            self._real_features = extractor(images, check_stop)
        return self._real_features

    def _read_split(self, split: str, limit: int, check_stop=None):
        """Up to ``limit`` (images in [-1, 1], labels) of ``split``, in a fixed order (host memory), read as the
        input pipelines read it (the manifest's keys, labels checked, unreadable records read around)."""
        from tfgpu.data.input import pipeline

        examples = pipeline.split_examples(self.examples(), split).take(limit)
        batches = examples.map(lambda x, y, *weight: (x, y), num_parallel_calls=tf.data.AUTOTUNE).batch(512)
        images, labels = [], []
        # Released off-thread: its destruction can wait up to the read's length (runtime/feed.py)
        with feed_lib.Feed(iter(batches)) as feed:
            for x, y in feed.iterator:
                if check_stop:
                    check_stop()
                images.append(x.numpy())
                labels.append(y.numpy())
        if not images:
            raise ConfigError("data_dir", f"split {split!r} of {self.info.name} is empty")
        return np.concatenate(images), np.concatenate(labels)

    def _image_summary(self, model_dir, step, grid):
        if not self.config.tensorboard:
            return
        if self._writer is None:
            self._writer = tf.summary.create_file_writer(run_dir.summaries(model_dir, "samples"))
        with self._writer.as_default(step=step):
            tf.summary.image("samples", grid[None], max_outputs=1)
        self._writer.flush()
