"""The states of a Keras model's random seed generators, which a checkpoint of the model leaves out.

Keras 3 keeps each ``SeedGenerator``'s state (Dropout's, random augmentation layers', a ``train_step``'s own) in
``model.variables`` but not in ``model.weights``, and a ``SeedGenerator`` is no TensorFlow trackable, so a
``tf.train.Checkpoint`` of the model does not hold them. A checkpoint that must resume exactly saves them beside the
model, as ``"random_states"``, whenever the model has any (so a checkpoint of a model without any is unchanged).
"""

ITEM = "random_states"


def of(model) -> list:
    """The seed generator states of ``model`` (every variable that is not one of its weights), in Keras' order."""
    weights = {id(w) for w in model.weights}
    return [v for v in model.variables if id(v) not in weights]


def items(model) -> dict:
    """``{"random_states": [...]}`` for a model with seed generators, else ``{}``: checkpoint items to add."""
    states = of(model)
    return {ITEM: states} if states else {}
