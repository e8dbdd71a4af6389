"""FID and KID between generated and real images, and the feature extractors they are measured with.

Two extractors, and every result names the one it used (``feature_extractor``)
and how many images it compared (``fid_num_real``, ``fid_num_fake``), so scores
from different extractors or sample counts are never compared by mistake:

- ``InceptionFeatures``: Keras's ImageNet InceptionV3 (``keras.applications``,
  2048-d average-pooled features, images resized to 299x299) from a local
  weights file; nothing is ever downloaded. This is *not* the 2015 TensorFlow
  Inception graph (``pt_inception-2015-12-05``) that published FIDs are computed
  with: its weights and resizing differ, so its FIDs are not comparable with
  published numbers, only with each other.
- ``ClassifierFeatures``: the penultimate layer (the input of the last Dense) of a
  classifier trained by tfgpu (``<model_dir>/export/model.keras``), for offline
  use on any dataset tfgpu can train on. Its scores are comparable only with
  scores from the same classifier.

FID (Heusel et al. 2017) is the Frechet distance between Gaussians fitted to the
two feature sets; KID (Binkowski et al. 2018) is the unbiased MMD^2 with the
cubic polynomial kernel, averaged over random subsets. FID is biased upward by
a term that falls about as 1/N with the sample count N (two samples of one
2048-d standard normal distribution score 1,052 at N=2,000 and 263 at N=8,000),
so an FID compares only with FIDs at the same N; KID is unbiased.

Every file here (the weights, the classifier's ``model.keras`` and ``metrics.json``) may be on any file
system TensorFlow opens (``gs://``, ``ram://``; ``tfgpu.runtime.fileio``). Keras reads and writes those
files only on the local disk, so a remote one is read from a local temporary copy (``local_copy``) and
written locally, then copied (``fileio.atomic_local_path``).
"""
import contextlib
import logging
import os
import tempfile

import numpy as np

from tfgpu.runtime import fileio
from tfgpu.runtime.precision import float32_policy  # features are compared across runs: built in float32
from tfgpu.runtime import run_dir

log = logging.getLogger("tfgpu")


# -- the statistics ------------------------------------------------------------
def feature_statistics(features):
    """Mean and covariance (float64, unbiased) of an (N, D) feature matrix."""
    features = np.asarray(features, np.float64)
    if features.ndim != 2 or len(features) < 2:
        raise ValueError(f"need an (N >= 2, D) feature matrix, got shape {features.shape}")
    return features.mean(axis=0), np.cov(features, rowvar=False)


def trace_sqrt_product(sigma1, sigma2):
    """Trace of sqrt(sigma1 @ sigma2) for covariance matrices, computed stably.

    sqrt(S1 S2) has the eigenvalues of sqrt(S1^1/2 S2 S1^1/2), a symmetric PSD
    matrix, so the trace is the sum of the square roots of that matrix's
    eigenvalues (clipped at 0). This avoids the complex results and failures
    scipy.linalg.sqrtm gives on the singular covariances of small samples.
    """
    eigvals, eigvecs = np.linalg.eigh(sigma1)
    root1 = (eigvecs * np.sqrt(np.clip(eigvals, 0.0, None))) @ eigvecs.T
    middle = root1 @ sigma2 @ root1
    middle = (middle + middle.T) / 2.0
    return float(np.sqrt(np.clip(np.linalg.eigvalsh(middle), 0.0, None)).sum())


def frechet_distance(mu1, sigma1, mu2, sigma2) -> float:
    """|mu1 - mu2|^2 + tr(S1 + S2 - 2 sqrt(S1 S2)); never negative."""
    mu1, mu2 = np.atleast_1d(mu1).astype(np.float64), np.atleast_1d(mu2).astype(np.float64)
    sigma1, sigma2 = np.atleast_2d(sigma1).astype(np.float64), np.atleast_2d(sigma2).astype(np.float64)
    if mu1.shape != mu2.shape or sigma1.shape != sigma2.shape:
        raise ValueError(f"feature sizes differ: {mu1.shape} vs {mu2.shape}")
    diff = mu1 - mu2
    value = diff @ diff + np.trace(sigma1) + np.trace(sigma2) - 2.0 * trace_sqrt_product(sigma1, sigma2)
    return max(float(value), 0.0)


def fid_from_features(features1, features2) -> float:
    return frechet_distance(*feature_statistics(features1), *feature_statistics(features2))


def polynomial_kernel(x, y):
    """k(x, y) = (x.y / d + 1)^3, the kernel of the KID paper."""
    return (x @ y.T / x.shape[1] + 1.0) ** 3


def kernel_mmd2_unbiased(x, y) -> float:
    """Unbiased MMD^2 between samples ``x`` and ``y`` (same size) under ``polynomial_kernel``."""
    m = len(x)
    kxx, kyy, kxy = polynomial_kernel(x, x), polynomial_kernel(y, y), polynomial_kernel(x, y)
    return float((kxx.sum() - np.trace(kxx)) / (m * (m - 1)) + (kyy.sum() - np.trace(kyy)) / (m * (m - 1))
                 - 2.0 * kxy.mean())


def kid_from_features(features1, features2, num_subsets: int = 100, subset_size: int = 1000, seed: int = 0):
    """KID: mean and standard deviation of the unbiased MMD^2 over random subsets of both sets."""
    x, y = np.asarray(features1, np.float64), np.asarray(features2, np.float64)
    size = min(subset_size, len(x), len(y))
    if size < 2:
        raise ValueError(f"KID needs at least 2 examples per set, got {len(x)} and {len(y)}")
    rng = np.random.default_rng(seed)
    values = [kernel_mmd2_unbiased(x[rng.choice(len(x), size, replace=False)],
                                   y[rng.choice(len(y), size, replace=False)]) for _ in range(num_subsets)]
    return float(np.mean(values)), float(np.std(values))


def scores(real_features, fake_features, extractor_name: str, kid_subsets: int = 100) -> dict:
    """FID and KID of ``fake_features`` against ``real_features``, with the extractor's name and counts."""
    kid, kid_std = kid_from_features(real_features, fake_features, num_subsets=kid_subsets)
    return {"fid": fid_from_features(real_features, fake_features), "kid": kid, "kid_std": kid_std,
            "feature_extractor": extractor_name, "fid_num_real": len(real_features),
            "fid_num_fake": len(fake_features)}


# -- feature extractors ----------------------------------------------------------
@contextlib.contextmanager
def local_copy(path: str):
    """Yields a local path holding ``path``'s bytes: ``path`` itself when local, else a temporary copy (same file
    name, so Keras still sees the .keras/.h5 extension) removed afterwards."""
    if not fileio.has_scheme(path):
        yield path
        return
    data = fileio.read_bytes(path)
    with tempfile.TemporaryDirectory(prefix="tfgpu-download-") as local:
        copy = os.path.join(local, os.path.basename(path.rstrip("/")))
        with open(copy, "wb") as f:
            f.write(data)
        yield copy


class FeatureExtractor:
    """Maps a batch of NHWC images in [-1, 1] to an (N, D) float32 feature array."""
    name = ""
    batch_size = 256
    trained = True  # False: a randomly initialised network (train_feature_classifier on one class)

    def _features(self, images):
        raise NotImplementedError

    def __call__(self, images, between_batches=None) -> np.ndarray:
        """The features of ``images``, ``batch_size`` at a time; ``between_batches`` (e.g. a stop check, which may
        raise) is called before each batch."""
        import tensorflow as tf

        out = []
        for start in range(0, len(images), self.batch_size):
            if between_batches:
                between_batches()
            batch = tf.convert_to_tensor(images[start:start + self.batch_size], tf.float32)
            out.append(np.asarray(self._features(batch), np.float32))
        return np.concatenate(out) if out else np.zeros((0, 0), np.float32)


_HDF5_SIGNATURE = b"\x89HDF\r\n\x1a\n"


def weights_file_problem(path: str) -> str:
    """Why ``path`` cannot be a Keras .h5 weights file (one line), or "" when it looks like one. Cheap: checked
    when the run starts, long before the first evaluation would load it."""
    try:
        with fileio.open_file(path, "rb") as f:
            head = f.read(len(_HDF5_SIGNATURE))
    except OSError as e:
        return f"{path}: cannot be read ({e.strerror or e})"
    if head != _HDF5_SIGNATURE:
        return f"{path}: not an HDF5 (.h5) weights file"
    return ""


class InceptionFeatures(FeatureExtractor):
    """Keras's ImageNet InceptionV3, average-pooled (2048-d), from a local weights file (not the 2015 FID
    Inception graph: see the module docstring)."""
    batch_size = 64

    def __init__(self, weights_path: str):
        import keras
        import tensorflow as tf

        if not fileio.isfile(weights_path):
            raise FileNotFoundError(f"InceptionV3 weights file {weights_path!r} does not exist")
        problem = weights_file_problem(weights_path)
        if problem:
            raise ValueError(problem)
        with float32_policy(), local_copy(weights_path) as local:
            try:
                self.model = keras.applications.InceptionV3(include_top=False, pooling="avg", weights=local,
                                                            input_shape=(299, 299, 3))
            except (ValueError, OSError, KeyError) as e:
                raise ValueError(f"{weights_path}: not InceptionV3 weights without the top "
                                 f"(inception_v3_weights_tf_dim_ordering_tf_kernels_notop.h5): "
                                 f"{str(e).splitlines()[0] if str(e) else type(e).__name__}") from None
        self.name = f"keras_inception_v3_imagenet_avgpool:{fileio.absolute(weights_path)}"

        @tf.function(reduce_retracing=True)
        def features(images):
            if images.shape[-1] == 1:
                images = tf.image.grayscale_to_rgb(images)
            # InceptionV3 takes [-1, 1] input, tfgpu's range; bilinear resize as in the TF-GAN reference.
            resized = tf.image.resize(images, [299, 299], method="bilinear")
            return self.model(resized, training=False)

        self._features = features


def _last_dense(model):
    import keras

    dense = [layer for layer in model._flatten_layers(include_self=False) if isinstance(layer, keras.layers.Dense)]
    if not dense:
        raise ValueError(f"{model.name} has no Dense layer whose input could serve as features")
    return dense[-1]


def _compute_in_float32(model) -> None:
    """Makes every layer of a loaded ``model`` compute in float32. A saved layer keeps the dtype policy it was
    trained with (e.g. mixed_bfloat16) whatever the global policy at load time; its variables are float32
    already under any mixed policy, so only the policy changes."""
    for layer in model._flatten_layers(include_self=True):
        if layer.dtype_policy.compute_dtype != "float32":
            layer.dtype_policy = "float32"


def _classifier_trained(model_path: str) -> tuple:
    """(trained, reason) from the results (metrics.json) of the run that exported ``<dir>/export/<name>.keras``;
    a classifier without them (a .keras file from elsewhere) or a run that does not say otherwise (any tfgpu
    classification run) was trained. Results that are not tfgpu's stop in one line naming them."""
    from tfgpu.metrics import results

    export_dir = os.path.dirname(fileio.absolute(model_path))
    if os.path.basename(export_dir) != run_dir.EXPORT_DIR:
        return True, ""
    record = results.read(os.path.dirname(export_dir), flag="fid_feature_model_dir")
    if record is not None and record.trained is False:
        return False, record.untrained_reason or "not trained"
    return True, ""


def classifier_model_path(model_dir_or_file: str) -> str:
    """For a run directory its network alone, ``<model_dir>/export/model.bare.keras`` (``model.keras`` of runs
    exported before the pixel-taking variant, or of the classifier trained here); or the .keras file itself."""
    if model_dir_or_file.endswith(".keras"):
        return model_dir_or_file
    bare = run_dir.exported_bare_model(model_dir_or_file)
    return bare if fileio.isfile(bare) else run_dir.exported_model(model_dir_or_file)


class ClassifierFeatures(FeatureExtractor):
    """Penultimate-layer features of a tfgpu classifier (the input of its last Dense layer)."""

    def __init__(self, model_dir_or_file: str, label: str = ""):
        import keras
        import tensorflow as tf

        import tfgpu.models  # noqa: F401  (registers tfgpu's custom layers for loading)

        path = classifier_model_path(model_dir_or_file)
        if not fileio.isfile(path):
            raise FileNotFoundError(f"no exported classifier at {path}; train one with "
                                    "`python -m tfgpu.train --task=classification ...` (it writes export/model.keras)")
        with float32_policy(), local_copy(path) as local:
            classifier = keras.models.load_model(local, compile=False)
        _compute_in_float32(classifier)
        head = _last_dense(classifier)
        self.model = keras.Model(classifier.inputs, head.input)
        self.input_shape = tuple(classifier.inputs[0].shape[1:])
        self.feature_size = int(head.input.shape[-1])
        self.trained, untrained_reason = _classifier_trained(path)
        if not self.trained:
            label = f"untrained: {untrained_reason}"
        self.name = f"classifier_penultimate:{fileio.absolute(path)}" + (f" ({label})" if label else "")

        @tf.function(reduce_retracing=True)
        def features(images):
            h, w, c = self.input_shape
            if images.shape[-1] != c:
                raise ValueError(f"images have {images.shape[-1]} channels, the classifier expects {c}")
            if (images.shape[1], images.shape[2]) != (h, w):
                images = tf.image.resize(images, [h, w], method="bilinear", antialias=True)
            return tf.cast(self.model(images, training=False), tf.float32)

        self._features = features


# -- a classifier for offline features, trained on the spot -------------------------
def feature_classifier(input_shape, num_classes):
    """A small BatchNorm-free CNN (its 128-d penultimate layer is the feature): no batch statistics, so its
    features do not depend on how long BN moving averages had to settle."""
    import keras
    from keras import layers

    inputs = keras.Input(tuple(input_shape))
    x = inputs
    for filters, stride in ((32, 1), (64, 2), (128, 2)):
        x = layers.Conv2D(filters, 3, strides=stride, padding="same", activation="relu")(x)
    x = layers.Dense(128, activation="relu", name="features")(layers.GlobalAveragePooling2D()(x))
    return keras.Model(inputs, layers.Dense(num_classes, name="logits")(x), name="fid_feature_classifier")


def train_feature_classifier(train, val, out_dir: str, seed: int, epochs: int = 30, batch_size: int = 64,
                             between_batches=None) -> dict:
    """Trains ``feature_classifier`` on (images in [-1, 1], labels) and exports it to
    ``<out_dir>/export/model.keras`` (atomically: ``fileio.atomic_local_path``; ``out_dir`` may be remote), the
    layout ``ClassifierFeatures`` reads. Returns
    the record it writes to ``<out_dir>/metrics.json`` (``tfgpu.metrics.results``): e.g. {"trained": True,
    "val_accuracy": ...}. Used when a GAN run names no extractor.

    With fewer than two classes among ``labels`` there is nothing to learn (one logit: the loss is 0 for
    any weights), so the network is exported as initialised (seeded) and the record says
    {"trained": False, "reason": ...}; ``ClassifierFeatures`` then names it untrained. ``between_batches`` (e.g. a
    stop check, which may raise: nothing is then exported) is called after each training batch."""
    import keras

    from tfgpu.metrics import results

    images, labels = train
    num_classes = int(max(labels.max(), val[1].max() if val is not None and len(val[1]) else 0)) + 1
    present = len(np.unique(labels))
    keras.utils.set_random_seed(seed)
    with float32_policy():
        model = feature_classifier(images.shape[1:], max(num_classes, 2))
        untrained_reason, values = None, {}
        if present < 2:
            epochs = 0
            untrained_reason = (f"the {len(images)} training images have {present} class; a classifier cannot "
                                "learn from one class, so its features are a random network's")
            log.warning("FID/KID features: %s", untrained_reason)
        else:
            model.compile(optimizer=keras.optimizers.Adam(1e-3), loss=keras.losses.SparseCategoricalCrossentropy(
                from_logits=True), metrics=["accuracy"])
            callbacks = ([keras.callbacks.LambdaCallback(on_train_batch_end=lambda batch, logs: between_batches())]
                         if between_batches else [])
            model.fit(images, labels, batch_size=batch_size, epochs=epochs, verbose=0, shuffle=True,
                      callbacks=callbacks)
            if val is not None and len(val[0]):
                values["val_accuracy"] = float(model.evaluate(val[0], val[1], verbose=0,
                                                              return_dict=True)["accuracy"])
    export = run_dir.export(out_dir)
    fileio.makedirs(export)
    with fileio.atomic_local_path(run_dir.exported_model(out_dir), suffix=".keras") as tmp:
        model.save(tmp)
    record = results.RunResult(values={"epochs": epochs, "train_examples": len(images), **values},
                               facts=results.RunFacts(model=model.name), trained=untrained_reason is None,
                               untrained_reason=untrained_reason)
    results.write(out_dir, record)
    return record.to_dict()
