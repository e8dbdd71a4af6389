"""tasks/classifier_head: the cross-entropy the classification task computes equals Keras' losses."""
import keras
import numpy as np
import pytest

from tfgpu.tasks import classifier_head


@pytest.mark.parametrize("smoothing", [0.0, 0.1])
def test_softmax_cross_entropy_is_keras_categorical_crossentropy(smoothing):
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(6, 4)).astype(np.float32)
    labels = rng.integers(0, 4, 6)
    want = keras.losses.CategoricalCrossentropy(from_logits=True, label_smoothing=smoothing, reduction=None)(
        np.eye(4)[labels], logits)
    got = classifier_head.softmax_cross_entropy(labels, logits, 4, smoothing, from_probabilities=False)
    np.testing.assert_allclose(got, want, rtol=1e-5)
    probs = keras.ops.softmax(logits)
    got = classifier_head.softmax_cross_entropy(labels, probs, 4, smoothing, from_probabilities=True)
    np.testing.assert_allclose(got, want, rtol=1e-4)
