"""models/random_states: a checkpoint with the model's random states resumes Dropout's stream; without them (Keras'
own checkpoint of the model) it restarts, which is why they are saved beside the model."""
import keras
import numpy as np
import tensorflow as tf

from tfgpu.models import random_states


def _dropout_model():
    keras.utils.set_random_seed(0)
    return keras.Sequential([keras.Input((16,)), keras.layers.Dropout(0.5)])


def _draws(model, n=3):
    ones = np.ones((4, 16), "float32")
    return [model(ones, training=True).numpy() for _ in range(n)]


def test_the_states_resume_dropouts_stream_and_the_model_alone_does_not(tmp_path):
    model = _dropout_model()
    assert random_states.items(model).keys() == {"random_states"}
    _draws(model)
    path = tf.train.Checkpoint(model=model, **random_states.items(model)).save(str(tmp_path / "with"))
    alone = tf.train.Checkpoint(model=model).save(str(tmp_path / "alone"))
    expected = _draws(model)

    resumed = _dropout_model()
    tf.train.Checkpoint(model=resumed, **random_states.items(resumed)).restore(path).assert_consumed()
    for a, b in zip(expected, _draws(resumed)):
        np.testing.assert_array_equal(a, b)

    restarted = _dropout_model()
    tf.train.Checkpoint(model=restarted).restore(alone)
    assert not np.array_equal(expected[0], _draws(restarted)[0])


def test_a_model_without_seed_generators_adds_no_item():
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2), keras.layers.BatchNormalization()])
    assert random_states.of(model) == [] and random_states.items(model) == {}
