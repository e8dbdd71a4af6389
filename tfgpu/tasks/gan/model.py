"""The GAN as a ``keras.Model`` whose ``train_step`` trains both networks: the one definition of a GAN step, which a
user trains with ``model.fit`` or ``tfgpu.fit`` and the flag command's ``--task=gan`` (``task.GanTask``) runs.

A step is ``n_critic`` discriminator updates followed by one generator update, unrolled in Python
(``optimizer.apply`` cannot run inside a ``tf.cond`` in replica context). Every loss is summed over the replica's
examples and divided by the global batch, so the optimizers' all-reduce (a sum) gives the gradient of the global
batch mean on any number of replicas; ``step_shares`` returns each value as this replica's share of the step's global
value (``tasks/base.py``), which ``train_step`` turns into Keras logs (``share_logs.ShareLogs``) and the flag
command's loop sums over replicas.

Randomness is stateless: latents, fake labels, DiffAugment and gradient-penalty mixing weights are drawn for the
*global* batch from a seed of (``seed``, step, purpose) and each replica takes its own rows, so replicas get distinct
latents, a mirrored run draws exactly what one device would and a resumed run what an uninterrupted one would. The
step is the model's ``step_counter``: under the flag command the run's one counter, which its loop advances; made
by the model otherwise, advanced by ``train_step`` and saved in the model's checkpoint with the EMA and optimizers.

Both optimizers are wrapped by ``runtime.precision.wrap_optimizer``: the dynamic float16 loss scale under
mixed_float16, otherwise no scale but the same guard, which skips an update whose loss or gradient is non-finite on
any replica (all of them skip it alike) and puts back the state that update's forward passes changed (BatchNorm
statistics, spectral-norm vectors). Skipped steps are logged as ``nonfinite_steps``.

Under mixed_float16 the gradient penalty and R1 run the discriminator in float32: their gradient of a gradient
overflows float16 at the usual loss scales and underflows without one (``losses.Float32Forward``).
"""
import contextlib

import keras
import tensorflow as tf

from tfgpu.runtime import precision
from tfgpu.tasks.base import unpack_batch
from tfgpu.tasks.gan import diffaugment as augment_ops
from tfgpu.tasks.gan.options import GAN_LOSSES
from tfgpu.tasks.gan.losses import Float32Forward, discriminator_loss, generator_loss
from tfgpu.tasks.share_logs import ShareLogs

_ONLY_FIRST = tf.VariableAggregation.ONLY_FIRST_REPLICA


class GanState(tf.Module):
    """What a GAN checkpoints besides the networks and optimizers: the EMA of the generator's weights and the
    untrained generator's FID. (Its random draws follow the step counter; checkpoints written before it kept a copy
    here as ``step``, which a restore leaves unread.)"""

    def __init__(self, generator: keras.Model):
        super().__init__(name="gan_state")
        self.fid_initial = tf.Variable(-1.0, trainable=False, aggregation=_ONLY_FIRST, name="fid_initial")
        # One slot per generator weight: trainable weights averaged, BatchNorm statistics copied from the
        # generator (they belong to its weights; the flag command recomputes them for the EMA ones).
        self.ema = [tf.Variable(w.numpy(), trainable=False, aggregation=_ONLY_FIRST, name=f"ema_{i}")
                    for i, w in enumerate(generator.weights)]


class GAN(keras.Model):
    """A generator and a discriminator trained against each other by ``fit``, as keras.io's DCGAN::

        gan = tfgpu.GAN(generator, discriminator, gan_loss="non_saturating")
        gan.compile()  # Adam(2e-4, beta_1=0.5) for each network unless given: compile(g_optimizer=..., d_optimizer=...)
        tfgpu.fit(gan, images, batch_size=64, epochs=10)   # or gan.fit(...), or fit(gan, images, labels) if conditional

    ``generator(z)`` (``generator([z, labels])`` when ``conditional``) gives images in the discriminator's input
    range; ``discriminator(images)`` (``[images, labels]``) gives one logit per image. Images a step is given as
    uint8 are rescaled to [-1, 1] (the records ``tfgpu.data.load`` gives, for a generator ending in tanh); others are
    used as they are, as float32. A ``fit`` step hands ``train_step`` one batch: each of the step's ``n_critic``
    critic updates learns from that batch with its own latents and augmentations (as keras.io's WGAN-GP example
    does); the flag command gives each update a fresh batch (``step_shares``). Logs: ``d_loss``, ``g_loss``,
    ``d_real``, ``d_fake`` (mean logits), the penalties that are on, ``nonfinite_steps`` (skipped, summed).

    ``generate(n)`` draws ``n`` images from the EMA of the generator's weights (``ema_decay`` > 0) or the generator.
    """

    def __init__(self, generator, discriminator, latent_dim=None, *, conditional=False, num_classes=1,
                 gan_loss="non_saturating", n_critic=1, gradient_penalty=0.0, r1_gamma=0.0, diffaugment="",
                 ema_decay=0.999, seed=0, global_batch_size=None, step_counter=None, **kwargs):
        super().__init__(**kwargs)
        if gan_loss not in GAN_LOSSES:
            raise ValueError(f"unknown gan_loss {gan_loss!r}; choose from {', '.join(GAN_LOSSES)}")
        if conditional and num_classes < 2:
            raise ValueError(f"a conditional GAN needs num_classes >= 2, got {num_classes}")
        if n_critic < 1:
            raise ValueError(f"n_critic must be positive, got {n_critic}")
        self.generator = generator
        self.discriminator = discriminator
        self.latent_dim = int(latent_dim or _input_width(generator))
        self.conditional, self.num_classes = bool(conditional), max(int(num_classes), 1)
        self.gan_loss, self.n_critic = gan_loss, int(n_critic)
        self.gradient_penalty, self.r1_gamma = float(gradient_penalty), float(r1_gamma)
        self.ema_decay = float(ema_decay)
        self.augment_policy = augment_ops.parse_policy(diffaugment)
        self.seed, self.global_batch_size = int(seed), global_batch_size
        # The flag command's loop advances the run's counter it passes; a model that made its own advances it.
        self.advances_step = step_counter is None
        if step_counter is None:
            step_counter = tf.Variable(0, dtype=tf.int64, trainable=False, aggregation=_ONLY_FIRST, name="gan_step")
        self.step_counter = step_counter
        self.state = GanState(generator)
        self._trainable_mask = [any(w is t for t in generator.trainable_weights) for w in generator.weights]
        self.logs = ShareLogs(means=self.share_names[:-1], counts=self.share_names[-1:])
        self.g_optimizer = self.d_optimizer = None

    @property
    def share_names(self) -> tuple:
        """The values a step returns (``step_shares``), in order; ``nonfinite_steps`` (a count) last."""
        names = ["d_loss", "g_loss", "d_real", "d_fake"]
        if self.gradient_penalty:
            names.append("gradient_penalty")
        if self.r1_gamma:
            names.append("r1_penalty")
        return tuple(names) + ("nonfinite_steps",)

    @property
    def metrics(self):
        return list(self.logs.trackers.values())

    def compile(self, g_optimizer=None, d_optimizer=None, *, precision_config=None, grad_clip_norm=0.0, **kwargs):
        """Sets the networks' optimizers (Adam(2e-4, beta_1=0.5) each when not given), each wrapped in the
        non-finite guard of ``precision_config`` (Keras' global policy's when not given), and builds them, so that
        a checkpoint restores into them before the first step; ``grad_clip_norm`` > 0 clips each network's global
        gradient. ``kwargs``: Keras' (``steps_per_execution``, ``jit_compile``, ``run_eagerly``)."""
        for name in ("optimizer", "loss", "metrics"):
            if name in kwargs:
                raise ValueError(f"GAN.compile takes no {name}=: its step has two optimizers (g_optimizer=, "
                                 "d_optimizer=) and its own losses (the GAN's gan_loss) and logs")
        policy = precision_config.precision if precision_config else keras.mixed_precision.global_policy().name
        self._penalty_precision = Float32Forward(self.discriminator) if policy == "mixed_float16" else None
        self.grad_clip_norm = float(grad_clip_norm)
        with self.distribute_strategy.scope():
            self.g_optimizer, self.d_optimizer = (
                precision.guard(optimizer or keras.optimizers.Adam(2e-4, beta_1=0.5, name=f"{name}_adam"),
                                precision_config)
                for optimizer, name in ((g_optimizer, "generator"), (d_optimizer, "discriminator")))
            self.g_optimizer.build(self.generator.trainable_variables)
            self.d_optimizer.build(self.discriminator.trainable_variables)
        super().compile(optimizer=None, **kwargs)

    # -- randomness ---------------------------------------------------------------------
    def _seed(self, *purpose):
        seed = tf.random.experimental.stateless_fold_in(tf.constant([self.seed, 0], tf.int64), self.step_counter)
        for p in purpose:
            seed = tf.random.experimental.stateless_fold_in(seed, p)
        return seed

    def latents(self, seed, offset, batch, total):
        """Rows ``offset ... offset + batch`` of the latents and fake labels drawn for ``total`` examples."""
        seeds = tf.random.experimental.stateless_split(seed, 2)
        z = tf.random.stateless_normal([total, self.latent_dim], seeds[0])[offset:offset + batch]
        labels = tf.random.stateless_uniform([total], seeds[1], minval=0, maxval=self.num_classes,
                                             dtype=tf.int32)[offset:offset + batch]
        return z, labels

    # -- networks -------------------------------------------------------------------------
    def generate_with(self, generator, z, labels, training):
        return generator([z, labels] if self.conditional else z, training=training)

    def discriminate(self, images, labels, training=True):
        return tf.reshape(self.discriminator([images, labels] if self.conditional else images, training=training),
                          [-1])

    def input_gradient_norms(self, images, labels):
        """Per-example |d D(x) / d x|^2 (inside the caller's tape, so differentiable), with the discriminator in
        float32 under mixed_float16."""
        with tf.GradientTape() as tape, self._penalty_precision or contextlib.nullcontext():
            tape.watch(images)
            total = tf.reduce_sum(self.discriminate(images, labels))
        grads = tf.cast(tape.gradient(total, images), tf.float32)
        return tf.reduce_sum(tf.square(grads), axis=[1, 2, 3])

    def generate(self, num: int, ema: bool = True, seed: int = 0):
        """``num`` images from latents of ``seed`` (random labels when conditional), with the EMA weights when
        ``ema`` and ``ema_decay`` > 0 (the generator's own BatchNorm statistics), in inference mode."""
        z, labels = self.latents(tf.constant([seed, 0], tf.int64), 0, num, num)
        if not (ema and self.ema_decay):
            return self.generate_with(self.generator, z, labels, training=False)
        current = [w.numpy() for w in self.generator.weights]
        self.generator.set_weights([e.numpy() for e in self.state.ema])
        try:
            return self.generate_with(self.generator, z, labels, training=False)
        finally:
            self.generator.set_weights(current)

    # -- the step --------------------------------------------------------------------------
    def _apply(self, optimizer, loss, grads, variables):
        """Applies ``grads`` unless the loss or any gradient on any replica is non-finite; returns ``finite``."""
        replicas = tf.distribute.get_replica_context().num_replicas_in_sync
        finite, _ = precision.apply_if_finite(optimizer, loss, grads, variables, self.grad_clip_norm, replicas)
        return finite

    def _discriminator_step(self, images, labels, seed, rows):
        offset, batch, total = rows
        seeds = tf.random.experimental.stateless_split(seed, 4)
        z, fake_labels = self.latents(seeds[0], offset, batch, total)
        if self.conditional and self.gradient_penalty:
            # WGAN-GP's reference code draws the critic's fakes with the real batch's labels, so each
            # interpolate mixes two images of one class and is scored with that class.
            fake_labels = labels
        fake = tf.stop_gradient(self.generate_with(self.generator, z, fake_labels, training=True))
        variables = self.discriminator.trainable_variables
        metrics = {}
        with tf.GradientTape() as tape:
            real_logits = self.discriminate(self._augment(images, seeds[1], offset, total), labels)
            fake_logits = self.discriminate(self._augment(fake, seeds[2], offset, total), fake_labels)
            loss = _over(tf.reduce_sum(discriminator_loss(self.gan_loss, real_logits, fake_logits)), total)
            metrics["d_loss"] = loss
            if self.gradient_penalty:
                mix = tf.random.stateless_uniform([total, 1, 1, 1], seeds[3])[offset:offset + batch]
                mixed = mix * images + (1.0 - mix) * fake
                penalty = tf.square(tf.sqrt(self.input_gradient_norms(mixed, labels) + 1e-12) - 1.0)
                metrics["gradient_penalty"] = _over(tf.reduce_sum(penalty), total)
                loss += self.gradient_penalty * metrics["gradient_penalty"]
            if self.r1_gamma:
                metrics["r1_penalty"] = _over(tf.reduce_sum(self.input_gradient_norms(images, labels)), total)
                loss += 0.5 * self.r1_gamma * metrics["r1_penalty"]
            scaled = precision.scale_loss(self.d_optimizer, loss)
        grads = tape.gradient(scaled, variables)
        finite = self._apply(self.d_optimizer, loss, grads, variables)
        metrics["d_real"] = _over(tf.reduce_sum(real_logits), total)
        metrics["d_fake"] = _over(tf.reduce_sum(fake_logits), total)
        return metrics, finite

    def _generator_step(self, seed, rows):
        offset, batch, total = rows
        z, fake_labels = self.latents(seed, offset, batch, total)
        variables = self.generator.trainable_variables
        augment_seed = tf.random.experimental.stateless_fold_in(seed, 1)
        with tf.GradientTape() as tape:
            fake = self.generate_with(self.generator, z, fake_labels, training=True)
            fake_logits = self.discriminate(self._augment(fake, augment_seed, offset, total), fake_labels)
            loss = _over(tf.reduce_sum(generator_loss(self.gan_loss, fake_logits)), total)
            scaled = precision.scale_loss(self.g_optimizer, loss)
        grads = tape.gradient(scaled, variables)
        return loss, self._apply(self.g_optimizer, loss, grads, variables)

    def _augment(self, images, seed, offset, total):
        return augment_ops.diff_augment(images, self.augment_policy, seed, offset, total)

    def _update_ema(self, applied):
        """EMA of the generator's weights with warm-up: decay min(d, (1 + t) / (10 + t)) at step t; unchanged
        when the generator's update was skipped (``applied`` false on every replica alike)."""
        t = tf.cast(self.step_counter, tf.float32)
        decay = tf.minimum(self.ema_decay, (1.0 + t) / (10.0 + t))
        for ema, weight, trainable in zip(self.state.ema, self.generator.weights, self._trainable_mask):
            value = tf.cast(weight.value, ema.dtype)
            ema.assign(tf.where(applied, decay * ema + (1.0 - decay) * value if trainable else value, ema))

    def _rows(self, images):
        """(offset, rows, total): where this replica's rows start in the global batch, how many it holds, and the
        global batch (``global_batch_size`` when given, else the rows times the replicas)."""
        context = tf.distribute.get_replica_context()
        if self.global_batch_size:
            batch = self.global_batch_size // context.num_replicas_in_sync
            total = self.global_batch_size
        else:
            batch = tf.shape(images)[0]
            total = batch * context.num_replicas_in_sync
        return tf.cast(context.replica_id_in_sync_group, tf.int32) * batch, batch, total

    def _real(self, batch):
        """(images as float32, labels as int32 or None) of a batch in Keras' contract; uint8 images in [-1, 1]."""
        images, labels, _ = unpack_batch(batch)
        if self.conditional and labels is None:
            raise ValueError("a conditional GAN trains on (images, labels): give fit the labels too")
        images = tf.convert_to_tensor(images)
        images = tf.cast(images, tf.float32) / 127.5 - 1.0 if images.dtype == tf.uint8 else tf.cast(images, tf.float32)
        return images, None if labels is None else tf.cast(labels, tf.int32)

    def step_shares(self, real_batches) -> dict:
        """One GAN step on this replica (in ``strategy.run``): a critic update on each of ``real_batches`` (Keras
        batches, ``n_critic`` of them), then a generator update; returns this replica's share of each value of
        ``share_names``. The step counter is read, not advanced."""
        if len(real_batches) != self.n_critic:
            raise ValueError(f"a step takes one real batch per critic update: {self.n_critic}, got "
                             f"{len(real_batches)}")
        totals = {name: tf.constant(0.0) for name in self.share_names if name not in ("g_loss", "nonfinite_steps")}
        # The guard is per network update: a skipped critic update leaves the discriminator (weights, optimizer,
        # BatchNorm statistics, spectral-norm vectors) as it was, a skipped generator update the generator and
        # its EMA. Forward passes change both networks' state, so each phase puts back what it changed.
        state = self.generator.non_trainable_weights + self.discriminator.non_trainable_weights
        d_finite = tf.constant(True)
        rows = None
        for k, real in enumerate(real_batches):  # unrolled: each update is its own optimizer.apply
            images, labels = self._real(real)
            rows = rows or self._rows(images)
            saved = [tf.identity(w.value) for w in state]
            metrics, finite = self._discriminator_step(images, labels, self._seed(1, k), rows)
            precision.restore_if_not_finite(finite, state, saved)
            totals = {name: totals[name] + metrics[name] / self.n_critic for name in totals}
            d_finite = tf.logical_and(d_finite, finite)
        saved = [tf.identity(w.value) for w in state]
        g_loss, g_finite = self._generator_step(self._seed(2), rows)
        precision.restore_if_not_finite(g_finite, state, saved)
        if self.ema_decay:
            self._update_ema(g_finite)
        all_finite = tf.logical_and(d_finite, g_finite)
        replicas = tf.distribute.get_replica_context().num_replicas_in_sync
        return {**totals, "g_loss": g_loss, "nonfinite_steps": tf.cast(tf.logical_not(all_finite), tf.float32) /
                replicas}

    def train_step(self, data):
        """One step of ``fit``: every critic update on ``data``'s batch, the generator update; the logs."""
        shares = self.step_shares((data,) * self.n_critic)
        if self.advances_step:
            self.step_counter.assign_add(1)
        return self.logs.update(shares)


def _over(value, total):
    """``value`` divided by the global batch ``total`` (a Python int, or a tensor the batch's shape gave)."""
    return value / (tf.cast(total, value.dtype) if tf.is_tensor(total) else total)


def _input_width(generator) -> int:
    """The latent size a generator takes: its (first) input's last dimension."""
    shape = generator.inputs[0].shape if getattr(generator, "inputs", None) else None
    if not shape or shape[-1] is None:
        raise ValueError(f"the generator {generator.name} has no static input shape: give latent_dim")
    return int(shape[-1])
