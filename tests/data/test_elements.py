"""What an element of a user's Dataset must be for tfgpu.fit: one clear error for each wrong structure; what Keras'
loaders give (batches, float pixels, one-hot labels, class_names) taken as it is."""
import numpy as np
import pytest
import tensorflow as tf

from tfgpu.config import ConfigError
from tfgpu.data import elements


def _ds(images, labels):
    return tf.data.Dataset.from_tensor_slices((images, labels))


def _spec_error(dataset) -> str:
    with pytest.raises(ConfigError) as e:
        elements.check_spec(dataset, "train_data")
    assert e.value.flag == "train_data"
    return str(e.value)


def test_wrong_structures_are_one_error_naming_the_argument_and_the_fix():
    images = np.zeros((4, 8, 8, 1), np.uint8)
    labels = np.zeros(4, np.int64)
    assert "ds.unbatch()" in _spec_error(_ds(images, labels).batch(2))
    assert "ds.unbatch()" in _spec_error(_ds(images[..., 0], labels).batch(2))  # (N, H, W) grayscale batches
    assert "no label" in _spec_error(tf.data.Dataset.from_tensor_slices(images))
    assert "dicts (image, label)" in _spec_error(tf.data.Dataset.from_tensor_slices({"image": images,
                                                                                     "label": labels}))
    assert "uint8 or float" in _spec_error(_ds(images.astype(np.int32), labels))
    assert "HxWxC" in _spec_error(_ds(images[..., 0], labels))
    assert "2 channels" in _spec_error(_ds(np.zeros((4, 8, 8, 2), np.uint8), labels))
    assert "class indices or one-hot" in _spec_error(_ds(images, labels.astype(bool)))
    assert "scalars" in _spec_error(_ds(images, labels[:, None, None, None]))
    assert "infinite" in _spec_error(_ds(images, labels).repeat())
    assert "no examples" in _spec_error(_ds(images, labels).take(0))
    assert "tf.data.Dataset" in _spec_error((images, labels))
    elements.check_spec(_ds(images, labels.astype(np.int32)), "train_data")  # any integer labels
    assert "ds.unbatch()" in str(pytest.raises(ConfigError, elements.accept,
                                               _ds(images, labels).batch(2).batch(2), "train_data").value)


def test_class_names_name_the_classes_and_must_agree():
    images, labels = np.zeros((2, 2, 2, 1), np.uint8), np.array([0, 1])
    train, val = _ds(images, labels), _ds(images, labels)
    train.class_names, val.class_names = ["cat", "dog"], ["cat", "dog"]
    assert elements.class_names(train, val) == ("cat", "dog")
    val.class_names = ["dog", "cat"]
    with pytest.raises(ConfigError, match=r"class_names \['dog', 'cat'\] differ from train_data's") as e:
        elements.class_names(train, val)
    assert e.value.flag == "eval_data"
