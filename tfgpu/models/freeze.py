"""--freeze=REGEX: which layers of a model do not train, and putting them back.

The regex is searched (``re.search``) in the name of every layer of the model, nested ones included: the
layers of a backbone submodel by their own names, and the submodel itself by its name (freezing a
submodel freezes every layer in it). A frozen layer gets ``trainable = False``, which in Keras 3 takes its
weights out of ``model.trainable_variables`` (so the task neither differentiates nor updates them: no
gradient, no momentum, no weight decay) and runs a BatchNormalization layer in inference mode (its
moving statistics are used and left unchanged). Unfreezing restores every layer's own ``trainable`` as
the model's builder left it, so a layer the builder itself froze stays frozen.
"""
import re

from tfgpu.config import ConfigError

_SHOWN = 8  # layer names given as a hint


def _weight_count(layers) -> int:
    return sum(len(layer.trainable_weights) for layer in layers)


class Freezer:
    """The layers of ``model`` whose names match ``pattern``; ConfigError naming --freeze when none does."""

    def __init__(self, model, pattern: str):
        layers = list(model._flatten_layers(include_self=False, recursive=True))  # parents before children
        self._builder_state = [(layer, layer.trainable) for layer in layers]
        self.layers = [layer for layer in layers if re.search(pattern, layer.name)]
        names = [layer.name for layer in layers]
        hint = ", ".join(names[:_SHOWN]) + (f", ... ({len(names)} layers)" if len(names) > _SHOWN else "")
        if not self.layers:
            raise ConfigError("freeze", f"{pattern!r} matches no layer name of the model (its layers: {hint})")
        if not _weight_count(self.layers):
            raise ConfigError("freeze", f"{pattern!r} matches only layers without trainable weights "
                              f"({', '.join(layer.name for layer in self.layers[:_SHOWN])}); its layers: {hint}")
        self.frozen = False

    def freeze(self) -> None:
        for layer in self.layers:
            layer.trainable = False
        self.frozen = True

    def unfreeze(self) -> None:
        """Every layer trainable again as the builder made it (Keras' setter recurses, so parents go first)."""
        for layer, trainable in self._builder_state:
            layer.trainable = trainable
        self.frozen = False
