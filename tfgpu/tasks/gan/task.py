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

The losses and that float32 forward pass live in ``losses.py``; evaluation (FID/KID on the chief, sample
grids, the EMA generator's own BatchNorm statistics) in ``evaluation.py``.
"""
import contextlib
import logging

import keras
import tensorflow as tf

from tfgpu.runtime import fileio, precision
from tfgpu.tasks.gan import diffaugment, network_checks
from tfgpu.config import ConfigError, PrecisionConfig
from tfgpu.models import get_spec
from tfgpu.tasks.base import MetricSpec, Task, register_task, unpack_batch
from tfgpu.tasks.gan.evaluation import GanEvaluation
from tfgpu.tasks.gan.losses import Float32Forward, discriminator_loss, generator_loss
from tfgpu.tasks.gan.options import GanOptions

log = logging.getLogger("tfgpu")

_ONLY_FIRST = tf.VariableAggregation.ONLY_FIRST_REPLICA


class GanState(tf.Module):
    """What a GAN run checkpoints besides the networks and optimizers: the EMA of the generator's weights and the
    untrained generator's FID. (Its random draws follow the run's one step counter, ``Task.global_step``;
    checkpoints written before it kept a copy here as ``step``, which a restore leaves unread.)"""

    def __init__(self, generator: keras.Model):
        super().__init__(name="gan_state")
        self.fid_initial = tf.Variable(-1.0, trainable=False, aggregation=_ONLY_FIRST, name="fid_initial")
        # One slot per generator weight: trainable weights averaged, BatchNorm statistics copied from the
        # generator (they belong to its weights; GanTask.generator_weights recomputes them for the EMA ones).
        self.ema = [tf.Variable(w.numpy(), trainable=False, aggregation=_ONLY_FIRST, name=f"ema_{i}")
                    for i, w in enumerate(generator.weights)]


@register_task("gan")
class GanTask(GanEvaluation, Task):
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
        return GanOptions.of(config).n_critic


    @property
    def options(self) -> GanOptions:
        """The GAN's own options section (--n_critic, --gan_loss, ...); the shared ones are ``self.config``'s."""
        return GanOptions.of(self.config)

    def __init__(self, config, info, placement, total_steps, global_step, resumed_examples=None):
        super().__init__(config, info, placement, total_steps, global_step, resumed_examples)
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
        options = self.options
        if get_spec(config.model).family != "gan":
            raise ConfigError("model", f"{config.model} is not a GAN (use dcgan, wgan_gp or sngan) or use "
                              "--task=classification")
        try:
            diffaugment.parse_policy(options.diffaugment)
        except ValueError as e:
            raise ConfigError("diffaugment", str(e)) from None
        from tfgpu.models.gan import stage_sizes

        try:
            if not (options.generator and options.discriminator):  # the family builds one of the networks
                stage_sizes(self.info.image_shape)
        except ValueError as e:
            raise ConfigError("image_size", str(e)) from None
        if options.conditional and self.info.num_classes < 2:
            raise ConfigError("conditional", f"needs labelled data; {self.info.name} has "
                              f"{self.info.num_classes} classes")
        if (self.info.num_classes < 2 and config.eval_split != "none" and not options.inception_weights
                and not options.fid_feature_model_dir):
            log.warning("%s has %d class(es): no feature classifier can be trained on it, so FID/KID will use "
                        "an untrained (randomly initialised) network's features (metrics.json says so in "
                        "feature_extractor_trained). Pass --inception_weights or --fid_feature_model_dir for "
                        "trained features, or --eval_split=none to skip FID/KID.", self.info.name,
                        self.info.num_classes)
        if options.inception_weights and not fileio.isfile(options.inception_weights):
            raise ConfigError("inception_weights", f"file {options.inception_weights!r} does not exist (FID never "
                              "downloads weights)")
        if options.inception_weights:
            from tfgpu.tasks.gan.fid import weights_file_problem

            if weights_file_problem(options.inception_weights):
                raise ConfigError("inception_weights", weights_file_problem(options.inception_weights))
        if options.fid_feature_model_dir and not options.inception_weights:
            from tfgpu.tasks.gan.fid import classifier_model_path

            path = classifier_model_path(options.fid_feature_model_dir)
            if not fileio.isfile(path):
                raise ConfigError("fid_feature_model_dir", f"{path} does not exist; train the classifier first "
                                  "(python -m tfgpu.train --task=classification ...) or leave the flag empty to "
                                  "train one automatically")

    def build(self):
        config = self.config
        options = self.options
        self.generator, self.discriminator = self._networks(("generator", "discriminator"))
        named = {flag: (flag, getattr(options, flag)) if getattr(options, flag) else ("model", config.model)
                 for flag in ("generator", "discriminator")}
        self.generator_head = network_checks.check_generator(self.generator, *named["generator"])
        network_checks.check_discriminator(self.discriminator, *named["discriminator"], options.gan_loss)
        self.g_optimizer = self._optimizer(options.g_learning_rate, "generator_adam")
        self.d_optimizer = self._optimizer(options.d_learning_rate, "discriminator_adam")
        self.g_optimizer.build(self.generator.trainable_variables)
        self.d_optimizer.build(self.discriminator.trainable_variables)
        self.state = GanState(self.generator)
        self._initial_generator_weights = [w.numpy() for w in self.generator.weights]  # for fid_initial
        self._trainable_mask = [any(w is t for t in self.generator.trainable_weights) for w in self.generator.weights]
        self._augment_policy = diffaugment.parse_policy(options.diffaugment)
        # The penalties' gradient of a gradient needs float32's range (module docstring).
        self._penalty_precision = (Float32Forward(self.discriminator) if config.precision == "mixed_float16"
                                   else contextlib.nullcontext())

    def _networks(self, which) -> list:
        """The networks named in ``which`` ("generator", "discriminator"): the user's builder where --generator or
        --discriminator names one (``tfgpu.models.user.build_gan_network``), else the --model family's; each given
        the run's model options it takes."""
        from tfgpu.models import registry, user

        config = self.config
        options = self.options
        shape, classes = self.info.image_shape, max(self.info.num_classes, 1)
        family = None
        nets = []
        for name in which:
            if getattr(options, name):
                nets.append(user.build_gan_network(name, getattr(options, name), shape, classes, options.latent_dim,
                                                   options.conditional, sync_batch_norm=config.sync_batch_norm))
                continue
            if family is None:
                spec = get_spec(config.model)
                family = spec.builder(shape, classes, latent_dim=options.latent_dim, conditional=options.conditional,
                                      **registry.options_for(spec, registry.model_options(config)))
            nets.append(getattr(family, name))
        return nets

    def _optimizer(self, learning_rate, name):
        config = self.config
        options = self.options
        inner = keras.optimizers.Adam(learning_rate, beta_1=options.adam_beta1, beta_2=options.adam_beta2, name=name)
        return precision.wrap_optimizer(inner, PrecisionConfig.of(config))

    @property
    def train_metric_names(self):
        names = ["d_loss", "g_loss", "d_real", "d_fake"]
        if self.options.gradient_penalty:
            names.append("gradient_penalty")
        if self.options.r1_gamma:
            names.append("r1_penalty")
        return tuple(names) + ("nonfinite_steps",)

    def checkpoint_items(self):
        return {"generator": self.generator, "discriminator": self.discriminator, "g_optimizer": self.g_optimizer,
                "d_optimizer": self.d_optimizer, "gan_state": self.state}

    # -- randomness ---------------------------------------------------------------------
    def _seed(self, *purpose):
        seed = tf.random.experimental.stateless_fold_in(tf.constant([self.config.seed, 0], tf.int64),
                                                        self.global_step)
        for p in purpose:
            seed = tf.random.experimental.stateless_fold_in(seed, p)
        return seed

    def _latents(self, seed, offset, batch):
        """This replica's rows of the global batch's latents and labels."""
        total = self.config.global_batch_size
        seeds = tf.random.experimental.stateless_split(seed, 2)
        z = tf.random.stateless_normal([total, self.options.latent_dim], seeds[0])[offset:offset + batch]
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
        return generator([z, labels] if self.options.conditional else z, training=training)

    def _discriminate(self, images, labels, training=True):
        return tf.reshape(self.discriminator([images, labels] if self.options.conditional else images,
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
        options = self.options
        global_batch = config.global_batch_size
        batch = self._per_replica_batch
        seeds = tf.random.experimental.stateless_split(seed, 4)
        z, fake_labels = self._latents(seeds[0], offset, batch)
        if options.conditional and options.gradient_penalty:
            # WGAN-GP's reference code draws the critic's fakes with the real batch's labels, so each
            # interpolate mixes two images of one class and is scored with that class.
            fake_labels = labels
        fake = tf.stop_gradient(self._generate(self.generator, z, fake_labels, training=True))
        variables = self.discriminator.trainable_variables
        metrics = {}
        with tf.GradientTape() as tape:
            real_logits = self._discriminate(self._augment(images, seeds[1], offset), labels)
            fake_logits = self._discriminate(self._augment(fake, seeds[2], offset), fake_labels)
            loss = tf.reduce_sum(discriminator_loss(options.gan_loss, real_logits, fake_logits)) / global_batch
            metrics["d_loss"] = loss
            if options.gradient_penalty:
                mix = tf.random.stateless_uniform([global_batch, 1, 1, 1], seeds[3])[offset:offset + batch]
                mixed = mix * images + (1.0 - mix) * fake
                penalty = tf.square(tf.sqrt(self._input_gradient_norms(mixed, labels) + 1e-12) - 1.0)
                metrics["gradient_penalty"] = tf.reduce_sum(penalty) / global_batch
                loss += options.gradient_penalty * metrics["gradient_penalty"]
            if options.r1_gamma:
                metrics["r1_penalty"] = tf.reduce_sum(self._input_gradient_norms(images, labels)) / global_batch
                loss += 0.5 * options.r1_gamma * metrics["r1_penalty"]
            scaled = precision.scale_loss(self.d_optimizer, loss)
        grads = tape.gradient(scaled, variables)
        finite = self._apply(self.d_optimizer, loss, grads, variables)
        metrics["d_real"] = tf.reduce_sum(real_logits) / global_batch
        metrics["d_fake"] = tf.reduce_sum(fake_logits) / global_batch
        return metrics, finite

    def _generator_step(self, seed, offset, batch):
        config = self.config
        options = self.options
        z, fake_labels = self._latents(seed, offset, batch)
        variables = self.generator.trainable_variables
        augment_seed = tf.random.experimental.stateless_fold_in(seed, 1)
        with tf.GradientTape() as tape:
            fake = self._generate(self.generator, z, fake_labels, training=True)
            fake_logits = self._discriminate(self._augment(fake, augment_seed, offset), fake_labels)
            loss = tf.reduce_sum(generator_loss(options.gan_loss, fake_logits)) / config.global_batch_size
            scaled = precision.scale_loss(self.g_optimizer, loss)
        grads = tape.gradient(scaled, variables)
        return loss, self._apply(self.g_optimizer, loss, grads, variables)

    def _update_ema(self, applied):
        """EMA of the generator's weights with warm-up: decay min(d, (1 + t) / (10 + t)) at step t; unchanged
        when the generator's update was skipped (``applied`` false on every replica alike)."""
        t = tf.cast(self.global_step, tf.float32)
        decay = tf.minimum(self.options.ema_decay, (1.0 + t) / (10.0 + t))
        for ema, weight, trainable in zip(self.state.ema, self.generator.weights, self._trainable_mask):
            value = tf.cast(weight.value, ema.dtype)
            ema.assign(tf.where(applied, decay * ema + (1.0 - decay) * value if trainable else value, ema))

    def train_step(self, batch):
        config = self.config
        options = self.options
        real_batches = batch if self.batches_per_step(config) > 1 else (batch,)  # one per critic update (loop.build_loop)
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
        for k, real in enumerate(real_batches):  # unrolled: each update is its own optimizer.apply
            images, labels, _ = unpack_batch(real)
            saved = [tf.identity(w.value) for w in state]
            metrics, finite = self._discriminator_step(tf.cast(images, tf.float32), tf.cast(labels, tf.int32),
                                                       self._seed(1, k), offset)
            precision.restore_if_not_finite(finite, state, saved)
            totals = {name: totals[name] + metrics[name] / options.n_critic for name in totals}
            d_finite = tf.logical_and(d_finite, finite)
        saved = [tf.identity(w.value) for w in state]
        g_loss, g_finite = self._generator_step(self._seed(2), offset, per_replica)
        precision.restore_if_not_finite(g_finite, state, saved)
        if options.ema_decay:
            self._update_ema(g_finite)
        all_finite = tf.logical_and(d_finite, g_finite)
        num_replicas = self.placement.num_replicas
        return {**totals, "g_loss": g_loss,
                "nonfinite_steps": tf.cast(tf.logical_not(all_finite), tf.float32) / num_replicas}

    # -- evaluation, samples, export -------------------------------------------------------------
    def eval_metric_names(self):
        return ()


    def learning_rates(self):
        return {"learning_rate_g": self.options.g_learning_rate, "learning_rate_d": self.options.d_learning_rate}

    def loss_scales(self):
        if self.config.precision != "mixed_float16":
            return {}
        return {"loss_scale_g": float(precision.current_loss_scale(self.g_optimizer)),
                "loss_scale_d": float(precision.current_loss_scale(self.d_optimizer))}

    def model_facts(self):
        return {"generator_output": self.generator_head.activation or "linear"}

    @classmethod
    def describe_export(cls, config, info, facts: dict) -> dict:
        return network_checks.describe_generator(config, info, facts)

    def describe(self):
        from tfgpu.models.summary import count_params

        return (f"model={self.config.model} generator params={count_params(self.generator):,} discriminator "
                f"params={count_params(self.discriminator):,} image={self.info.image_shape} "
                f"latent={self.options.latent_dim} conditional={self.options.conditional} loss={self.options.gan_loss}")

    def deployable(self, variant=""):
        """The generator with the EMA weights (float32 images out)."""
        generator, _ = self._evaluation_generator()
        generator.set_weights(self.generator_weights())
        return generator
