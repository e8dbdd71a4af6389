"""A classifier's head as the classification task takes it: which heads it accepts (``check_model``,
``check_binary_model``, ``check_input_range``: one line naming the flag for any other), and the cross-entropy it
computes from that head's outputs (logits, or probabilities when the softmax/sigmoid cannot be separated)."""
import logging

import tensorflow as tf

from tfgpu.config import ConfigError
from tfgpu.models import heads

log = logging.getLogger("tfgpu")
PROBABILITY_FLOOR = 1e-7  # log(0) guard for a softmax that cannot be separated (Keras' epsilon)


def softmax_cross_entropy(labels, outputs, num_classes: int, smoothing: float, from_probabilities: bool):
    """Each example's cross-entropy over ``num_classes`` (label smoothing toward uniform, as Keras smooths)."""
    targets = tf.one_hot(labels, num_classes)
    if smoothing:
        targets = targets * (1.0 - smoothing) + smoothing / num_classes
    if from_probabilities:
        return -tf.reduce_sum(targets * tf.math.log(tf.clip_by_value(outputs, PROBABILITY_FLOOR, 1.0)), -1)
    return tf.nn.softmax_cross_entropy_with_logits(targets, outputs)


def binary_cross_entropy(labels, outputs, smoothing: float, from_probabilities: bool):
    """Each example's binary_crossentropy of one unit on labels 0/1 (Keras' smoothing: toward 0.5)."""
    targets = tf.cast(labels, tf.float32)[:, None]
    if smoothing:
        targets = targets * (1.0 - smoothing) + 0.5 * smoothing
    if from_probabilities:
        p = tf.clip_by_value(outputs, PROBABILITY_FLOOR, 1.0 - PROBABILITY_FLOOR)
        return -tf.reduce_mean(targets * tf.math.log(p) + (1.0 - targets) * tf.math.log(1.0 - p), -1)
    return tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(targets, outputs), -1)


def check_model(model, name: str, num_classes: int, input_range) -> heads.Head:
    """The head of classifier ``name`` (``heads.output_head``), after one INFO line when it is a softmax;
    ``ConfigError(model)`` for a sigmoid head, ``ConfigError(input_range)`` when the model begins with a
    Rescaling that expects 0..255 pixels and --input_range is not 0,255."""
    head = heads.output_head(model)
    where = f"(layer {head.layer!r})"
    if head.gives_probabilities and head.activation != "softmax":
        raise ConfigError("model", f"{name} ends in a {head.activation} {where}, which scores each of the "
                          f"{num_classes} classes on its own; the classification task trains one softmax over them: "
                          "remove the activation (activation=None, logits) or end in softmax")
    if head.activation == "softmax":
        how = ("from the logits that softmax takes (the same weights), in float32" if head.logits is not None else
               f"from its probabilities in float32, clipped at {PROBABILITY_FLOOR:g} (the softmax cannot be "
               "separated from the layer)")
        log.info("model %s ends in a softmax %s: it gives probabilities (as its export does); the loss is computed "
                 "%s (metrics.json: model_output=probabilities)", name, where, how)
    check_input_range(model, name, input_range)
    return head


def check_binary_model(model, name: str, num_classes: int, input_range) -> heads.Head:
    """The head of ``name`` compiled with binary_crossentropy: one logit or one sigmoid unit (the loss is computed
    from the logit under it); ``ConfigError(model)`` for another head or labels other than 0/1,
    ``ConfigError(input_range)`` as ``check_model``."""
    head = heads.output_head(model)
    if head.activation not in (None, "sigmoid"):
        raise ConfigError("model", f"{name} ends in a {head.activation} (layer {head.layer!r}) but was compiled with "
                          "binary_crossentropy, which trains one sigmoid unit: end in Dense(1, activation='sigmoid') "
                          "(or Dense(1) and from_logits=True)")
    if num_classes > 2:
        raise ConfigError("model", f"compiled with binary_crossentropy, but the labels hold {num_classes} classes: "
                          "binary labels are 0 and 1 (for more classes compile with "
                          "sparse_categorical_crossentropy and end in Dense(num_classes))")
    check_input_range(model, name, input_range)
    return head


def check_input_range(model, name: str, input_range) -> None:
    """``ConfigError(input_range)`` when ``model`` begins with a Rescaling that expects 0..255 pixels and
    --input_range is not 0,255."""
    rescaling = heads.leading_rescaling(model)
    low, high = (float(v) for v in input_range)
    if rescaling and heads.expects_pixels(*rescaling[1:]) and (low, high) != (0.0, 255.0):
        layer, scale, offset = rescaling
        raise ConfigError("input_range", f"{name} begins with Rescaling(scale={scale:.6g}, offset={offset:g}) "
                          f"(layer {layer!r}), so it expects pixels in 0..255, but --input_range={low:g},{high:g} "
                          f"feeds it {low:g}..{high:g}: set --input_range=0,255")
