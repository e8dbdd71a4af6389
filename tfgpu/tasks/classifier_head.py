"""A classifier's head as the classification task takes it: which heads it accepts (``check_model``,
``check_input_range``: one line naming the flag for any other), and the cross-entropy it computes from that head's
outputs (logits, or probabilities when the softmax cannot be separated)."""
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


def check_model(model, name: str, num_classes: int, input_range) -> heads.Head:
    """The head of classifier ``name`` (``softmax_head``), once the model's first layer takes --input_range:
    ``ConfigError(input_range)`` when the model begins with a Rescaling that expects 0..255 pixels and
    --input_range is not 0,255."""
    head = softmax_head(model, name, num_classes)
    check_input_range(model, name, input_range)
    return head


def softmax_head(model, name: str, num_classes: int) -> heads.Head:
    """The head of classifier ``name`` (``heads.output_head``), after one INFO line when it is a softmax;
    ``ConfigError(model)`` for a sigmoid head."""
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
