"""Model size and compute: parameter counts and multiply-adds per image.

``flops_per_example`` traces the model's inference graph at batch 1 and sums
the multiply-accumulates of its Conv2D, depthwise, transposed-conv and matmul
ops from their static shapes. That is the convention of the papers' tables
(ResNet-50: 4.1 GMACs at 224 px): element-wise ops (BN, ReLU, adds, pooling)
are not counted, and one MAC is one multiply plus one add.
"""
import math

import numpy as np
import tensorflow as tf


def count_params(model) -> int:
    """Trainable parameters, as papers count them (BN moving statistics excluded)."""
    return int(sum(np.prod(w.shape) for w in model.trainable_weights))


def _dims(tensor):
    shape = tensor.shape.as_list()
    if any(d is None for d in shape):
        raise ValueError(f"op {tensor.op.name} has a dynamic shape {shape}; FLOPs need static shapes")
    return shape


def _conv_macs(op):  # every output value costs kh*kw*(input channels per group) MACs
    kh, kw, cin_per_group, _ = _dims(op.inputs[1])
    return math.prod(_dims(op.outputs[0])) * kh * kw * cin_per_group


def _depthwise_macs(op):  # output channels = cin * multiplier, each from one kh*kw window
    kh, kw, _, _ = _dims(op.inputs[1])
    return math.prod(_dims(op.outputs[0])) * kh * kw


def _conv_transpose_macs(op):  # the gradient of a conv: every input value is spread over kh*kw*cout outputs
    kh, kw, cout, _ = _dims(op.inputs[1])
    return math.prod(_dims(op.inputs[2])) * kh * kw * cout


def _matmul_macs(op):
    a = _dims(op.inputs[0])
    transpose_a = op.get_attr("transpose_a") if op.type == "MatMul" else op.get_attr("adj_x")
    inner = a[-2] if transpose_a else a[-1]
    return math.prod(_dims(op.outputs[0])) * inner


def _einsum_macs(op):  # every combination of the equation's indices is one MAC
    inputs = op.get_attr("equation").decode().split("->")[0].split(",")
    sizes = {}
    for spec, tensor in zip(inputs, op.inputs):
        if "." in spec:
            raise ValueError(f"einsum with ellipsis in {op.name} is not supported by the FLOPs counter")
        sizes.update(zip(spec, _dims(tensor)))
    return math.prod(sizes.values())


_MAC_COUNTERS = {
    "Conv2D": _conv_macs,
    "Conv3D": _conv_macs,
    "DepthwiseConv2dNative": _depthwise_macs,
    "Conv2DBackpropInput": _conv_transpose_macs,
    "MatMul": _matmul_macs,
    "BatchMatMulV2": _matmul_macs,
    "BatchMatMulV3": _matmul_macs,
    "Einsum": _einsum_macs,
}


def flops_per_example(model, input_shape) -> int:
    """Multiply-accumulates for one image of ``input_shape`` (H, W, C) in inference mode."""
    spec = tf.TensorSpec((1, *input_shape), tf.float32)
    graph = tf.function(lambda x: model(x, training=False)).get_concrete_function(spec).graph
    return int(sum(_MAC_COUNTERS[op.type](op) for op in graph.get_operations() if op.type in _MAC_COUNTERS))
