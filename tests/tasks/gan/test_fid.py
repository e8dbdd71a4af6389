"""FID and KID: closed forms for Gaussians, identity, monotonicity, and the feature extractors (their files local
and on ram://)."""
import os

import numpy as np
import pytest

from tfgpu.tasks.gan import fid


def test_frechet_distance_matches_closed_form_for_diagonal_gaussians():
    rng = np.random.default_rng(0)
    mu1, mu2 = rng.normal(size=16), rng.normal(size=16)
    s1, s2 = rng.uniform(0.1, 3.0, 16), rng.uniform(0.1, 3.0, 16)
    expected = np.sum((mu1 - mu2) ** 2) + np.sum((np.sqrt(s1) - np.sqrt(s2)) ** 2)
    assert fid.frechet_distance(mu1, np.diag(s1), mu2, np.diag(s2)) == pytest.approx(expected, rel=1e-9)


def test_frechet_distance_matches_closed_form_for_commuting_full_covariances():
    """Same eigenvectors, different eigenvalues: tr sqrt(S1 S2) = sum sqrt(l1 l2)."""
    rng = np.random.default_rng(1)
    q, _ = np.linalg.qr(rng.normal(size=(8, 8)))
    l1, l2 = rng.uniform(0.5, 2.0, 8), rng.uniform(0.5, 2.0, 8)
    s1, s2 = q @ np.diag(l1) @ q.T, q @ np.diag(l2) @ q.T
    mu = rng.normal(size=8)
    expected = np.sum((np.sqrt(l1) - np.sqrt(l2)) ** 2)
    assert fid.frechet_distance(mu, s1, mu, s2) == pytest.approx(expected, rel=1e-8)


def test_frechet_distance_agrees_with_scipy_sqrtm_on_random_covariances():
    scipy_linalg = pytest.importorskip("scipy.linalg")
    rng = np.random.default_rng(2)
    a, b = rng.normal(size=(12, 12)), rng.normal(size=(12, 12))
    s1, s2 = a @ a.T + 0.1 * np.eye(12), b @ b.T + 0.1 * np.eye(12)
    covmean = scipy_linalg.sqrtm(s1 @ s2).real
    expected = np.trace(s1) + np.trace(s2) - 2 * np.trace(covmean)
    assert fid.frechet_distance(np.zeros(12), s1, np.zeros(12), s2) == pytest.approx(expected, rel=1e-6)


def test_singular_covariance_from_few_samples_is_finite():
    """Fewer samples than dimensions give singular covariances; the result must stay real and finite."""
    rng = np.random.default_rng(3)
    x, y = rng.normal(size=(10, 64)), rng.normal(size=(10, 64)) + 1.0
    value = fid.fid_from_features(x, y)
    assert np.isfinite(value) and value > 0


def test_fid_of_a_set_against_itself_is_zero_and_grows_with_noise_and_shift():
    rng = np.random.default_rng(4)
    features = rng.normal(size=(2000, 32)) @ rng.normal(size=(32, 32))
    assert fid.fid_from_features(features, features) == pytest.approx(0.0, abs=1e-6)
    values = [fid.fid_from_features(features, features + sigma * rng.normal(size=features.shape))
              for sigma in (0.1, 0.5, 1.0, 2.0)]
    assert values == sorted(values) and values[0] > 0
    shifted = [fid.fid_from_features(features, features + shift) for shift in (0.1, 1.0, 3.0)]
    assert shifted == sorted(shifted)
    # A pure shift of every feature by s adds exactly D * s^2.
    assert shifted[1] == pytest.approx(32 * 1.0, rel=1e-6)


def test_kid_is_unbiased_near_zero_for_one_distribution_and_positive_for_two():
    rng = np.random.default_rng(5)
    x, y = rng.normal(size=(1000, 16)), rng.normal(size=(1000, 16))
    same, same_std = fid.kid_from_features(x, y, num_subsets=20, subset_size=500)
    assert abs(same) < 3 * same_std + 1e-3  # unbiased: centred on 0, may be negative
    different, _ = fid.kid_from_features(x, y + 0.5, num_subsets=20, subset_size=500)
    assert different > 10 * max(abs(same), 1e-4)


def test_unbiased_mmd_matches_closed_form_for_point_masses():
    """x all at a, y all at b: MMD^2 = k(a,a) + k(b,b) - 2 k(a,b) exactly (the estimator is unbiased)."""
    a, b = np.array([[1.0, 0.0]]), np.array([[0.0, 2.0]])
    x, y = np.repeat(a, 5, axis=0), np.repeat(b, 5, axis=0)
    k = lambda p, q: (p @ q.T / 2 + 1.0) ** 3  # noqa: E731
    expected = (k(a, a) + k(b, b) - 2 * k(a, b)).item()
    assert fid.kernel_mmd2_unbiased(x, y) == pytest.approx(expected)


def test_scores_name_the_extractor():
    rng = np.random.default_rng(6)
    result = fid.scores(rng.normal(size=(100, 4)), rng.normal(size=(100, 4)), "my-extractor", kid_subsets=5)
    assert result["feature_extractor"] == "my-extractor"
    assert {"fid", "kid", "kid_std", "fid_num_real", "fid_num_fake"} <= result.keys()


def test_inception_extractor_refuses_a_missing_weights_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        fid.InceptionFeatures(str(tmp_path / "missing.h5"))


def test_inception_extractor_names_a_file_that_is_not_weights(tmp_path):
    text = tmp_path / "weights.h5"
    text.write_text("not weights")
    with pytest.raises(ValueError, match="not an HDF5"):
        fid.InceptionFeatures(str(text))
    other = tmp_path / "other.weights.h5"  # HDF5, but another network's weights
    import keras
    keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)]).save_weights(str(other))
    with pytest.raises(ValueError, match="not InceptionV3 weights") as error:
        fid.InceptionFeatures(str(other))
    assert len(str(error.value).splitlines()) == 1


# Slow: trains a digits classifier (21 s loaded); KID/FID arithmetic stays in the default suite.
@pytest.mark.slow
def test_classifier_extractor_gives_penultimate_features_and_fid_separates_digits(tmp_path):
    """A small classifier trained on real digits: features are the last Dense layer's input; FID between
    two halves of the digits is far lower than between digits and noise."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    images = (digits.images[..., None] / 8.0 - 1.0).astype(np.float32)
    labels = digits.target
    metrics = fid.train_feature_classifier((images[:1400], labels[:1400]), (images[1400:], labels[1400:]),
                                           str(tmp_path / "clf"), seed=0, epochs=8)
    assert metrics["val_accuracy"] > 0.8 and metrics["trained"] is True
    extractor = fid.ClassifierFeatures(str(tmp_path / "clf"))
    assert extractor.trained is True
    assert "classifier_penultimate" in extractor.name and "model.keras" in extractor.name
    features = extractor(images)
    assert features.shape == (len(images), extractor.feature_size)
    rng = np.random.default_rng(0)
    noise = rng.uniform(-1, 1, images.shape).astype(np.float32)
    halves = fid.fid_from_features(features[::2], features[1::2])
    versus_noise = fid.fid_from_features(features[::2], extractor(noise[::2]))
    assert versus_noise > 10 * halves
    # Larger images are resized to the classifier's input.
    big = np.repeat(np.repeat(images[:8], 2, axis=1), 2, axis=2)
    assert extractor(big).shape == (8, extractor.feature_size)
    with pytest.raises(FileNotFoundError, match="export/model.keras"):
        fid.ClassifierFeatures(str(tmp_path / "nothing-here"))


def test_a_classifier_saved_under_mixed_bfloat16_gives_float32_features(tmp_path):
    """A saved layer keeps its dtype policy whatever the global one at load time; features must be float32
    computations all the same (bfloat16 keeps 8 bits of mantissa: FIDs would move with the training run's
    precision)."""
    import keras

    from tfgpu.models import create_model

    keras.mixed_precision.set_global_policy("mixed_bfloat16")
    try:
        saved = create_model("small_cnn", (8, 8, 1), 10)
    finally:
        keras.mixed_precision.set_global_policy("float32")
    (tmp_path / "export").mkdir()
    saved.save(tmp_path / "export" / "model.keras")
    extractor = fid.ClassifierFeatures(str(tmp_path))
    assert {layer.compute_dtype for layer in extractor.model._flatten_layers()} == {"float32"}
    reference = create_model("small_cnn", (8, 8, 1), 10)
    reference.set_weights(saved.get_weights())
    images = np.random.default_rng(0).uniform(-1, 1, (16, 8, 8, 1)).astype(np.float32)
    expected = keras.Model(reference.inputs, fid._last_dense(reference).input)(images).numpy()
    np.testing.assert_allclose(extractor(images), expected, rtol=1e-5, atol=1e-6)


def test_one_class_gives_an_untrained_extractor_that_says_so(tmp_path):
    """One class leaves a classifier nothing to learn (one logit, loss 0 whatever the weights): the network is
    kept as initialised, and its record, name and ``trained`` flag say so."""
    rng = np.random.default_rng(0)
    images = rng.uniform(-1, 1, (64, 8, 8, 1)).astype(np.float32)
    metrics = fid.train_feature_classifier((images, np.zeros(64, np.int64)), None, str(tmp_path / "clf"), seed=0)
    assert metrics["trained"] is False and "1 class" in metrics["reason"]
    extractor = fid.ClassifierFeatures(str(tmp_path / "clf"))
    assert extractor.trained is False and "untrained" in extractor.name
    assert extractor(images).shape == (64, extractor.feature_size)


def test_a_feature_classifiers_record_that_is_not_tfgpus_is_one_line_naming_it(tmp_path):
    """--fid_feature_model_dir=D: D/metrics.json says whether D/export/model.keras was trained; one that is not a
    tfgpu metrics.json stops in one line naming it (before: read as "trained", an untrained network's FIDs then
    passed for a trained one's). A .keras file outside an export directory has no record to read."""
    from tfgpu.config import ConfigError

    (tmp_path / "export").mkdir()
    (tmp_path / "metrics.json").write_text('{"trained": "no"}')
    with pytest.raises(ConfigError, match=r"^--fid_feature_model_dir: \S+/metrics.json is not a tfgpu metrics.json: "
                                          r"'trained' is 'no', not true or false$"):
        fid._classifier_trained(str(tmp_path / "export" / "model.keras"))
    assert fid._classifier_trained(str(tmp_path / "model.keras")) == (True, "")


@pytest.fixture
def ram_dir():
    """A fresh ``ram://`` directory (TensorFlow's in-memory file system, standing in for gs://), removed after."""
    import uuid

    from tfgpu.runtime import fileio

    root = f"ram://tfgpu-test-{uuid.uuid4().hex[:8]}"
    yield root
    fileio.rmtree(root)


def test_a_feature_classifier_on_ram_is_written_and_read_there(ram_dir, tmp_path, monkeypatch):
    """<model_dir>/fid_features on ram://: Keras saves locally and the whole file lands there (no temporary left
    beside it), ClassifierFeatures loads it through a local copy and reads its metrics.json there, with the same
    features as the same classifier kept locally; nothing is written in the working directory (a "ram://" path
    written through os would appear there as ./ram:)."""
    from tfgpu.runtime import fileio

    monkeypatch.chdir(tmp_path)
    images = np.random.default_rng(0).uniform(-1, 1, (32, 8, 8, 1)).astype(np.float32)
    labels = np.zeros(32, np.int64)  # one class: exported as initialised, so the test trains nothing
    remote, local = f"{ram_dir}/run/fid_features", str(tmp_path / "local")
    assert fid.train_feature_classifier((images, labels), None, remote, seed=0)["trained"] is False
    fid.train_feature_classifier((images, labels), None, local, seed=0)
    assert fileio.listdir(f"{remote}/export") == ["model.keras"]
    assert fileio.isfile(f"{remote}/metrics.json")
    extractor = fid.ClassifierFeatures(remote)
    assert extractor.trained is False  # read from the remote metrics.json
    assert extractor.name.startswith(f"classifier_penultimate:{remote}/export/model.keras (untrained")
    np.testing.assert_array_equal(extractor(images), fid.ClassifierFeatures(local)(images))
    assert sorted(os.listdir(tmp_path)) == ["local"]
    with pytest.raises(FileNotFoundError, match="export/model.keras"):
        fid.ClassifierFeatures(f"{ram_dir}/nothing-here")


def test_inception_weights_on_ram_are_checked_and_read_there(ram_dir, monkeypatch):
    """--inception_weights may be remote: the HDF5 check reads the file there, and Keras gets a local copy of it
    (Keras opens only local files), removed afterwards."""
    import keras

    from tfgpu.runtime import fileio

    fileio.atomic_write_bytes(f"{ram_dir}/text.h5", b"not weights")
    assert "not an HDF5" in fid.weights_file_problem(f"{ram_dir}/text.h5")
    assert "cannot be read" in fid.weights_file_problem(f"{ram_dir}/missing.h5")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        fid.InceptionFeatures(f"{ram_dir}/missing.h5")
    weights = fid._HDF5_SIGNATURE + b"the rest of the weights"
    fileio.atomic_write_bytes(f"{ram_dir}/inception.h5", weights)
    given = {}

    def inception(weights, **kwargs):  # what Keras would be handed; building the real network takes seconds
        with open(weights, "rb") as f:
            given.update(path=weights, data=f.read())
        return keras.Sequential([keras.Input((299, 299, 3)), keras.layers.GlobalAveragePooling2D()])

    monkeypatch.setattr(keras.applications, "InceptionV3", inception)
    extractor = fid.InceptionFeatures(f"{ram_dir}/inception.h5")
    assert given["data"] == weights and given["path"].endswith("inception.h5") and "://" not in given["path"]
    assert not os.path.exists(given["path"])
    assert extractor.name.endswith(f":{ram_dir}/inception.h5")
