"""GAN training: a generator and a discriminator, two optimizers, one replica step.

One ``train_step`` is ``--n_critic`` discriminator updates, each on a fresh
real batch (the trainer hands the step ``n_critic`` consecutive batches),
followed by one generator update, unrolled in Python (``optimizer.apply``
cannot run inside a ``tf.cond`` in replica context). Every loss is summed
over the replica's examples and divided by the global batch, so the
optimizers' all-reduce (a sum) gives the gradient of the global batch mean on
any number of replicas.

Randomness is stateless: latents, fake labels, DiffAugment and gradient-penalty
mixing weights are drawn for the *global* batch from a seed of (--seed, step,
purpose) and each replica takes its own rows, so replicas get distinct latents
and a mirrored run draws exactly what one device would (and a resumed run what
an uninterrupted one would).

Both optimizers are wrapped in a LossScaleOptimizer: the dynamic float16 loss
scale under mixed_float16 (``tfgpu.runtime.precision``), otherwise a fixed scale of 1
that still skips non-finite updates. Finiteness is decided over all replicas
(an all-reduce), and a non-finite loss or gradient poisons every replica's
gradient so all of them skip the same update. Skipped steps are counted in
``nonfinite_steps``; the trainer stops after --max_nonfinite_steps in a row.

Under mixed_float16 the gradient penalty and R1 run the discriminator in float32:
their gradient of a gradient overflows float16 at the usual loss scales (2^15
gave NaN at initialisation, so the first updates were skipped) and underflows
without one (R1 of a smooth critic lost 99% of its gradient). Only that extra
forward pass pays float32's cost; the real and fake logits stay in float16.
"""
import contextlib
import logging
import math
import os

import keras
import numpy as np
import tensorflow as tf

from tfgpu.runtime import precision
from tfgpu.tasks.gan import diffaugment
from tfgpu.config import ConfigError
from tfgpu.models import get_spec
from tfgpu.tasks.base import MetricSpec, Task, register_task

log = logging.getLogger("tfgpu")

_ONLY_FIRST = tf.VariableAggregation.ONLY_FIRST_REPLICA
SAMPLE_GRID_SIZE = 64
STANDING_STATS_BATCHES = 8  # x 256 latents: BatchNorm statistics recomputed for the EMA generator


# -- losses: per-example, float32 logits -------------------------------------------
def discriminator_loss(kind: str, real_logits, fake_logits):
    if kind in ("non_saturating", "minimax"):
        return tf.nn.softplus(-real_logits) + tf.nn.softplus(fake_logits)
    if kind == "wasserstein":
        return fake_logits - real_logits
    if kind == "hinge":
        return tf.nn.relu(1.0 - real_logits) + tf.nn.relu(1.0 + fake_logits)
    raise ValueError(f"unknown GAN loss {kind!r}")


def generator_loss(kind: str, fake_logits):
    if kind == "non_saturating":
        return tf.nn.softplus(-fake_logits)  # -log D(G(z))
    if kind == "minimax":
        return -tf.nn.softplus(fake_logits)  # log(1 - D(G(z)))
    if kind in ("wasserstein", "hinge"):
        return -fake_logits
    raise ValueError(f"unknown GAN loss {kind!r}")


class Float32Forward:
    """While open, every layer of ``model`` computes in float32 (its variables are float32 already), so a
    forward pass traced inside runs in float32 whatever the mixed policy; on exit the policies are back.

    Opened around the penalty's forward pass while a step is traced. MirroredStrategy traces its replicas
    in threads that run one at a time and pause only at cross-replica calls (synchronized BatchNorm), each
    replica at the same point of the same code, so the override is counted: it ends when the last replica
    that opened it closes it."""

    def __init__(self, model: keras.Model):
        self._layers = [layer for layer in model._flatten_layers(include_self=True)
                        if layer.dtype_policy.compute_dtype != "float32"]
        self._policies = [layer.dtype_policy for layer in self._layers]
        self._open = 0

    def __enter__(self):
        if self._open == 0:
            for layer in self._layers:
                layer.dtype_policy = "float32"
        self._open += 1

    def __exit__(self, *exc):
        self._open -= 1
        if self._open == 0:
            for layer, policy in zip(self._layers, self._policies):
                layer.dtype_policy = policy


class GanState(tf.Module):
    """What a GAN run checkpoints besides the networks and optimizers: its step counter (the seed of every
    random draw), the EMA of the generator's weights, and the untrained generator's FID."""

    def __init__(self, generator: keras.Model):
        super().__init__(name="gan_state")
        self.step = tf.Variable(0, dtype=tf.int64, trainable=False, aggregation=_ONLY_FIRST, name="step")
        self.fid_initial = tf.Variable(-1.0, trainable=False, aggregation=_ONLY_FIRST, name="fid_initial")
        # One slot per generator weight: trainable weights averaged, BatchNorm statistics copied from the
        # generator (they belong to its weights; GanTask.generator_weights recomputes them for the EMA ones).
        self.ema = [tf.Variable(w.numpy(), trainable=False, aggregation=_ONLY_FIRST, name=f"ema_{i}")
                    for i, w in enumerate(generator.weights)]


@register_task("gan")
class GanTask(Task):
    _LR = "Learning rate (and the float16 loss scale)"
    metrics = (
        MetricSpec("d_loss", plot="gan_losses", title="GAN losses", panel="loss", label="D loss", scale="log",
                   progress=True),
        MetricSpec("g_loss", plot="gan_losses", panel="loss", label="G loss", progress=True),
        MetricSpec("d_real", plot="gan_losses", panel="mean D logit", label="real images"),
        MetricSpec("d_fake", plot="gan_losses", panel="mean D logit", label="generated images"),
        MetricSpec("gradient_penalty"),
        MetricSpec("r1_penalty"),
        MetricSpec("nonfinite_steps", counts_nonfinite=True),
        MetricSpec("fid", kind="eval", lower_is_better=True, plot="fid", title="FID / KID (lower is better)",
                   panel="FID", label="FID"),
        MetricSpec("kid", kind="eval", lower_is_better=True, plot="fid", panel="KID", label="KID"),
        MetricSpec("samples", kind="eval", style="image", title="Samples", label="generated samples"),
        MetricSpec("learning_rate_g", plot="learning_rate", title=_LR, panel="learning rate", label="G", scale="log"),
        MetricSpec("learning_rate_d", plot="learning_rate", panel="learning rate", label="D", scale="log"),
        MetricSpec("loss_scale_g", plot="learning_rate", panel="loss scale", label="G", scale="log2"),
        MetricSpec("loss_scale_d", plot="learning_rate", panel="loss scale", label="D", scale="log2"),
    )
    report_sections = ("tfgpu.tasks.gan.report:fid_section",)
    report_options = ("gan_loss", "latent_dim", "g_learning_rate", "d_learning_rate", "n_critic", "gradient_penalty",
                      "ema_decay", "diffaugment")
    evaluates_without_eval_split = True  # FID/KID are scored on the train split

    @classmethod
    def batches_per_step(cls, config):
        """A fresh real batch for each of the critic's --n_critic updates (as in WGAN-GP)."""
        return config.n_critic


    def __init__(self, config, info, placement, total_steps):
        super().__init__(config, info, placement, total_steps)
        self._check_config()
        self._extractor = None
        self._real_features = None
        self._eval_generator = None
        self._writer = None
        self._barrier = None

    # -- setup -------------------------------------------------------------------
    def _check_config(self):
        """Fails with the flag's name before any model is built."""
        config = self.config
        if get_spec(config.model).family != "gan":
            raise ConfigError("model", f"{config.model} is not a GAN (use dcgan, wgan_gp or sngan) or use "
                              "--task=classification")
        try:
            diffaugment.parse_policy(config.diffaugment)
        except ValueError as e:
            raise ConfigError("diffaugment", str(e)) from None
        from tfgpu.models.gan import stage_sizes

        try:
            if not (config.generator and config.discriminator):  # the family builds one of the networks
                stage_sizes(self.info.image_shape)
        except ValueError as e:
            raise ConfigError("image_size", str(e)) from None
        if config.conditional and self.info.num_classes < 2:
            raise ConfigError("conditional", f"needs labelled data; {self.info.name} has "
                              f"{self.info.num_classes} classes")
        if (self.info.num_classes < 2 and config.eval_split != "none" and not config.inception_weights
                and not config.fid_feature_model_dir):
            log.warning("%s has %d class(es): no feature classifier can be trained on it, so FID/KID will use "
                        "an untrained (randomly initialised) network's features (metrics.json says so in "
                        "feature_extractor_trained). Pass --inception_weights or --fid_feature_model_dir for "
                        "trained features, or --eval_split=none to skip FID/KID.", self.info.name,
                        self.info.num_classes)
        if config.inception_weights and not os.path.isfile(config.inception_weights):
            raise ConfigError("inception_weights", f"file {config.inception_weights!r} does not exist (FID never "
                              "downloads weights)")
        if config.inception_weights:
            from tfgpu.tasks.gan.fid import weights_file_problem

            if weights_file_problem(config.inception_weights):
                raise ConfigError("inception_weights", weights_file_problem(config.inception_weights))
        if config.fid_feature_model_dir and not config.inception_weights:
            from tfgpu.tasks.gan.fid import classifier_model_path

            path = classifier_model_path(config.fid_feature_model_dir)
            if not os.path.isfile(path):
                raise ConfigError("fid_feature_model_dir", f"{path} does not exist; train the classifier first "
                                  "(python -m tfgpu.train --task=classification ...) or leave the flag empty to "
                                  "train one automatically")

    def build(self):
        config = self.config
        self.generator, self.discriminator = self._networks(("generator", "discriminator"),
                                                            sync_batch_norm=config.sync_batch_norm)
        self.g_optimizer = self._optimizer(config.g_learning_rate, "generator_adam")
        self.d_optimizer = self._optimizer(config.d_learning_rate, "discriminator_adam")
        self.g_optimizer.build(self.generator.trainable_variables)
        self.d_optimizer.build(self.discriminator.trainable_variables)
        self.state = GanState(self.generator)
        self._initial_generator_weights = [w.numpy() for w in self.generator.weights]  # for fid_initial
        self._trainable_mask = [any(w is t for t in self.generator.trainable_weights) for w in self.generator.weights]
        self._augment_policy = diffaugment.parse_policy(config.diffaugment)
        # The penalties' gradient of a gradient needs float32's range (module docstring).
        self._penalty_precision = (Float32Forward(self.discriminator) if config.precision == "mixed_float16"
                                   else contextlib.nullcontext())

    def _networks(self, which, **kwargs) -> list:
        """The networks named in ``which`` ("generator", "discriminator"): the user's builder where --generator or
        --discriminator names one (``tfgpu.models.user.build_gan_network``), else the --model family's."""
        from tfgpu.models import user

        config = self.config
        shape, classes = self.info.image_shape, max(self.info.num_classes, 1)
        family = None
        nets = []
        for name in which:
            if getattr(config, name):
                nets.append(user.build_gan_network(name, getattr(config, name), shape, classes, config.latent_dim,
                                                   config.conditional, **kwargs))
                continue
            if family is None:
                family = get_spec(config.model).builder(shape, classes, latent_dim=config.latent_dim,
                                                        conditional=config.conditional, **kwargs)
            nets.append(getattr(family, name))
        return nets

    def _optimizer(self, learning_rate, name):
        config = self.config
        inner = keras.optimizers.Adam(learning_rate, beta_1=config.adam_beta1, beta_2=config.adam_beta2, name=name)
        return precision.wrap_optimizer(inner, config)

    @property
    def train_metric_names(self):
        names = ["d_loss", "g_loss", "d_real", "d_fake"]
        if self.config.gradient_penalty:
            names.append("gradient_penalty")
        if self.config.r1_gamma:
            names.append("r1_penalty")
        return tuple(names) + ("nonfinite_steps",)

    def checkpoint_items(self):
        return {"generator": self.generator, "discriminator": self.discriminator, "g_optimizer": self.g_optimizer,
                "d_optimizer": self.d_optimizer, "gan_state": self.state}

    # -- randomness ---------------------------------------------------------------------
    def _seed(self, *purpose):
        seed = tf.random.experimental.stateless_fold_in(tf.constant([self.config.seed, 0], tf.int64),
                                                        self.state.step)
        for p in purpose:
            seed = tf.random.experimental.stateless_fold_in(seed, p)
        return seed

    def _latents(self, seed, offset, batch):
        """This replica's rows of the global batch's latents and labels."""
        total = self.config.global_batch_size
        seeds = tf.random.experimental.stateless_split(seed, 2)
        z = tf.random.stateless_normal([total, self.config.latent_dim], seeds[0])[offset:offset + batch]
        labels = tf.random.stateless_uniform([total], seeds[1], minval=0, maxval=max(self.info.num_classes, 1),
                                             dtype=tf.int32)[offset:offset + batch]
        return z, labels

    @property
    def _per_replica_batch(self) -> int:
        """Rows of each global batch one replica holds (static, whatever shape the input pipeline reports)."""
        return self.config.global_batch_size // self.placement.num_replicas

    def _augment(self, images, seed, offset):
        return diffaugment.diff_augment(images, self._augment_policy, seed, offset, self.config.global_batch_size)

    # -- networks -------------------------------------------------------------------------
    def _generate(self, generator, z, labels, training):
        return generator([z, labels] if self.config.conditional else z, training=training)

    def _discriminate(self, images, labels, training=True):
        return tf.reshape(self.discriminator([images, labels] if self.config.conditional else images,
                                             training=training), [-1])

    def _input_gradient_norms(self, images, labels):
        """Per-example |d D(x) / d x|^2 (computed inside the caller's tape, so it is differentiable), with the
        discriminator in float32 under mixed_float16."""
        with tf.GradientTape() as tape, self._penalty_precision:
            tape.watch(images)
            total = tf.reduce_sum(self._discriminate(images, labels))
        grads = tf.cast(tape.gradient(total, images), tf.float32)
        return tf.reduce_sum(tf.square(grads), axis=[1, 2, 3])

    # -- the step --------------------------------------------------------------------------
    def _apply(self, optimizer, loss, grads, variables):
        """Applies ``grads`` unless the loss or any gradient on any replica is non-finite; returns ``finite``."""
        finite, _ = precision.apply_if_finite(optimizer, loss, grads, variables, self.config.grad_clip_norm,
                                              self.placement.num_replicas)
        return finite

    def _discriminator_step(self, images, labels, seed, offset):
        config = self.config
        global_batch = config.global_batch_size
        batch = self._per_replica_batch
        seeds = tf.random.experimental.stateless_split(seed, 4)
        z, fake_labels = self._latents(seeds[0], offset, batch)
        if config.conditional and config.gradient_penalty:
            # WGAN-GP's reference code draws the critic's fakes with the real batch's labels, so each
            # interpolate mixes two images of one class and is scored with that class.
            fake_labels = labels
        fake = tf.stop_gradient(self._generate(self.generator, z, fake_labels, training=True))
        variables = self.discriminator.trainable_variables
        metrics = {}
        with tf.GradientTape() as tape:
            real_logits = self._discriminate(self._augment(images, seeds[1], offset), labels)
            fake_logits = self._discriminate(self._augment(fake, seeds[2], offset), fake_labels)
            loss = tf.reduce_sum(discriminator_loss(config.gan_loss, real_logits, fake_logits)) / global_batch
            metrics["d_loss"] = loss
            if config.gradient_penalty:
                mix = tf.random.stateless_uniform([global_batch, 1, 1, 1], seeds[3])[offset:offset + batch]
                mixed = mix * images + (1.0 - mix) * fake
                penalty = tf.square(tf.sqrt(self._input_gradient_norms(mixed, labels) + 1e-12) - 1.0)
                metrics["gradient_penalty"] = tf.reduce_sum(penalty) / global_batch
                loss += config.gradient_penalty * metrics["gradient_penalty"]
            if config.r1_gamma:
                metrics["r1_penalty"] = tf.reduce_sum(self._input_gradient_norms(images, labels)) / global_batch
                loss += 0.5 * config.r1_gamma * metrics["r1_penalty"]
            scaled = precision.scale_loss(self.d_optimizer, loss)
        grads = tape.gradient(scaled, variables)
        finite = self._apply(self.d_optimizer, loss, grads, variables)
        metrics["d_real"] = tf.reduce_sum(real_logits) / global_batch
        metrics["d_fake"] = tf.reduce_sum(fake_logits) / global_batch
        return metrics, finite

    def _generator_step(self, seed, offset, batch):
        config = self.config
        z, fake_labels = self._latents(seed, offset, batch)
        variables = self.generator.trainable_variables
        augment_seed = tf.random.experimental.stateless_fold_in(seed, 1)
        with tf.GradientTape() as tape:
            fake = self._generate(self.generator, z, fake_labels, training=True)
            fake_logits = self._discriminate(self._augment(fake, augment_seed, offset), fake_labels)
            loss = tf.reduce_sum(generator_loss(config.gan_loss, fake_logits)) / config.global_batch_size
            scaled = precision.scale_loss(self.g_optimizer, loss)
        grads = tape.gradient(scaled, variables)
        return loss, self._apply(self.g_optimizer, loss, grads, variables)

    def _update_ema(self, applied):
        """EMA of the generator's weights with warm-up: decay min(d, (1 + t) / (10 + t)) at step t; unchanged
        when the generator's update was skipped (``applied`` false on every replica alike)."""
        t = tf.cast(self.state.step, tf.float32)
        decay = tf.minimum(self.config.ema_decay, (1.0 + t) / (10.0 + t))
        for ema, weight, trainable in zip(self.state.ema, self.generator.weights, self._trainable_mask):
            value = tf.cast(weight.value, ema.dtype)
            ema.assign(tf.where(applied, decay * ema + (1.0 - decay) * value if trainable else value, ema))

    def train_step(self, batch):
        config = self.config
        real_batches = batch if config.batches_per_step > 1 else (batch,)  # one per critic update (trainer._loop)
        per_replica = self._per_replica_batch
        replica = tf.distribute.get_replica_context().replica_id_in_sync_group
        offset = tf.cast(replica, tf.int32) * per_replica
        totals = {name: tf.constant(0.0) for name in self.train_metric_names if name not in ("g_loss",
                                                                                              "nonfinite_steps")}
        # The guard is per network update: a skipped critic update leaves the discriminator (weights, optimizer,
        # BatchNorm statistics, spectral-norm vectors) as it was, a skipped generator update the generator and
        # its EMA. Forward passes change both networks' state, so each phase puts back what it changed.
        state = self.generator.non_trainable_weights + self.discriminator.non_trainable_weights
        d_finite = tf.constant(True)
        for k, (images, labels) in enumerate(real_batches):  # unrolled: each update is its own optimizer.apply
            saved = [tf.identity(w.value) for w in state]
            metrics, finite = self._discriminator_step(tf.cast(images, tf.float32), tf.cast(labels, tf.int32),
                                                       self._seed(1, k), offset)
            precision.restore_if_not_finite(finite, state, saved)
            totals = {name: totals[name] + metrics[name] / config.n_critic for name in totals}
            d_finite = tf.logical_and(d_finite, finite)
        saved = [tf.identity(w.value) for w in state]
        g_loss, g_finite = self._generator_step(self._seed(2), offset, per_replica)
        precision.restore_if_not_finite(g_finite, state, saved)
        if config.ema_decay:
            self._update_ema(g_finite)
        all_finite = tf.logical_and(d_finite, g_finite)
        self.state.step.assign_add(1)
        num_replicas = self.placement.num_replicas
        return {**totals, "g_loss": g_loss,
                "nonfinite_steps": tf.cast(tf.logical_not(all_finite), tf.float32) / num_replicas}

    # -- evaluation, samples, export -------------------------------------------------------------
    def eval_metric_names(self):
        return ()

    def evaluate(self, run_eval, step, model_dir):
        """FID and KID of the EMA generator (and, once per run, of the untrained one) against the train split,
        and a sample grid ``<model_dir>/samples/step_N.png``, computed on the chief.

        The other workers wait for the chief in a collective with no timeout: an evaluation (the first one
        trains a feature classifier) can outlast any --collective_timeout_s, which would otherwise fail the
        next training collective they wait in (exit 129, and a requeue loop). A worker that dies meanwhile
        still ends the wait (the peers' health checks do not depend on timeouts)."""
        if self.config.eval_split == "none":
            return {}
        result = self._evaluate_on_chief(step, model_dir) if self.placement.is_chief else {}
        self._wait_for_chief()
        return result

    def _wait_for_chief(self):
        if self.placement.num_workers == 1:
            return
        if self._barrier is None:
            strategy = self.placement.strategy
            no_timeout = tf.distribute.experimental.CommunicationOptions(timeout_seconds=0)  # 0: wait forever

            @tf.function
            def barrier():
                return strategy.run(lambda: tf.distribute.get_replica_context().all_reduce(
                    tf.distribute.ReduceOp.SUM, tf.constant(1.0), options=no_timeout))

            self._barrier = barrier
        self._barrier()

    def _evaluate_on_chief(self, step, model_dir):
        from tfgpu.tasks.gan import fid, images

        extractor = self.feature_extractor(model_dir)
        real = self._real_feature_matrix(extractor)
        n = len(real)
        if float(self.state.fid_initial.numpy()) < 0:
            initial = self._initial_generator_weights
            if self.config.ema_decay:  # scored as the EMA generator is (generator_weights)
                initial = self._with_standing_statistics(initial)
            self.state.fid_initial.assign(fid.fid_from_features(real, extractor(self._sample(n, initial, seed=1))))
        weights = self.generator_weights()
        fake = extractor(self._sample(n, weights, seed=1))
        result = fid.scores(real, fake, extractor.name)
        grid_path = os.path.join(model_dir, "samples", f"step_{step}.png")
        os.makedirs(os.path.dirname(grid_path), exist_ok=True)
        grid = images.save_grid(self._sample(SAMPLE_GRID_SIZE, weights, seed=2), grid_path)
        self._image_summary(model_dir, step, grid)
        result["fid_initial"] = float(self.state.fid_initial.numpy())
        result["fid_num_samples"] = n
        result["feature_extractor_trained"] = extractor.trained
        result["samples"] = grid_path
        result["sampled_with"] = "ema" if self.config.ema_decay else "generator"
        if n < self.config.fid_num_samples:
            log.warning("FID/KID used %d images, fewer than --fid_num_samples=%d: the train split has no more",
                        n, self.config.fid_num_samples)
        return result

    def generator_weights(self, ema: bool = True) -> list:
        """The generator's weights as numpy arrays: the EMA copy (when on and ``ema``) or the raw ones.

        The EMA copy's BatchNorm statistics are recomputed for the EMA weights (``_with_standing_statistics``);
        the raw generator's moving averages were measured on other weights."""
        if ema and self.config.ema_decay:
            return self._with_standing_statistics([v.numpy() for v in self.state.ema])
        return [w.numpy() for w in self.generator.weights]

    def _with_standing_statistics(self, weights: list) -> list:
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
        z = tf.random.stateless_normal([size, self.config.latent_dim], draw_seed)
        labels = tf.cast(tf.range(start, start + size) % max(self.info.num_classes, 1), tf.int32)
        return z, labels

    def _sample(self, num, weights, seed, batch_size=256):
        generator, generate = self._evaluation_generator()
        generator.set_weights(weights)
        out = []
        for start in range(0, num, batch_size):
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

    def feature_extractor(self, model_dir: str):
        """The extractor FID and KID use: Keras's ImageNet InceptionV3 (--inception_weights), a classifier run
        (--fid_feature_model_dir), or else a small classifier trained once on this run's data into
        ``<model_dir>/fid_features`` (left untrained, and named so, when the data has one class)."""
        if self._extractor is not None:
            return self._extractor
        from tfgpu.tasks.gan import fid

        config = self.config
        if config.inception_weights:
            try:
                self._extractor = fid.InceptionFeatures(config.inception_weights)
            except ValueError as e:
                raise ConfigError("inception_weights", str(e)) from None
        elif config.fid_feature_model_dir:
            self._extractor = fid.ClassifierFeatures(config.fid_feature_model_dir)
        else:
            directory = os.path.join(model_dir, "fid_features")
            if not os.path.isfile(fid.classifier_model_path(directory)):
                train = self._read_split(self.info.train_split, config.fid_num_samples)
                val = self._read_split(self.info.eval_split, config.fid_num_samples) if self.info.eval_split else None
                epochs = max(5, math.ceil(600 * 64 / len(train[0])))  # about 600 steps of batch 64
                log.info("training a feature classifier for FID/KID on %d %s images (%d epochs) into %s; pass "
                         "--fid_feature_model_dir or --inception_weights to use another extractor", len(train[0]),
                         self.info.train_split, epochs, directory)
                metrics = fid.train_feature_classifier(train, val, directory, config.seed, epochs=epochs)
                log.info("feature classifier: %s", metrics)
            self._extractor = fid.ClassifierFeatures(directory, label=f"auto-trained on {self.info.name}")
        log.info("FID/KID features: %s; %d real and %d generated images per evaluation (an FID compares only "
                 "with FIDs of the same extractor and sample count; raise it with --fid_num_samples)",
                 self._extractor.name, self.config.fid_num_samples, self.config.fid_num_samples)
        return self._extractor

    def _real_feature_matrix(self, extractor):
        if self._real_features is None:
            images, _ = self._read_split(self.info.train_split, self.config.fid_num_samples)
            self._real_features = extractor(images)
        return self._real_features

    def _read_split(self, split: str, limit: int):
        """Up to ``limit`` (images in [-1, 1], labels) of ``split``, in file order (host memory)."""
        from tfgpu.data import augment, tfrecord

        h, w, c = self.info.image_shape
        files = [f for f, _ in self.info.split_files[split]]
        records = tf.data.TFRecordDataset(files, compression_type="GZIP" if self.info.compression == "gzip"
                                          else None)

        def parse(serialized):
            features = tfrecord.parse_example(serialized)
            return augment.preprocess_eval(features, h, c), features[tfrecord.LABEL]

        images, labels = [], []
        for x, y in records.take(limit).map(parse, num_parallel_calls=tf.data.AUTOTUNE).batch(512):
            images.append(x.numpy())
            labels.append(y.numpy())
        if not images:
            raise ConfigError("data_dir", f"split {split!r} of {self.info.name} is empty")
        return np.concatenate(images), np.concatenate(labels)

    def _image_summary(self, model_dir, step, grid):
        if not self.config.tensorboard:
            return
        if self._writer is None:
            self._writer = tf.summary.create_file_writer(os.path.join(model_dir, "summaries", "samples"))
        with self._writer.as_default(step=step):
            tf.summary.image("samples", grid[None], max_outputs=1)
        self._writer.flush()

    def learning_rates(self):
        return {"learning_rate_g": self.config.g_learning_rate, "learning_rate_d": self.config.d_learning_rate}

    def loss_scales(self):
        if self.config.precision != "mixed_float16":
            return {}
        return {"loss_scale_g": float(precision.current_loss_scale(self.g_optimizer)),
                "loss_scale_d": float(precision.current_loss_scale(self.d_optimizer))}

    def describe(self):
        from tfgpu.models.summary import count_params

        return (f"model={self.config.model} generator params={count_params(self.generator):,} discriminator "
                f"params={count_params(self.discriminator):,} image={self.info.image_shape} "
                f"latent={self.config.latent_dim} conditional={self.config.conditional} loss={self.config.gan_loss}")

    def export(self, path):
        """Saves the generator with the EMA weights (float32 images out) as a .keras file."""
        generator, _ = self._evaluation_generator()
        generator.set_weights(self.generator_weights())
        generator.save(path)
