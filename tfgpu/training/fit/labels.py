"""Sparse class labels outside the model's outputs, refused before the first step instead of failing inside it.

Under ``model.fit`` a 10-class model given a label 10 (or -1) fails in its first step with a 50-line
``InvalidArgumentError`` from inside the graph. Arrays are in memory, so ``tfgpu.fit`` reads them first: for every
output trained with a sparse categorical cross-entropy (the string, ``keras.losses.SparseCategoricalCrossentropy``
or the function) whose last dimension is known, a label outside ``[0, classes)`` (its ``ignore_class`` aside) is one
``FitError`` naming ``y`` (``y['output']`` for one of several outputs), the value, its example and the classes
(``check_arrays``). A Dataset is read only by its steps: there Keras' own error stands, with one line added that
names the label and the classes (``explained``).
"""
import contextlib
import re

from tfgpu.training.fit.arguments import FitError

SPARSE_LOSS = "sparse_categorical_crossentropy"
KERAS_OUT_OF_RANGE = re.compile(r"Received a label value of (-?\d+) which is outside the valid range of \[0, (\d+)\)")
# The same error from the deterministic kernel (tf.config.experimental.enable_op_determinism: a GatherV2 of the
# logits), recognised only in the sparse cross-entropy's own node.
DETERMINISTIC_OUT_OF_RANGE = re.compile(r"indices\[\d+\] = (-?\d+) is not in \[0, (\d+)\)")


def _is_sparse(loss) -> bool:
    import keras

    if isinstance(loss, str):
        return loss == SPARSE_LOSS
    return isinstance(loss, keras.losses.SparseCategoricalCrossentropy) or \
        loss is keras.losses.sparse_categorical_crossentropy


def sparse_outputs(model) -> list:
    """``(position, output name, classes, ignore_class)`` of each output whose loss is a sparse categorical
    cross-entropy and whose last dimension is known; [] for a model whose outputs are not known before a step."""
    try:
        outputs = model.outputs  # a Functional's or a built Sequential's; a subclassed model has none
    except (AttributeError, ValueError):
        outputs = None
    loss = getattr(model, "loss", None)
    if not outputs or loss is None:
        return []
    names = list(getattr(model, "output_names", None) or [_name_of(output) for output in outputs])
    found = []
    for position, (name, output) in enumerate(zip(names, outputs)):
        if isinstance(loss, dict):
            own = loss.get(name)
        elif isinstance(loss, (list, tuple)):
            own = loss[position] if position < len(loss) else None
        else:
            own = loss
        classes = output.shape[-1] if output.shape else None
        if own is not None and _is_sparse(own) and classes is not None:
            found.append((position, name, int(classes), getattr(own, "ignore_class", None)))
    return found


def _name_of(output) -> str:
    history = getattr(output, "_keras_history", None)
    return history[0].name if history else output.name


def _labels_of(y, position: int, name: str, num_outputs: int):
    """The labels of output ``position`` in Keras' packed ``y`` and how to name them (None when ``y`` has none)."""
    if isinstance(y, dict):
        return y.get(name), f"y[{name!r}]"
    if isinstance(y, (list, tuple)):
        if num_outputs == 1 and len(y) == 1:
            return y[0], "y"
        return (y[position], f"y[{position}]") if position < len(y) else (None, "")
    return (y, "y") if num_outputs == 1 else (None, "")


def first_out_of_range(labels, classes: int, ignore_class=None):
    """(example index, value) of the first label outside ``[0, classes)`` (``ignore_class`` allowed), or None."""
    import numpy as np

    values = np.asarray(labels)
    if values.ndim > 1:  # (N, 1) labels as Keras takes them; any other shape is Keras' to judge
        if values.shape[1:] != (1,) * (values.ndim - 1):
            return None
        values = values.reshape(len(values))
    values = values.astype(np.int64) if values.dtype.kind == "f" else values  # Keras' cast of float labels
    bad = (values < 0) | (values >= classes)
    if ignore_class is not None:
        bad &= values != ignore_class
    where = np.flatnonzero(bad)
    return (int(where[0]), int(values[where[0]])) if len(where) else None


def check_arrays(model, data, argument: str = "y") -> None:
    """FitError for the first sparse label of arrays ``data`` (an ``arrays.ArrayInput``) outside its output's
    classes; ``argument``: how the call named the arrays (``y``, ``validation_data``)."""
    if getattr(data, "kind", None) != "arrays":
        return
    outputs = sparse_outputs(model)
    packed = data.tensors[1] if isinstance(data.tensors, tuple) and len(data.tensors) > 1 else None
    if packed is None or not outputs:
        return
    for position, name, classes, ignore in outputs:
        labels, label_name = _labels_of(packed, position, name, len(model.outputs))
        if labels is None:
            continue
        found = first_out_of_range(labels.numpy() if hasattr(labels, "numpy") else labels, classes, ignore)
        if found is not None:
            index, value = found
            where = label_name if argument == "y" else f"{argument} ({label_name})"
            raise FitError(where, f"label {value} (example {index}) is outside the {classes} classes of output "
                           f"{name!r}: {SPARSE_LOSS} takes labels 0 to {classes - 1}")


def out_of_range(message: str):
    """The (label, classes) match in the error a sparse cross-entropy gives for a label outside the classes, from
    either kernel; None for any other error."""
    match = KERAS_OUT_OF_RANGE.search(message)
    if match is None and "sparse_categorical_crossentropy" in message:
        match = DETERMINISTIC_OUT_OF_RANGE.search(message)
    return match


@contextlib.contextmanager
def explained(model):
    """Keras' error for a Dataset's label outside the classes, with a line naming the label and the classes."""
    import tensorflow as tf

    try:
        yield
    except tf.errors.InvalidArgumentError as e:
        match = out_of_range(e.message or "")
        if match:
            value, classes = int(match.group(1)), int(match.group(2))
            names = [name for _, name, n, _ in sparse_outputs(model) if n == classes]
            output = f"output {names[0]!r}" if len(names) == 1 else "the model's output"
            e.add_note(f"tfgpu.fit: y: a label of the data is {value}, outside the {classes} classes of {output}: "
                       f"{SPARSE_LOSS} takes labels 0 to {classes - 1}")
        raise
