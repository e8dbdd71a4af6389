"""``tfgpu.fit``'s ``x``, ``y``, ``validation_split`` and ``validation_data`` as Keras takes them, made into the
splits ``data.from_dataset`` writes (or a converted directory), with Keras' refusals in Keras' words.

- numpy arrays: images (N, H, W[, C]), C 1 or 3, with labels ``y`` (class indices, or one-hot rows).
  ``validation_split`` takes the last fraction before any shuffling (``fit_arguments.split_at``). uint8 pixels and
  floats in [0, 255] are stored as they are; float arrays in [0, 1] are stored as 0..255 and reach the model in
  [0, 1] again (``input_range``), so the model sees what Keras would feed it (to 1/255). Integer arrays within
  0..255 are stored as uint8.
- a ``tf.data.Dataset`` of (image, label) or (image, label, sample_weight), batched or not (``data.elements``); a
  batched one's batch (its first batch's size) is the batch size unless ``batch_size`` is given. ``y``,
  ``validation_split`` and ``sample_weight`` are refused as Keras refuses them for a Dataset.
- ``sample_weight`` (arrays), a Dataset's or PyDataset's third element, ``validation_data=(x, y, w)``: per-example
  weights kept beside the records (``fit_weights``), cut by ``validation_split`` as the arrays are.
- a ``keras.utils.PyDataset`` without workers: read once into arrays (its batch is the batch size).
- a converted data directory (``dataset.json``): its eval split validates.
"""
import dataclasses
import os

from tfgpu.config import ConfigError
from tfgpu.training import fit_arguments

PIXELS = (0.0, 255.0)  # input_range: the model sees the stored pixels as they are


@dataclasses.dataclass
class Data:
    """What a call's data became: ``datasets`` ({"train": Dataset, "val": Dataset}) to write, or ``directory``;
    ``notes`` to log; ``class_names``; the batch the data carries (0: none); whether labels were one-hot; the
    ``input_range`` that feeds the model what the caller's data holds."""
    datasets: dict = dataclasses.field(default_factory=dict)
    directory: str = ""
    notes: list = dataclasses.field(default_factory=list)
    class_names: tuple = ()
    batch_size: int = 0
    one_hot: bool = False
    input_range: tuple = PIXELS
    sample_weights: dict = dataclasses.field(default_factory=dict)  # split -> float32 weights by record index
    in_order: bool = False  # arrays (whose order shuffle=False keeps), not a Dataset (Keras ignores shuffle for one)


def resolve(args: dict, names: dict) -> Data:
    """The ``Data`` of ``tfgpu.fit``'s data arguments (``names``: the argument names the caller used, for errors);
    ConfigError naming the argument for anything Keras would refuse or tfgpu cannot train on. Reads no example but
    a batched Dataset's first batch."""
    x, y = args["x"], args["y"]
    if x is None:
        raise ConfigError(names["x"], "no training data: pass arrays x, y, a tf.data.Dataset or a converted directory")
    if isinstance(x, (str, os.PathLike)):
        return _directory(x, args, names)
    import tensorflow as tf

    if isinstance(x, tf.data.Dataset):
        return _dataset(x, args, names)
    import keras

    if isinstance(x, keras.utils.PyDataset):
        if args["sample_weight"] is not None:
            raise ConfigError("sample_weight", "`sample_weight` argument is not supported when using a PyDataset: "
                              "give its batches as (x, y, sample_weight)")
        x, y, weights, batch = _py_dataset(x, y, names)
        data = _arrays(x, y, dict(args, x=x, y=y, sample_weight=weights), names)
        data.batch_size = data.batch_size or batch
        return data
    if hasattr(x, "shape") and hasattr(x, "dtype"):
        return _arrays(x, y, args, names)
    raise ConfigError(names["x"], f"expected numpy arrays (with y), a tf.data.Dataset of (image, label), a "
                      f"keras.utils.PyDataset or a converted data directory, got {type(x).__name__}"
                      + (" (pass x and y as two arguments)" if isinstance(x, (tuple, list)) else ""))


def _directory(x, args: dict, names: dict) -> Data:
    from tfgpu.runtime import fileio

    directory = os.fspath(x)
    validation = args["validation_data"]
    if validation is not None and (not isinstance(validation, (str, os.PathLike)) or
                                   fileio.absolute(os.fspath(validation)) != fileio.absolute(directory)):
        raise ConfigError(names["validation_data"], "with a directory as x, evaluation uses that directory's eval "
                          "split (eval_split=...); leave validation_data out, or pass both as tf.data.Datasets")
    if args["validation_split"]:
        raise ConfigError("validation_split", "is only supported for Tensors or NumPy arrays; a converted "
                          "directory validates on its eval split")
    if args["y"] is not None:
        raise ConfigError("y", "a converted directory holds its labels: leave y out")
    if args["sample_weight"] is not None:
        raise ConfigError("sample_weight", "a converted directory's examples carry no weights: pass arrays (or a "
                          "tf.data.Dataset of (image, label, sample_weight)) to weigh them")
    fileio.check_scheme(directory, names["x"])
    try:
        converted = any(c in directory for c in "*?[") or fileio.isfile(os.path.join(directory, "dataset.json"))
    except OSError as e:
        raise ConfigError(names["x"], f"cannot read {directory!r}: {e.strerror or e}") from None
    if not converted:
        raise ConfigError(names["x"], f"{directory!r} is not a converted dataset (no dataset.json in it): pass "
                          "arrays or a tf.data.Dataset, or convert the data with python -m tfgpu.convert")
    return Data(directory=directory)


def _dataset(x, args: dict, names: dict) -> Data:
    import tensorflow as tf

    from tfgpu.data import elements

    if args["y"] is not None:
        raise ConfigError("y", "`y` argument is not supported when using dataset as input: its elements are "
                          "(image, label)")
    if args["validation_split"]:
        raise ConfigError("validation_split", "is only supported for Tensors or NumPy arrays, found a "
                          "tf.data.Dataset; pass validation_data")
    if args["sample_weight"] is not None:
        raise ConfigError("sample_weight", "`sample_weight` argument is not supported when using dataset as input: "
                          "give its elements as (image, label, sample_weight)")
    from tfgpu.training import fit_weights

    class_names = elements.class_names(x, args["validation_data"] if isinstance(args["validation_data"],
                                                                                 tf.data.Dataset) else None)
    x, weights = fit_weights.split_off(x, names["x"])
    batch = _batch_of(x)
    one_hot = _one_hot_spec(x)
    train, note = elements.accept(x, names["x"])
    data = Data(datasets={"train": train}, notes=[note] if note else [], class_names=class_names, batch_size=batch,
                one_hot=one_hot)
    if weights is not None:
        data.sample_weights["train"] = fit_weights.check(weights, len(weights), names["x"])
    _validation(data, args, names, train)
    return data


def _batch_of(dataset) -> int:
    """A batched Dataset's batch size (its first batch's leading dimension), 0 for an unbatched one."""
    from tfgpu.data import elements

    spec = dataset.element_spec
    if not (isinstance(spec, tuple) and len(spec) == 2) or not elements._batched(*spec):
        return 0
    if spec[0].shape.rank and spec[0].shape[0] is not None:
        return int(spec[0].shape[0])
    first = next(iter(dataset.take(1)))
    return int(first[0].shape[0])


def _one_hot_spec(dataset) -> bool:
    spec = dataset.element_spec
    if not (isinstance(spec, tuple) and len(spec) == 2):
        return False
    label = spec[1]
    from tfgpu.data import elements

    batched = elements._batched(*spec)
    return label.shape.rank == (2 if batched else 1) and (label.shape[-1] or 0) > 1


def _validation(data: Data, args: dict, names: dict, train) -> None:
    """Adds ``validation_data`` (a Dataset, or (x_val, y_val) arrays) as split "val"."""
    import tensorflow as tf

    from tfgpu.data import elements

    validation, argument = args["validation_data"], names["validation_data"]
    if validation is None:
        return
    from tfgpu.training import fit_weights

    weights = None
    if isinstance(validation, (tuple, list)):
        if len(validation) not in (2, 3):
            raise ConfigError(argument, f"must be (x_val, y_val) or a tf.data.Dataset, got a {len(validation)}-tuple")
        images, scale_note = _images(validation[0], argument, data.input_range)
        labels = _labels(validation[1], len(images), argument)
        if len(validation) == 3 and validation[2] is not None:
            weights = fit_weights.check(validation[2], len(images), argument)
        validation = tf.data.Dataset.from_tensor_slices((images, labels))
        data.notes.extend([scale_note] if scale_note else [])
    elif not isinstance(validation, tf.data.Dataset):
        raise ConfigError(argument, f"must be (x_val, y_val) arrays or a tf.data.Dataset, got "
                          f"{type(validation).__name__}")
    else:
        validation, weights = fit_weights.split_off(validation, argument)
    validation, note = elements.accept(validation, argument)
    if note:
        data.notes.append(note)
    channels = validation.element_spec[0].shape[-1], train.element_spec[0].shape[-1]
    if None not in channels and channels[0] != channels[1]:
        raise ConfigError(argument, f"images have {channels[0]} channels, x's {channels[1]}")
    data.datasets["val"] = validation
    if weights is not None:
        data.sample_weights["val"] = fit_weights.check(weights, len(weights), argument)


def _py_dataset(dataset, y, names: dict):
    """(x, y, batch size) read from a PyDataset without workers; ConfigError for one with workers."""
    import numpy as np

    workers = getattr(dataset, "workers", 1) or 1
    if workers > 1 or getattr(dataset, "use_multiprocessing", False):
        raise ConfigError(names["x"], f"a PyDataset with workers={workers}"
                          f"{', use_multiprocessing=True' if dataset.use_multiprocessing else ''}: tfgpu reads the "
                          "data once and shards it over its own input pipelines; pass it with workers=1, or arrays")
    if y is not None:
        raise ConfigError("y", "`y` argument is not supported when using a PyDataset: its batches are (x, y)")
    images, labels, weights, batch = [], [], [], 0
    for i in range(len(dataset)):
        item = dataset[i]
        if not isinstance(item, tuple) or len(item) < 2:
            raise ConfigError(names["x"], f"batch {i} is not (x, y)")
        if len(item) == 3 and item[2] is not None:
            weights.append(np.reshape(np.asarray(item[2]), [-1]))
        images.append(np.asarray(item[0]))
        labels.append(np.asarray(item[1]))
        batch = batch or len(item[0])
    if weights and len(weights) != len(images):
        raise ConfigError(names["x"], "some batches are (x, y, sample_weight) and others (x, y)")
    return np.concatenate(images), np.concatenate(labels), (np.concatenate(weights) if weights else None), batch


def _arrays(x, y, args: dict, names: dict) -> Data:
    import numpy as np
    import tensorflow as tf

    argument = names["x"]
    if y is None:
        raise ConfigError("y", "with arrays as x, pass their labels as y")
    if args["shuffle"] not in (True, False):
        raise ConfigError("shuffle", f"{args['shuffle']!r}: True (shuffled every epoch, reproducibly from seed) or "
                          "False (in order)")
    x = np.asarray(x)
    labels = _labels(y, len(x), "y")
    from tfgpu.training import fit_weights

    weights = args["sample_weight"]
    if weights is not None:
        weights = fit_weights.check(weights, len(x), "sample_weight")
    notes = []
    if args["validation_split"] and args["validation_data"] is None:  # Keras: validation_data wins over the split
        at = fit_arguments.split_at(len(x), float(args["validation_split"]))
        args = dict(args, validation_data=(x[at:], labels[at:], None if weights is None else weights[at:]))
        notes.append(f"validation_split={args['validation_split']}: the last {len(x) - at} of {len(x)} examples "
                     "validate (cut before shuffling, as Keras does)")
        x, labels = x[:at], labels[:at]
        weights = None if weights is None else weights[:at]
    images, note = _images(x, argument, None)
    data = Data(notes=[note] if note else [], one_hot=labels.ndim == 2 and labels.shape[-1] > 1,
                input_range=(0.0, 1.0) if note else PIXELS, in_order=True)
    data.notes.extend(notes)
    if weights is not None:
        data.sample_weights["train"] = weights
    train = tf.data.Dataset.from_tensor_slices((images, labels))
    from tfgpu.data import elements

    train, accepted = elements.accept(train, argument)
    if accepted:
        data.notes.append(accepted)
    data.datasets["train"] = train
    _validation(data, args, dict(names, validation_data=names["validation_data"]), train)
    return data


def _images(x, argument: str, input_range):
    """(uint8 or [0, 255] float images NHWC, the line to log when [0, 1] floats were scaled to 0..255, or "")."""
    import numpy as np

    images = np.asarray(x)
    if images.ndim == 3:
        images = images[..., None]
    if images.ndim != 4 or images.shape[-1] not in (1, 3):
        raise ConfigError(argument, f"arrays of shape {images.shape}: tfgpu.fit trains image classifiers on images "
                          "(N, H, W) or (N, H, W, C) with C 1 or 3")
    if images.dtype == np.uint8:
        return images, ""
    if np.issubdtype(images.dtype, np.integer):
        if images.size and (images.min() < 0 or images.max() > 255):
            raise ConfigError(argument, f"integer pixels span [{images.min()}, {images.max()}]; images must be "
                              "uint8 0..255 or floats in [0, 255] or [0, 1]")
        return images.astype(np.uint8), ""
    if not np.issubdtype(images.dtype, np.floating):
        raise ConfigError(argument, f"images are {images.dtype}; uint8 or float pixels")
    low, high = (float(images.min()), float(images.max())) if images.size else (0.0, 0.0)
    unit = input_range == (0.0, 1.0) if input_range is not None else (low >= 0.0 and high <= 1.0)
    if unit:
        if low < 0.0 or high > 1.0:
            raise ConfigError(argument, f"pixel values span [{low:.4g}, {high:.4g}], but x's lie in [0, 1]")
        return np.rint(images * 255.0).astype(np.uint8), (f"{argument}: float pixels in [0, 1]: stored as 0..255 (to "
                                                     "1/255) and fed to the model in [0, 1] (input_range=(0, 1))")
    return images, ""


def _labels(y, count: int, argument: str):
    import numpy as np

    labels = np.asarray(y)
    if labels.ndim == 2 and labels.shape[-1] == 1:
        labels = labels[:, 0]
    if labels.ndim not in (1, 2) or len(labels) != count:
        raise ConfigError(argument, f"labels of shape {labels.shape} for {count} images: one class index (or one-hot "
                          "row) per image")
    return labels
