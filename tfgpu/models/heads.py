"""What a built model's last layer does to its output and its first layer expects of its input.

A classifier must give logits and a GAN discriminator one logit per example, yet most Keras tutorials end in a
softmax (or sigmoid); trained as logits, such a model learns against ``softmax(softmax(x))``. A generator must
reach the GAN's [-1, 1] (tanh, or no activation), and a model that begins with ``Rescaling(1/255)`` expects
0..255 pixels. ``output_head`` and ``leading_rescaling`` find these once, when the model is built.

How: the output tensor is followed back through functional and Sequential models, nested ones included, and past
layers that hand their values on (``Activation("linear")``, ``Identity``, ``Flatten``, ``Reshape``, the float32
cast tfgpu adds, and ``keras.ops.cast``/``reshape`` called on the graph's tensors); the layer reached is read
(``Softmax``, ``ReLU``, ``Activation``, or a layer's ``activation=``), or the op a functional graph applies there
(``keras.ops.softmax(x)`` or ``keras.activations.sigmoid(x)`` called on a tensor of the graph: Keras records an
op node, not a layer, read by its class: ``_GRAPH_OPS``).
A layer that cannot be read so (a subclassed model, a custom layer, a ``Lambda``) is traced once as a
``tf.function`` and the op that makes its output is read. Cost: a walk of a few layers (microseconds) for
functional and Sequential models; one trace of the final layer otherwise (a subclassed model: one trace of the
model, about what its first step's trace costs); no forward pass, no data. A subclassed model's first layer is not
known, so its input range is not checked.
"""
import dataclasses
import logging

import keras
import tensorflow as tf

log = logging.getLogger("tfgpu")

# The activations a final layer may apply, by function (Keras', keras.ops', tf.nn's and tf.math's) and by the
# graph op that a traced layer ends in.
_ACTIVATION_NAMES = ("softmax", "sigmoid", "hard_sigmoid", "tanh", "relu", "relu6", "softplus", "exponential",
                     "linear", "log_softmax", "elu", "selu", "gelu", "silu", "swish")
_OPS = {"Softmax": "softmax", "Sigmoid": "sigmoid", "Tanh": "tanh", "Relu": "relu", "Relu6": "relu6",
        "Softplus": "softplus", "Exp": "exponential", "LogSoftmax": "log_softmax", "Elu": "elu", "Selu": "selu"}
_TRANSPARENT_OPS = ("Identity", "IdentityN", "Cast", "StopGradient")
# The op nodes Keras records when keras.ops.* or keras.activations.* is called on a functional graph's tensor (classes
# of keras.src.ops), by class name: the activation each applies, and those that hand their values on unchanged.
_GRAPH_OPS = {"Softmax": "softmax", "Sigmoid": "sigmoid", "HardSigmoid": "hard_sigmoid", "Tanh": "tanh",
              "Relu": "relu", "Relu6": "relu6", "Softplus": "softplus", "Exp": "exponential",
              "LogSoftmax": "log_softmax", "Elu": "elu", "Selu": "selu", "Gelu": "gelu", "Silu": "silu"}
_GRAPH_PASS_THROUGH = ("Cast", "Reshape")
# The range of values each bounded activation gives (a generator's must reach [-1, 1]).
RANGES = {"sigmoid": (0.0, 1.0), "hard_sigmoid": (0.0, 1.0), "softmax": (0.0, 1.0), "tanh": (-1.0, 1.0),
          "relu": (0.0, float("inf")), "relu6": (0.0, 6.0), "softplus": (0.0, float("inf")),
          "exponential": (0.0, float("inf")), "elu": (-1.0, float("inf")), "selu": (-1.7581, float("inf"))}
PROBABILITIES = ("softmax", "sigmoid", "hard_sigmoid")  # heads whose output is a probability, not a logit


def _activation_table() -> dict:
    table = {}
    for name in _ACTIVATION_NAMES:
        for module in (keras.activations, keras.ops, tf.nn, tf.math):
            function = getattr(module, name, None)
            if callable(function):
                table.setdefault(function, name)
    return table


_ACTIVATIONS = _activation_table()
# Layers whose call ends in ``self.activation(...)``: called without it, they give the pre-activation values.
_ACTIVATION_LAST = (keras.layers.Dense, keras.layers.EinsumDense, keras.layers.Conv1D, keras.layers.Conv2D,
                    keras.layers.Conv3D, keras.layers.Conv1DTranspose, keras.layers.Conv2DTranspose,
                    keras.layers.Conv3DTranspose, keras.layers.SeparableConv1D, keras.layers.SeparableConv2D,
                    keras.layers.DepthwiseConv1D, keras.layers.DepthwiseConv2D)

# Layers that are an activation of their own (Activation is read by its ``activation``): their name, or None.
_ACTIVATION_LAYERS = {keras.layers.Softmax: lambda layer: "softmax",
                      keras.layers.ReLU: lambda layer: None if float(layer.negative_slope) else "relu"}
_SHAPE_ONLY = (keras.layers.Identity, keras.layers.Flatten, keras.layers.Reshape)


@dataclasses.dataclass(frozen=True)
class Head:
    """The activation that makes a model's output (None: none, the model gives raw values), the layer that applies
    it ("head/dense_1" inside a nested model), and, when that activation can be separated, ``logits``: a model of
    the same layers and weights whose output is the activation's input."""
    activation: str | None
    layer: str = ""
    logits: keras.Model | None = None

    @property
    def gives_probabilities(self) -> bool:
        return self.activation in PROBABILITIES


def output_head(model: keras.Model) -> Head:
    """The activation at the end of ``model``'s first output (module docstring: how, and what it costs)."""
    activation, path, pre = _head_of(model, model.outputs[0], ())
    logits = keras.Model(_inputs(model), pre, name=f"{model.name}_logits") if pre is not None else None
    return Head(activation, "/".join(path), logits)


def _inputs(model):
    return model.inputs[0] if len(model.inputs) == 1 else model.inputs


def _head_of(model, tensor, path):
    """(activation, layer path, the activation's input as a tensor of ``model``'s graph or None) for ``tensor``."""
    layer, node_index, tensor_index = tensor._keras_history
    node = layer._inbound_nodes[node_index]
    if _is_graph_op(layer):  # keras.ops.* / keras.activations.* called on the graph's tensor: an op node
        name = type(layer).__name__
        if name in _GRAPH_PASS_THROUGH and len(node.input_tensors) == 1:
            activation, found, pre = _head_of(model, node.input_tensors[0], path)
            return activation, found, (layer(pre) if pre is not None else None)
        single = len(node.input_tensors) == 1
        return _GRAPH_OPS.get(name), path + (layer.name,), (node.input_tensors[0] if single and name in _GRAPH_OPS
                                                            else None)
    if _passes_through(layer) and len(node.input_tensors) == 1:  # the logits pass through it too
        activation, found, pre = _head_of(model, node.input_tensors[0], path)
        return activation, found, (layer(pre) if pre is not None else None)
    path = path + (layer.name,)
    if _walkable(layer):
        activation, inner_path, inner_pre = _head_of(layer, layer.outputs[tensor_index], path)
        pre = None
        if inner_pre is not None and len(layer.inputs) == 1 and len(node.input_tensors) == 1:
            pre = keras.Model(_inputs(layer), inner_pre, name=f"{layer.name}_logits")(node.input_tensors[0])
        return activation, inner_path, pre
    named = _ACTIVATION_LAYERS.get(type(layer), lambda _: None)(layer)
    if named:
        return named, path, node.input_tensors[0]
    activation = _activation_of(layer, tensor)
    if activation == "linear":
        return None, path, None
    if activation is not None:
        separable = isinstance(layer, (keras.layers.Activation,) + _ACTIVATION_LAST) and len(node.input_tensors) == 1
        if not separable:
            return activation, path, None
        if isinstance(layer, keras.layers.Activation):
            return activation, path, node.input_tensors[0]
        return activation, path, WithoutActivation(layer)(node.input_tensors[0])
    if _is_keras_builtin(layer):
        return None, path, None
    return _traced_activation(layer, node), path, None


def _is_graph_op(operation) -> bool:
    """A Keras op node of a functional graph (``keras.ops.softmax(x)``), not a layer."""
    return not isinstance(operation, keras.layers.Layer) and type(operation).__module__.startswith("keras.")


def _passes_through(layer) -> bool:
    """A layer that moves or casts values without changing them: what comes before it is the head."""
    return isinstance(layer, _SHAPE_ONLY) or (
        isinstance(layer, keras.layers.Activation) and _activation_of(layer) == "linear")


def _walkable(layer) -> bool:
    """A functional or Sequential model: its graph of layers can be followed."""
    if not isinstance(layer, keras.Model):
        return False
    try:
        return bool(layer.outputs) and bool(layer.inputs)
    except (AttributeError, ValueError):
        return False


def _activation_of(layer, output=None) -> str | None:
    """The name of ``layer``'s ``activation`` ("linear" when it has one that does nothing), None without one. A
    callable tfgpu does not know (``activation=lambda x: tf.nn.softmax(x)``) is traced on ``output``'s spec."""
    function = getattr(layer, "activation", None)
    if function is None or not callable(function):
        return None
    try:
        known = _ACTIVATIONS.get(function)
    except TypeError:  # an unhashable callable
        known = None
    if known or output is None:
        return known
    return _traced(function, (tf.TensorSpec(output.shape, output.dtype),), f"{layer.name}'s activation")


def _is_keras_builtin(layer) -> bool:
    return type(layer).__module__.startswith("keras.") and not isinstance(layer, keras.layers.Lambda)


def _traced_activation(layer, node) -> str | None:
    """The activation of the op that makes ``layer``'s output, from one trace of its call on the node's inputs."""
    def spec(value):
        return tf.TensorSpec(value.shape, value.dtype) if isinstance(value, keras.KerasTensor) else value

    arguments = keras.tree.map_structure(spec, node.arguments.args)
    return _traced(lambda *args: layer(*args, training=False), arguments, f"the last layer {layer.name}")


def _traced(function, arguments, what: str) -> str | None:
    """The activation (``_OPS``) of the op that makes ``function``'s output, read from one trace (no forward pass);
    None when it is none of them or ``function`` cannot be traced on its own."""
    def call(*args):
        with tf.name_scope("traced_head"):  # a root scope may not begin with "_", as a layer's name may
            return function(*args)

    try:
        traced = tf.function(call).get_concrete_function(*arguments)
    except Exception as e:  # a user layer's call that only runs inside its model: assume logits, and say so
        reason = ([line.strip() for line in str(e).splitlines() if line.strip()] or [type(e).__name__])[-1]
        log.warning("%s could not be traced on its own (%s); its output is taken as logits", what, reason)
        return None
    op = traced.outputs[0].op
    while op.type in _TRANSPARENT_OPS and op.inputs:
        op = op.inputs[0].op
    return _OPS.get(op.type)


class WithoutActivation(keras.layers.Layer):
    """``layer`` (its own weights) called with its activation switched off: the values its activation would take.
    The switch lasts one call of ``layer``; a step traced on several replicas traces them one at a time."""

    def __init__(self, layer, **kwargs):
        super().__init__(name=f"{layer.name}_without_activation", dtype=layer.dtype_policy, **kwargs)
        self.wrapped = layer

    def call(self, inputs):
        activation = self.wrapped.activation
        self.wrapped.activation = keras.activations.linear
        try:
            return self.wrapped(inputs)
        finally:
            self.wrapped.activation = activation


def leading_rescaling(model) -> tuple[str, float, float] | None:
    """(layer path, scale, offset) of a ``Rescaling`` that is the first layer of ``model`` (or of the model
    nested first in it), else None. A subclassed model's first layer is unknown: None."""
    path = ()
    while _walkable(model):
        layers = [layer for layer in model.layers if not isinstance(layer, keras.layers.InputLayer)]
        if not layers:
            return None
        first = layers[0]
        path += (first.name,)
        if isinstance(first, keras.layers.Rescaling):
            try:
                return "/".join(path), float(first.scale), float(first.offset)
            except (TypeError, ValueError):  # per-channel factors: not a plain 0..255 rescaling
                return None
        model = first
    return None


def expects_pixels(scale: float, offset: float) -> bool:
    """Whether ``x * scale + offset`` maps 0..255 onto [0, 1] or [-1, 1]: a model that expects 0..255 pixels."""
    return any(abs(offset - low) < 1e-6 and abs(255.0 * scale + offset - 1.0) < 1e-4 for low in (0.0, -1.0))
