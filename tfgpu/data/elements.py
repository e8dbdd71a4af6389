"""What an element of a user's ``tf.data.Dataset`` must be for ``tfgpu.fit``, and how what Keras' loaders give
is taken as it is.

An element is ``(image, label)``: images ``HxWxC`` with C 1 or 3, uint8 or float, in the
converter's pixels 0..255 (``input_range`` sets what the model sees); labels class indices
>= 0 (integer, or whole floats) or one-hot vectors. What ``keras.utils.image_dataset_from_directory``
gives (batches of float32 pixels in [0, 255], int or one-hot labels, ``class_names``) is
taken as it is: ``accept`` unbatches a batched dataset, saying so in one line; ``Intake``
checks float pixels as each example is written (every value in [0, 255], else an error
naming the example; a split whose pixels all lie in [0, 1] is refused as unscaled) and
rounds them to uint8 (resizing interpolates fractions, which the uint8 records cannot
keep); one-hot labels become their class index (anything but exactly one 1 is refused);
``class_names`` become the manifest's classes. Anything else is one ``ConfigError`` naming
the argument, found from ``element_spec`` before any example is read where the spec tells.
Cost: one min/max and one rounding per float image, on the pass that writes it.
"""
import numpy as np
import tensorflow as tf

from tfgpu.config import ConfigError

CHANNELS = (1, 3)
_FIX = {
    "batched": "pass unbatched examples (ds.unbatch(), or drop the .batch() call): tfgpu batches them itself",
    "pair": "map it to (image, label) pairs, e.g. ds.map(lambda d: (d['image'], d['label'])) or TFDS's "
            "as_supervised=True",
    "dtype": "images must be uint8 or float pixels in [0, 255], as the converter stores them (input_range sets "
             "the range the model sees)",
    "range": "tfgpu takes pixels in [0, 255] (input_range sets what the model sees); for floats in [0, 1]: "
             "ds.map(lambda x, y: (x * 255, y)); for Keras' loaders, keep their default interpolation='bilinear'",
}


def accept(dataset, argument: str):
    """(dataset as the writer takes it, the line to log about it or ""): a batched dataset (images of rank 4, or
    labels of rank 2, as Keras' loaders give) is unbatched; then ``check_spec``. Cheap: reads no example."""
    _check_pairs(dataset, argument)
    notes = []
    image, label = dataset.element_spec
    if _batched(image, label):
        notes.append(f"elements are batches (image {_shape(image)}, label {_shape(label)}): unbatched, as tfgpu "
                     "batches examples itself")
        dataset = dataset.unbatch()
        image, label = dataset.element_spec
    check_spec(dataset, argument)
    if image.dtype.is_floating:
        notes.append(f"{image.dtype.name} images: stored as uint8, each checked as it is written to lie in "
                     "[0, 255] and rounded to whole values")
    if label.shape.rank == 1:
        notes.append("one-hot labels: stored as their class index")
    return dataset, f"{argument}: {'; '.join(notes)}" if notes else ""


def class_names(train_data, eval_data=None) -> tuple:
    """The ``class_names`` Keras' loaders attach to their datasets (``()`` when there are none); eval_data's must
    equal train_data's."""
    names = tuple(getattr(train_data, "class_names", None) or ())
    if not all(isinstance(n, str) for n in names) or len(set(names)) != len(names):
        raise ConfigError("train_data", f"its class_names {list(names)} are not distinct strings")
    other = tuple(getattr(eval_data, "class_names", None) or ())
    if names and other and other != names:
        raise ConfigError("eval_data", f"its class_names {list(other)} differ from train_data's {list(names)}")
    return names


def _batched(image, label) -> bool:
    """Whether an element is a batch: images of rank 4, labels of rank 2 (one-hot batches), or (N, H, W)
    grayscale batches whose leading dimension matches their (N,) integer labels."""
    leading_match = (image.shape.rank == 3 and label.shape.rank == 1 and label.dtype.is_integer
                     and image.shape[0] == label.shape[0])
    return image.shape.rank == 4 or label.shape.rank == 2 or leading_match


# -- what an element must be ----------------------------------------------------------------------------------------

def check_spec(dataset, argument: str) -> None:
    """Raises ConfigError(argument) when ``dataset`` is not a finite, non-empty Dataset of unbatched (image, label)
    examples as far as its ``element_spec`` and cardinality tell; cheap (reads no example)."""
    _check_pairs(dataset, argument)
    image, label = dataset.element_spec
    if _batched(image, label):
        raise ConfigError(argument, f"elements look batched (image {_shape(image)}, label {_shape(label)}); "
                          f"{_FIX['batched']}")
    if image.dtype != tf.uint8 and not image.dtype.is_floating:
        raise ConfigError(argument, f"images are {image.dtype.name}; {_FIX['dtype']}")
    if image.shape.rank not in (None, 3):
        raise ConfigError(argument, f"images must be HxWxC, got shape {_shape(image)} (for HxW grayscale: "
                          "ds.map(lambda x, y: (x[..., None], y)))")
    if image.shape.rank == 3 and image.shape[-1] is not None and image.shape[-1] not in CHANNELS:
        raise ConfigError(argument, f"images have {image.shape[-1]} channels; tfgpu stores 1 (grayscale) or 3 "
                          "(RGB)")
    if not (label.dtype.is_integer or label.dtype.is_floating):
        raise ConfigError(argument, f"labels must be class indices or one-hot vectors, got {label.dtype.name}")
    if label.shape.rank not in (None, 0, 1):
        raise ConfigError(argument, f"labels must be scalars (one class index per image) or one-hot vectors, got "
                          f"shape {_shape(label)}")
    cardinality = int(dataset.cardinality())
    if cardinality == tf.data.INFINITE_CARDINALITY:
        raise ConfigError(argument, "is infinite (a .repeat()?); pass one pass over the examples: tfgpu repeats "
                          "them for epochs/train_steps")
    if cardinality == 0:
        raise ConfigError(argument, "has no examples")


def _check_pairs(dataset, argument: str) -> None:
    """Raises ConfigError(argument) unless ``dataset`` is a Dataset of (image, label) pairs of tensors."""
    if not isinstance(dataset, tf.data.Dataset):
        raise ConfigError(argument, f"expected a tf.data.Dataset, got {type(dataset).__name__}")
    spec = dataset.element_spec
    if isinstance(spec, dict):
        raise ConfigError(argument, f"elements are dicts ({', '.join(map(str, spec))}), not (image, label) "
                          f"pairs; {_FIX['pair']}")
    if not isinstance(spec, tuple) or len(spec) != 2 or not all(isinstance(s, tf.TensorSpec) for s in spec):
        raise ConfigError(argument, f"elements must be (image, label) pairs of tensors, got {_describe(spec)}; "
                          f"{_FIX['pair']}")


def _shape(spec) -> str:
    return str(tuple(spec.shape.as_list())) if spec.shape.rank is not None else "(unknown rank)"


def _describe(spec) -> str:
    if isinstance(spec, tf.TensorSpec):
        return f"a single tensor {_shape(spec)} {spec.dtype.name} (no label)"
    if isinstance(spec, tuple):
        return f"tuples of {len(spec)}"
    return type(spec).__name__


def describe_spec(dataset) -> str:
    """The element spec as the fingerprint records it."""
    image, label = dataset.element_spec
    return f"image {image.shape} {image.dtype.name}, label {label.shape} {label.dtype.name}"


class Intake:
    """Takes one split's examples as the writer stores them (uint8 HxWxC pixels, a class index), checking what
    ``element_spec`` left open; ``finish`` after the last one checks the split as a whole."""

    def __init__(self, argument: str):
        self.argument = argument
        self.one_hot_width = 0  # the classes one-hot labels count (0: none seen)
        self.float_max = None  # the largest float pixel (None: no float images)

    def example(self, image: np.ndarray, label, where: str):
        """(uint8 image, class index) of one example; ``where`` names it in errors."""
        if image.ndim != 3 or image.shape[-1] not in CHANNELS:
            raise ConfigError(self.argument, f"{where}: image shape {image.shape}; expected HxWxC with C 1 or 3")
        return self._pixels(image, where), self._class_index(label, where)

    def finish(self) -> None:
        """Refuses a split whose float pixels all lie in [0, 1]: unscaled, not [0, 255]."""
        if self.float_max is not None and self.float_max <= 1.0:
            raise ConfigError(self.argument, f"its float pixels all lie in [0, 1] (largest {self.float_max:.4g}); "
                              f"{_FIX['range']}")

    def _pixels(self, image: np.ndarray, where: str) -> np.ndarray:
        """uint8 pixels; float ones checked to lie in [0, 255] and rounded."""
        if image.dtype == np.uint8:
            return image
        low, high = float(np.min(image)), float(np.max(image))
        if not -0.5 < low <= high < 255.5:  # what rounds into 0..255 (float sums of 255s may come to 255.00002)
            raise ConfigError(self.argument, f"{where}: pixel values span [{low:.4g}, {high:.4g}], not within "
                              f"[0, 255]; {_FIX['range']}")
        self.float_max = max(self.float_max or 0.0, high)
        return np.rint(image).astype(np.uint8)

    def _class_index(self, label, where: str) -> int:
        """The class index of an integer or whole-float label, a one-value vector, or a one-hot vector."""
        value = np.asarray(label)
        if value.ndim > 1:
            raise ConfigError(self.argument, f"{where}: label shape {value.shape}; expected a scalar or one-hot "
                              "vector")
        if value.ndim == 1 and value.size > 1:
            if not (np.isin(value, (0, 1)).all() and value.sum() == 1):
                raise ConfigError(self.argument, f"{where}: label {np.array2string(value, threshold=12)} is not "
                                  "one-hot (exactly one 1, else 0); pass class indices (label_mode='int')")
            self.one_hot_width = max(self.one_hot_width, value.size)
            return int(np.argmax(value))
        if value.size != 1 or not np.isfinite(value).all() or value.reshape(-1)[0] != np.floor(value.reshape(-1)[0]):
            raise ConfigError(self.argument, f"{where}: label {value.tolist()} is not a class index")
        return int(value.reshape(-1)[0])
