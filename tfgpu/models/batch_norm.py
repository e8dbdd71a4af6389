"""How much of a model's BatchNorm moving statistics is still their initial value (mean 0, variance 1) after a
run's updates: evaluation uses the moving statistics and training the batch's, so after a short run evaluation
can trail training far (small_cnn, 113 steps at Keras' momentum 0.99: val_accuracy 0.36, train 0.91)."""
import math

import keras

STALE_SHARE = 0.05  # above this share of initial values left, the final evaluation says so


def updated_batch_norms(model) -> list:
    """The model's BatchNormalization layers that training updates (nested models included; frozen ones
    run in inference mode and keep their statistics)."""
    return [layer for layer in model._flatten_layers(include_self=False, recursive=True)
            if isinstance(layer, keras.layers.BatchNormalization) and layer.trainable]


def initial_share(model, updates: int) -> tuple:
    """(the largest momentum, the share ``momentum ** updates`` of the initial statistics left) of the model's
    updated BatchNorm layers; (None, 0.0) without any."""
    momenta = [float(layer.momentum) for layer in updated_batch_norms(model)]
    if not momenta:
        return None, 0.0
    momentum = max(momenta)
    return momentum, momentum ** max(updates, 0)


def stale_statistics_note(model, updates: int) -> str:
    """One line when more than ``STALE_SHARE`` of the moving statistics are still initial values after
    ``updates`` training steps, else ""."""
    momentum, share = initial_share(model, updates)
    if momentum is None or share <= STALE_SHARE or momentum >= 1:
        return ""
    enough = math.ceil(math.log(STALE_SHARE) / math.log(momentum))
    return (f"BatchNormalization: after {updates} updates at momentum {momentum:g}, {share:.0%} of the moving "
            "statistics evaluation uses are still their initial values (mean 0, variance 1), so the val_ metrics "
            f"may trail training; train at least {enough} steps, or give the model's BatchNormalization layers a "
            "lower momentum (e.g. 0.9)")
