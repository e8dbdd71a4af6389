"""A DCGAN trained by ``fit`` with an overridden ``train_step``, after keras-io
examples/generative/dcgan_overriding_train_step.py.

The example's pattern: a discriminator and a generator (Conv2D / Conv2DTranspose with LeakyReLU) held by a
``keras.Model`` subclass whose ``compile`` takes two optimizers and a loss function and whose ``train_step``
samples latent vectors with its own seed generator, trains the discriminator on real and generated images (labels
with a little noise), then the generator through the frozen discriminator, and reports the two losses through its
own ``keras.metrics.Mean`` trackers; ``fit`` on a shuffled, batched ``tf.data.Dataset`` of images; a callback that
samples the generator at each epoch's end.

Data instead of MNIST (no downloads): scikit-learn's bundled 8x8 digits, all 1797, scaled to [0, 1]. Cuts: 28x28
-> 8x8 (a 2x2x32 seed map upsampled twice), filters 64/128 -> 16/32, latent 128 -> 16, 30 epochs -> 4, the monitor
keeps generated images in memory instead of writing PNGs.

Tolerance: three checks against plain Keras. The discriminator's loss over the last epoch (``d_loss``) within
0.06; the mean pixel of 256 samples of the script's own generator after fit within 0.1; and how well the script's
own discriminator tells 256 real digits from those samples, within 0.15. Calibration: with the script's initial
weights kept and only the data order and the train_step's latent draws changed (what a port may change), the
three moved by 0.004, 0.005 and 0.0 (d_loss ~0.55, mean pixel ~0.14, accuracy 1.0); another seed, i.e. other
initial weights, moved them by 0.09, 0.2 and 0.5, since a GAN's course hangs on its start, so a port must keep
the weights the script made. An untrained discriminator sits at d_loss ~0.69, an untrained generator's mean
pixel at ~0.5. ``d_loss`` is the loss ``train_step`` gets from calling its ``loss_fn``, which Keras divides by the
replicas in sync under a strategy (so ``model.fit`` on a 2-replica MirroredStrategy reports half of it too): on 2
workers it is compared times 2.
"""
import keras
import numpy as np
import tensorflow as tf
from keras import layers, ops
from sklearn.datasets import load_digits

import corpus_report

keras.utils.set_random_seed(0)

TOLERANCE = [
    {"key": "d_loss", "abs": 0.06, "replica_share": True},
    {"key": "generated_mean_pixel", "abs": 0.1},
    {"key": "discriminator_accuracy", "abs": 0.15},
]

batch_size = 64
digits = load_digits()
all_digits = (digits.images.astype("float32") / 16.0).reshape(-1, 8, 8, 1)
dataset = tf.data.Dataset.from_tensor_slices(all_digits)
dataset = dataset.shuffle(buffer_size=1024).batch(batch_size).prefetch(8)

discriminator = keras.Sequential(
    [
        keras.Input(shape=(8, 8, 1)),
        layers.Conv2D(16, (3, 3), strides=(2, 2), padding="same"),
        layers.LeakyReLU(negative_slope=0.2),
        layers.Conv2D(32, (3, 3), strides=(2, 2), padding="same"),
        layers.LeakyReLU(negative_slope=0.2),
        layers.GlobalMaxPooling2D(),
        layers.Dense(1),
    ],
    name="discriminator",
)

latent_dim = 16

generator = keras.Sequential(
    [
        keras.Input(shape=(latent_dim,)),
        layers.Dense(2 * 2 * 32),
        layers.LeakyReLU(negative_slope=0.2),
        layers.Reshape((2, 2, 32)),
        layers.Conv2DTranspose(32, (4, 4), strides=(2, 2), padding="same"),
        layers.LeakyReLU(negative_slope=0.2),
        layers.Conv2DTranspose(32, (4, 4), strides=(2, 2), padding="same"),
        layers.LeakyReLU(negative_slope=0.2),
        layers.Conv2D(1, (3, 3), padding="same", activation="sigmoid"),
    ],
    name="generator",
)


class GAN(keras.Model):
    def __init__(self, discriminator, generator, latent_dim):
        super().__init__()
        self.discriminator = discriminator
        self.generator = generator
        self.latent_dim = latent_dim
        self.seed_generator = keras.random.SeedGenerator(1337)

    def compile(self, d_optimizer, g_optimizer, loss_fn):
        super().compile()
        self.d_optimizer = d_optimizer
        self.g_optimizer = g_optimizer
        self.loss_fn = loss_fn
        self.d_loss_metric = keras.metrics.Mean(name="d_loss")
        self.g_loss_metric = keras.metrics.Mean(name="g_loss")

    @property
    def metrics(self):
        return [self.d_loss_metric, self.g_loss_metric]

    def train_step(self, real_images):
        batch_size = ops.shape(real_images)[0]
        random_latent_vectors = keras.random.normal(
            shape=(batch_size, self.latent_dim), seed=self.seed_generator
        )
        generated_images = self.generator(random_latent_vectors)
        combined_images = ops.concatenate([generated_images, real_images], axis=0)

        # 1 for generated, 0 for real, plus a little noise on the labels.
        labels = ops.concatenate(
            [ops.ones((batch_size, 1)), ops.zeros((batch_size, 1))], axis=0
        )
        labels += 0.05 * keras.random.uniform(ops.shape(labels), seed=self.seed_generator)

        with tf.GradientTape() as tape:
            predictions = self.discriminator(combined_images)
            d_loss = self.loss_fn(labels, predictions)
        grads = tape.gradient(d_loss, self.discriminator.trainable_weights)
        self.d_optimizer.apply_gradients(zip(grads, self.discriminator.trainable_weights))

        random_latent_vectors = keras.random.normal(
            shape=(batch_size, self.latent_dim), seed=self.seed_generator
        )
        misleading_labels = ops.zeros((batch_size, 1))

        # Train the generator only: the discriminator's weights are not updated here.
        with tf.GradientTape() as tape:
            predictions = self.discriminator(self.generator(random_latent_vectors))
            g_loss = self.loss_fn(misleading_labels, predictions)
        grads = tape.gradient(g_loss, self.generator.trainable_weights)
        self.g_optimizer.apply_gradients(zip(grads, self.generator.trainable_weights))

        self.d_loss_metric.update_state(d_loss)
        self.g_loss_metric.update_state(g_loss)
        return {"d_loss": self.d_loss_metric.result(), "g_loss": self.g_loss_metric.result()}


class GANMonitor(keras.callbacks.Callback):
    """Samples the generator at each epoch's end; keeps the images (the example saves them as PNGs)."""

    def __init__(self, num_img=3, latent_dim=16):
        super().__init__()
        self.num_img = num_img
        self.latent_dim = latent_dim
        self.seed_generator = keras.random.SeedGenerator(42)
        self.samples = []

    def on_epoch_end(self, epoch, logs=None):
        random_latent_vectors = keras.random.normal(
            shape=(self.num_img, self.latent_dim), seed=self.seed_generator
        )
        generated_images = self.model.generator(random_latent_vectors)
        self.samples.append(ops.convert_to_numpy(generated_images) * 255)


epochs = 4

gan = GAN(discriminator=discriminator, generator=generator, latent_dim=latent_dim)
gan.compile(
    d_optimizer=keras.optimizers.Adam(learning_rate=0.0003),
    g_optimizer=keras.optimizers.Adam(learning_rate=0.0003),
    loss_fn=keras.losses.BinaryCrossentropy(from_logits=True),
)
monitor = GANMonitor(num_img=3, latent_dim=latent_dim)

history = gan.fit(dataset, epochs=epochs, callbacks=[monitor])

# After fit: the script's own discriminator against its own generator, on 256 real and 256 generated digits.
real = all_digits[:256]
fake = generator.predict(np.random.RandomState(1).normal(size=(256, latent_dim)).astype("float32"), verbose=0)
real_says_fake = discriminator.predict(real, verbose=0)[:, 0] > 0
fake_says_fake = discriminator.predict(fake, verbose=0)[:, 0] > 0
corpus_report.report(history, gan, {
    "discriminator_accuracy": (np.sum(~real_says_fake) + np.sum(fake_says_fake)) / 512.0,
    "generated_mean_pixel": float(np.mean(fake)),
    "monitor_samples": len(monitor.samples),
    "monitor_sample_shape": monitor.samples[-1].shape,
    "batches_in_dataset": sum(1 for _ in dataset),
})
