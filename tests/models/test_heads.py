"""tfgpu.models.heads: the activation at the end of a model, whatever way the model was written, and a model view
that gives the logits that activation takes (issue 28 item 8)."""
import keras
import numpy as np
import pytest
import tensorflow as tf
from hypothesis import HealthCheck, given, settings, strategies as st
from keras import layers

from tfgpu.models import heads
from tfgpu.models.registry import float32_outputs

SHAPE = (8, 8, 1)
# Every way a tutorial writes a softmax head: on the last Dense, as its own layer, or by function object.
SOFTMAX_HEADS = {
    "dense_activation_string": lambda: [layers.Dense(10, activation="softmax")],
    "dense_activation_function": lambda: [layers.Dense(10, activation=keras.activations.softmax)],
    "dense_tf_nn_softmax": lambda: [layers.Dense(10, activation=tf.nn.softmax)],
    "dense_own_callable": lambda: [layers.Dense(10, activation=lambda x: tf.nn.softmax(x))],  # read by a trace
    "activation_layer": lambda: [layers.Dense(10), layers.Activation("softmax")],
    "softmax_layer": lambda: [layers.Dense(10), layers.Softmax()],
    "float32_softmax_as_the_mixed_precision_guide_says": lambda: [layers.Dense(10),
                                                                  layers.Activation("softmax", dtype="float32")],
}


def _functional(head_layers):
    inputs = keras.Input(SHAPE)
    x = layers.Flatten()(layers.Conv2D(4, 3, activation="relu")(inputs))
    for layer in head_layers:
        x = layer(x)
    return keras.Model(inputs, x)


def _sequential(head_layers):
    return keras.Sequential([keras.Input(SHAPE), layers.Conv2D(4, 3, activation="relu"), layers.Flatten(),
                             *head_layers])


def _sequential_without_input(head_layers):  # built only when tfgpu calls it
    return keras.Sequential([layers.Conv2D(4, 3, activation="relu"), layers.Flatten(), *head_layers])


def _nested_at_the_end(head_layers):
    inputs = keras.Input(SHAPE)
    features = layers.Flatten()(layers.Conv2D(4, 3, activation="relu")(inputs))
    head = keras.Sequential([keras.Input(features.shape[1:]), *head_layers], name="head")
    return keras.Model(inputs, head(features))


STYLES = {"functional": _functional, "sequential": _sequential, "sequential_without_input": _sequential_without_input,
          "nested_at_the_end": _nested_at_the_end}


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(head=st.sampled_from(sorted(SOFTMAX_HEADS)), style=st.sampled_from(sorted(STYLES)),
       policy=st.sampled_from(["float32", "mixed_float16", "mixed_bfloat16"]))
def test_every_softmax_head_is_found_and_its_logits_view_shares_the_weights(head, style, policy):
    keras.mixed_precision.set_global_policy(policy)
    model = float32_outputs(STYLES[style](SOFTMAX_HEADS[head]()), SHAPE)
    found = heads.output_head(model)
    assert found.activation == "softmax" and found.gives_probabilities and found.logits is not None
    assert {id(v) for v in found.logits.trainable_variables} == {id(v) for v in model.trainable_variables}
    images = np.random.default_rng(0).uniform(-1, 1, (3,) + SHAPE).astype("float32")
    logits = tf.cast(found.logits(images), tf.float32)
    tolerance = 1e-6 if policy == "float32" else 2e-2
    np.testing.assert_allclose(tf.nn.softmax(logits), model(images), atol=tolerance)


class _SubclassedSoftmax(keras.Model):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.flatten, self.dense = layers.Flatten(), layers.Dense(10)

    def call(self, x):
        return tf.nn.softmax(self.dense(self.flatten(x)))


class _SubclassedLogits(_SubclassedSoftmax):
    def call(self, x):
        return self.dense(self.flatten(x))


def test_a_subclassed_softmax_is_found_by_one_trace_but_cannot_be_separated():
    found = heads.output_head(float32_outputs(_SubclassedSoftmax(), SHAPE))
    assert (found.activation, found.logits) == ("softmax", None)
    in_a_lambda = heads.output_head(_functional([layers.Dense(10), layers.Lambda(lambda x: keras.ops.softmax(x))]))
    assert (in_a_lambda.activation, in_a_lambda.logits) == ("softmax", None)
    assert heads.output_head(float32_outputs(_SubclassedLogits(), SHAPE)).activation is None


@pytest.mark.parametrize("activation", ["sigmoid", "hard_sigmoid", "tanh", "relu"])
def test_other_final_activations_are_named(activation):
    found = heads.output_head(_functional([layers.Dense(10, activation=activation)]))
    assert found.activation == activation and found.layer.startswith("dense")
    assert found.gives_probabilities == (activation in ("sigmoid", "hard_sigmoid"))


@pytest.mark.parametrize("scale,offset,expects", [(1 / 255, 0.0, True), (1 / 127.5, -1.0, True), (2 / 255, -1.0, True),
                                                  (0.5, 0.5, False), (1.0, 0.0, False), (1 / 255, 0.5, False)])
def test_a_leading_rescaling_is_found_nested_and_read_for_0_to_255_pixels(scale, offset, expects):
    preprocessing = keras.Sequential([layers.Rescaling(scale, offset)], name="preprocessing")
    model = keras.Sequential([keras.Input(SHAPE), preprocessing, layers.Flatten(), layers.Dense(10)])
    found = heads.leading_rescaling(model)
    assert found[0].startswith("preprocessing/rescaling") and found[1:] == pytest.approx((scale, offset))
    assert heads.expects_pixels(scale, offset) == expects
    assert heads.leading_rescaling(_functional([layers.Dense(10)])) is None
