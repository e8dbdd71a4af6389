"""keras.applications backbones with our own head, always randomly initialised.

Each net is ``keras.applications.<Net>(include_top=False, weights=None,
pooling="avg")`` (no download, ever) followed by a Dense head. Any channel
count works; the nets need images of at least 32x32.

Input scaling: our images arrive in [-1, 1] and every backbone here sees them
unchanged at its first conv:
- mobilenet_v2 has no preprocessing layers and was designed for [-1, 1];
- convnext_tiny is built with ``include_preprocessing=False``;
- efficientnet_b0 always starts with ``Rescaling(1/255)`` and a Normalization
  that is the identity when ``weights=None`` (it is never adapted); we put a
  ``Rescaling(255)`` in front so the two cancel (``undo_backbone_rescaling``).

``sync_batch_norm`` rebuilds the backbone with every BatchNormalization
synchronized. ``zero_init_residual`` zeroes the gamma of each block's last BN
(``<block>project_bn``) wherever the block has an identity shortcut
(``<block>add``). ConvNeXt has no BatchNorm and its residual branches already
start near zero (LayerScale initialised to 1e-6), so both options are no-ops there.
"""
import dataclasses
from typing import Callable

import keras
from keras import layers

from tfgpu.models.registration import register_model

MIN_IMAGE_SIZE = 32  # keras.applications refuses smaller inputs


@dataclasses.dataclass(frozen=True)
class _Backbone:
    constructor: Callable[..., keras.Model]
    kwargs: dict = dataclasses.field(default_factory=dict)
    undo_rescaling: bool = False  # the backbone divides its input by 255 itself
    head_dropout: float = 0.0  # dropout before the Dense head, as the reference top


def _synchronized_bn(model):
    """A copy of ``model`` (fresh weights) whose BatchNormalization layers are synchronized."""

    def clone(layer):
        config = layer.get_config()
        if isinstance(layer, layers.BatchNormalization):
            config["synchronized"] = True
        return layer.__class__.from_config(config)

    return keras.models.clone_model(model, clone_function=clone)


def _zero_init_residual(model):
    by_name = {layer.name.lower(): layer for layer in model.layers}
    for name in by_name:
        if name.endswith("add") and name[: -len("add")] + "project_bn" in by_name:
            bn = by_name[name[: -len("add")] + "project_bn"]
            bn.gamma.assign(keras.ops.zeros_like(bn.gamma))


def _backbone_classifier(name, backbone, input_shape, num_classes, sync_batch_norm=False, zero_init_residual=False):
    if min(input_shape[:2]) < MIN_IMAGE_SIZE:
        raise ValueError(f"{name} needs images of at least {MIN_IMAGE_SIZE}x{MIN_IMAGE_SIZE}, got "
                         f"{input_shape[0]}x{input_shape[1]}; raise --image_size")
    inputs = keras.Input(input_shape)
    x = layers.Rescaling(255.0, name="undo_backbone_rescaling")(inputs) if backbone.undo_rescaling else inputs
    features = backbone.constructor(include_top=False, weights=None, input_tensor=x, input_shape=input_shape,
                                    pooling="avg", **backbone.kwargs).output
    if backbone.head_dropout:
        features = layers.Dropout(backbone.head_dropout, name="head_dropout")(features)
    logits = layers.Dense(num_classes, name="logits")(features)
    model = keras.Model(inputs, logits, name=name)
    if sync_batch_norm and any(isinstance(layer, layers.BatchNormalization) for layer in model.layers):
        model = _synchronized_bn(model)
    if zero_init_residual:
        _zero_init_residual(model)
    return model


_BACKBONES = {
    "efficientnet_b0": _Backbone(keras.applications.EfficientNetB0, undo_rescaling=True, head_dropout=0.2),
    "mobilenet_v2": _Backbone(keras.applications.MobileNetV2),
    "convnext_tiny": _Backbone(keras.applications.ConvNeXtTiny, {"include_preprocessing": False}),
}


def _register(name):
    @register_model(name, default_image_size=224, options=("sync_batch_norm", "zero_init_residual"))
    def build(input_shape, num_classes, sync_batch_norm=False, zero_init_residual=False):
        return _backbone_classifier(name, _BACKBONES[name], input_shape, num_classes, sync_batch_norm,
                                    zero_init_residual)

    build.__doc__ = f"{_BACKBONES[name].constructor.__name__} from keras.applications, random init, our head."
    return build


efficientnet_b0 = _register("efficientnet_b0")
mobilenet_v2 = _register("mobilenet_v2")
convnext_tiny = _register("convnext_tiny")
