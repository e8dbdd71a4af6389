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


# keras.ops.* and keras.activations.* called on a functional graph's tensor: Keras records an op node, not a layer
# (issue 37: a softmax model trained against softmax(softmax(x)) and a sigmoid one was exported as "logits").
GRAPH_OP_HEADS = {
    "keras_ops_softmax": (keras.ops.softmax, "softmax"),
    "keras_activations_softmax": (keras.activations.softmax, "softmax"),
    "keras_ops_sigmoid": (keras.ops.sigmoid, "sigmoid"),
    "keras_activations_sigmoid": (keras.activations.sigmoid, "sigmoid"),
    "keras_ops_softmax_then_cast": (lambda x: keras.ops.cast(keras.ops.softmax(x), "float32"), "softmax"),
}


@pytest.mark.parametrize("policy", ["float32", "mixed_float16"])
@pytest.mark.parametrize("head", sorted(GRAPH_OP_HEADS))
def test_an_activation_called_as_a_function_on_the_graph_is_found_and_separated(head, policy):
    keras.mixed_precision.set_global_policy(policy)
    try:
        function, activation = GRAPH_OP_HEADS[head]
        inputs = keras.Input(SHAPE)
        model = float32_outputs(keras.Model(inputs, function(layers.Dense(10)(layers.Flatten()(inputs)))), SHAPE)
        found = heads.output_head(model)
        assert found.activation == activation and found.gives_probabilities and found.logits is not None
        images = np.random.default_rng(0).uniform(-1, 1, (3,) + SHAPE).astype("float32")
        logits = tf.cast(found.logits(images), tf.float32)
        squash = tf.nn.softmax if activation == "softmax" else tf.nn.sigmoid
        np.testing.assert_allclose(squash(logits), model(images), atol=1e-6 if policy == "float32" else 2e-2)
    finally:
        keras.mixed_precision.set_global_policy("float32")


def test_a_sigmoid_called_on_the_graph_is_refused_by_the_classifier_and_a_graph_softmax_trains_on_its_logits():
    from tfgpu.config import ConfigError
    from tfgpu.tasks import classifier_head

    inputs = keras.Input(SHAPE)
    sigmoid = keras.Model(inputs, keras.ops.sigmoid(layers.Dense(10)(layers.Flatten()(inputs))))
    with pytest.raises(ConfigError, match="ends in a sigmoid"):
        classifier_head.check_model(sigmoid, "mine", 10, (0.0, 1.0))
    softmax = keras.Model(inputs, keras.activations.softmax(layers.Dense(10)(layers.Flatten()(inputs))))
    head = classifier_head.check_model(softmax, "mine", 10, (0.0, 1.0))
    assert head.activation == "softmax" and head.logits is not None


def test_an_op_that_is_no_activation_at_the_end_is_taken_as_logits():
    inputs = keras.Input(SHAPE)
    x = layers.Dense(10)(layers.Flatten()(inputs))
    assert heads.output_head(keras.Model(inputs, keras.ops.add(x, 1.0))).activation is None


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


@pytest.mark.parametrize("function, activation", [(keras.ops.softmax, "softmax"), (keras.ops.sigmoid, "sigmoid"),
                                                  (keras.activations.sigmoid, "sigmoid"),
                                                  (keras.activations.softmax, "softmax")])
def test_a_subclassed_call_ending_in_a_keras_activation_function_is_found_by_its_trace(function, activation):
    """A subclassed model's call is read from one trace of it (the op that makes its output), whatever API named
    the activation (issue 37)."""

    class Subclassed(_SubclassedLogits):
        def call(self, x):
            return function(self.dense(self.flatten(x)))

    found = heads.output_head(float32_outputs(Subclassed(), SHAPE))
    assert found.activation == activation and found.gives_probabilities
