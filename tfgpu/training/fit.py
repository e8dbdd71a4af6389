"""``tfgpu.fit``: the training run of ``python -m tfgpu.train``, called from Python with a model function and data.

    import tfgpu
    metrics = tfgpu.fit(build_model, train_ds, model_dir="runs/a", eval_data=val_ds,
                        global_batch_size=256, precision="mixed_bfloat16")

- ``model_fn()`` returns a ``keras.Model``. It is registered in the model registry under
  ``fit:<module>.<qualname>`` and called by the classification task like any registered
  builder: inside the strategy scope, under the run's dtype policy; tfgpu casts its
  logits to float32. Its input must take the data's images, its output one logit per class.
- ``train_data`` / ``eval_data``: a converted data directory (``dataset.json``; its eval
  split is found as for ``--data_dir``), or a ``tf.data.Dataset`` of ``(image, label)``
  examples (``HxWxC`` images, C 1 or 3, uint8 or float pixels in [0, 255]; integer or
  one-hot labels), batched or not: ``keras.utils.image_dataset_from_directory``'s output
  trains as it is, its ``class_names`` become the run's classes (``tfgpu.data.elements``;
  one log line says what is unbatched and rounded to uint8). A Dataset is
  written once into ``<model_dir>/data`` (``tfgpu.data.from_dataset``: the converter's
  shard writer and manifest), splits ``train`` and ``val``; the classes are 0..largest
  label (or ``num_classes``). A later call with the same ``model_dir`` (to resume or train
  longer) checks the data it is given against that directory's fingerprint and reuses it;
  different data is refused. Then the normal input pipeline reads it: every record once
  per epoch, sharded over workers, exact resume.
- ``options``: any ``Config`` field by name, coerced and validated as flags are; a bad or
  unknown one raises ``tfgpu.ConfigError`` naming it (``.flag``). ``recipe="quickstart"`` starts from an
  installed recipe's options (``--list_recipes``); its model and data are ``model_fn`` and ``train_data``, and
  options given by name win over it. Those that fit sets
  itself (``model``, ``data_dir``, ``dataset``, and with a Dataset ``train_split``,
  ``eval_split``) are refused.
- Returns what the chief writes to ``metrics.json`` (every worker gets the same dict).

Multi-worker: every worker runs the same script (TF_CONFIG or Slurm, e.g.
``python -m tfgpu.launch --num_workers=2 -- python script.py``). The chief writes
``<model_dir>/data``; every other worker hashes its own Dataset (one pass, no writing),
waits for the chief's ``dataset.json`` and refuses to train if its data differs, so all
workers read the chief's records. ``model_dir`` must be storage every worker sees, as
checkpoints already require; it (and a converted ``train_data`` directory) may be on any
file system TensorFlow opens (``gs://``; ``ram://`` in one process), as ``--model_dir`` may
(``tfgpu.runtime.fileio``).

TensorFlow applies device settings (logical CPU devices, GPU memory growth) and
MultiWorkerMirrored's collectives only to a runtime that has not started, but building a
Dataset starts it. So once the data is on disk, ``fit`` starts TensorFlow's runtime afresh
when the run needs it (a multi-worker job, or device settings the running one refuses);
tensors and datasets made before such a call may not be usable after it (build them again).
"""
import logging
import os

from tfgpu import config_sources
from tfgpu.config import ConfigError

log = logging.getLogger("tfgpu")

DATA_SUBDIR = "data"
TRAIN_SPLIT, EVAL_SPLIT = "train", "val"
SET_BY_FIT = {
    "model": "the model is model_fn",
    "data_dir": "pass the directory as train_data",
    "dataset": "pass a converted directory or a tf.data.Dataset as train_data",
}
SET_FOR_DATASETS = {
    "train_split": "a Dataset is written as split 'train'",
    "eval_split": "a Dataset given as eval_data is written as split 'val'; leave eval_data out for no evaluation",
}
ONLY_REGISTERED = {
    "sync_batch_norm": "applies to tfgpu's registered models; build yours with "
                       "keras.layers.BatchNormalization(synchronized=True)",
    "zero_init_residual": "applies to tfgpu's registered ResNets; initialise your model's layers yourself",
}
_MODEL_FNS = {}  # registered name -> the latest model_fn given under it
_ARGUMENT_FOR_FLAG = {"data_dir": "train_data", "model": "model_fn"}  # fit's argument behind what a flag names


class FitError(ConfigError):
    """A bad argument or option of ``tfgpu.fit``: ``flag`` names it; the message reads ``tfgpu.fit: NAME: why``."""

    def __init__(self, flag: str, message: str):
        ValueError.__init__(self, f"tfgpu.fit: {flag}: {message}")
        self.flag, self.reason = flag, message


def fit(model_fn, train_data, *, model_dir, eval_data=None, **options) -> dict:
    """Trains (or resumes) ``model_fn()``'s model on ``train_data`` into ``model_dir``; returns metrics.json's dict.

    See the module docstring for what each argument may be. Raises ``tfgpu.ConfigError`` (``FitError``) for a bad
    argument or option, before any training; training failures raise those of ``tfgpu.training.failures``: a
    SIGTERM raises ``tfgpu.Preempted`` once the checkpoint is saved (calling fit again resumes from it), and the
    caller decides whether the process ends (``failures.exit_code`` gives the code python -m tfgpu.train uses)."""
    try:
        return _fit(model_fn, train_data, model_dir, eval_data, options)
    except FitError:
        raise
    except ConfigError as e:
        raise FitError(_ARGUMENT_FOR_FLAG.get(e.flag, e.flag), e.reason) from None


def _recipe_options(recipe: str) -> dict:
    """An installed recipe's options (``--recipe``), less those fit takes from its own arguments: the recipe's
    model and data become ``model_fn`` and ``train_data``; options given by name win over it."""
    if not recipe:
        return {}
    from tfgpu import cli

    parser = cli.ArgumentParser(prog="tfgpu.fit")
    parser.add_config_flags()
    try:
        values = parser.parse_args([f"--recipe={recipe}"]).config_flags
    except ConfigError as e:
        raise FitError("recipe", e.reason) from None
    replaced = sorted(set(values) & {*SET_BY_FIT, *SET_FOR_DATASETS, *ONLY_REGISTERED, "model_dir"})
    log.info("recipe %s: its options, but %s from tfgpu.fit's own arguments", recipe, ", ".join(replaced))
    return {name: value for name, value in values.items() if name not in replaced}


def _fit(model_fn, train_data, model_dir, eval_data, options: dict) -> dict:
    if not callable(model_fn):
        raise FitError("model_fn", f"must be a function that returns a keras.Model, got {type(model_fn).__name__}")
    if not isinstance(model_dir, (str, os.PathLike)) or not os.fspath(model_dir):
        raise FitError("model_dir", f"must be a directory path, got {model_dir!r}")
    model_dir = os.fspath(model_dir)
    options = {**_recipe_options(options.pop("recipe", "")), **options}
    explicit = {name: config_sources.coerce(name, value) for name, value in options.items()}
    for name, why in {**SET_BY_FIT, **ONLY_REGISTERED}.items():
        if name in options and (name in SET_BY_FIT or explicit[name]):
            raise FitError(name, f"is set by tfgpu.fit: {why}" if name in SET_BY_FIT else why)
    if explicit.get("task", "classification") != "classification":
        raise FitError("task", "tfgpu.fit trains classifiers (task='classification')")
    if explicit.get("max_restarts"):
        raise FitError("max_restarts", "restarts re-execute python -m tfgpu.train; run your script again instead "
                       "(tfgpu.fit resumes from the last checkpoint in model_dir)")
    datasets, notes = _datasets(train_data, eval_data)
    if datasets:
        for name in SET_FOR_DATASETS:
            if name in options:
                raise FitError(name, SET_FOR_DATASETS[name])
        data_dir = os.path.join(model_dir, DATA_SUBDIR)
        explicit.update(train_split=TRAIN_SPLIT, eval_split=EVAL_SPLIT if EVAL_SPLIT in datasets else "none")
    else:
        data_dir = os.fspath(train_data)
    explicit.update(model_dir=model_dir, data_dir=data_dir, model=register(model_fn))
    config = config_sources.resolve(explicit)

    from tfgpu.runtime import cluster, logs

    if not logging.getLogger("tfgpu").handlers:
        logs.setup()
    for note in notes:
        log.info("%s", note)
    desc = cluster.resolve_for_run(config.cluster, config.distribution_strategy)
    from tfgpu.training import experiment

    if datasets:
        experiment.check_model_dir(model_dir)
        from tfgpu.data import elements, from_dataset

        arguments = {TRAIN_SPLIT: "train_data", EVAL_SPLIT: "eval_data"}
        from_dataset.ensure(data_dir, datasets, arguments, cluster.is_chief(desc), config.num_classes,
                            worker=f"worker {desc['worker_index']}" if desc else "",
                            class_names=elements.class_names(train_data, eval_data))
    _fresh_runtime_if_needed(config, multi_worker=desc is not None and desc["num_workers"] > 1)
    return experiment.run(config, cluster_desc=desc)


def _datasets(train_data, eval_data) -> tuple:
    """({split: Dataset} to write, or {} when ``train_data`` is a converted directory; the lines to log about how
    they are taken (``from_dataset.accept``)); checks both arguments."""
    if isinstance(train_data, (str, os.PathLike)):
        from tfgpu.runtime import fileio

        directory = os.fspath(train_data)
        if eval_data is not None and (not isinstance(eval_data, (str, os.PathLike)) or
                                      fileio.absolute(os.fspath(eval_data)) != fileio.absolute(directory)):
            raise FitError("eval_data", "with a directory as train_data, evaluation uses that directory's eval split "
                           "(eval_split=...); leave eval_data out, or pass both as tf.data.Datasets")
        fileio.check_scheme(directory, "train_data")
        try:
            converted = any(c in directory for c in "*?[") or fileio.isfile(os.path.join(directory, "dataset.json"))
        except OSError as e:
            raise FitError("train_data", f"cannot read {directory!r}: {e.strerror or e}") from None
        if not converted:
            raise FitError("train_data", f"{directory!r} is not a converted dataset (no dataset.json in it): pass a "
                           "tf.data.Dataset, or convert the data with python -m tfgpu.convert")
        return {}, []
    import tensorflow as tf

    from tfgpu.data import elements

    if not isinstance(train_data, tf.data.Dataset):
        raise FitError("train_data", f"expected a converted data directory (a path with dataset.json) or a "
                       f"tf.data.Dataset of (image, label) examples, got {type(train_data).__name__} (for arrays: "
                       "tf.data.Dataset.from_tensor_slices((images, labels)))")
    elements.class_names(train_data, eval_data)  # before unbatching drops them
    train_data, note = elements.accept(train_data, "train_data")
    datasets, notes = {TRAIN_SPLIT: train_data}, [note]
    if eval_data is not None:
        if not isinstance(eval_data, tf.data.Dataset):
            raise FitError("eval_data", f"with a tf.data.Dataset as train_data, eval_data must be one too (or None), "
                           f"got {type(eval_data).__name__}")
        eval_data, note = elements.accept(eval_data, "eval_data")
        notes.append(note)
        channels = eval_data.element_spec[0].shape[-1], train_data.element_spec[0].shape[-1]
        if None not in channels and channels[0] != channels[1]:
            raise FitError("eval_data", f"images have {channels[0]} channels, train_data's {channels[1]}")
        datasets[EVAL_SPLIT] = eval_data
    return datasets, [note for note in notes if note]


def register(model_fn) -> str:
    """Registers ``model_fn`` as a classifier builder named ``fit:<module>.<qualname>``; returns the name.

    The name is the same in every process that runs the script (a resumed run's config.yaml names the same
    model); registering again under a name points it at the newest function (a notebook cell run twice)."""
    from tfgpu.models import registry

    module = getattr(model_fn, "__module__", None) or "unknown"
    qualname = getattr(model_fn, "__qualname__", None) or type(model_fn).__name__
    name = f"fit:{module}.{qualname}"
    if name not in _MODEL_FNS and name not in registry.list_models():
        registry.register_model(name)(lambda input_shape, num_classes, **_: _build(name, input_shape, num_classes))
    _MODEL_FNS[name] = model_fn
    return name


def model_fn_of(name: str):
    """The model_fn registered as ``name`` (``register``), or None: whose source the model fingerprint hashes."""
    return _MODEL_FNS.get(name)


def _build(name: str, input_shape, num_classes: int):
    """Calls the model_fn registered as ``name`` and checks its model against the data."""
    import keras

    model = _MODEL_FNS[name]()
    if not isinstance(model, keras.Model):
        raise FitError("model_fn", f"returned {type(model).__name__}, not a keras.Model")
    inputs, outputs = getattr(model, "inputs", None), getattr(model, "outputs", None)
    if inputs and outputs:
        wants = tuple(inputs[0].shape[1:])
        if len(wants) != len(input_shape) or any(w not in (None, d) for w, d in zip(wants, input_shape)):
            raise FitError("model_fn", f"its model takes inputs {wants}, but the images are {tuple(input_shape)} "
                           "(image_size=N crops them to NxN)")
        if outputs[0].shape[-1] != num_classes:
            raise FitError("model_fn", f"its model has {outputs[0].shape[-1]} outputs, but the data has "
                           f"{num_classes} classes (one logit per class; num_classes=N sets the classes)")
    _check_saveable(_MODEL_FNS[name], model)
    return model


def _check_saveable(model_fn, model) -> None:
    """The check ``--model=MODULE:FUNCTION`` builders get (tfgpu.models.user): a model Keras cannot serialize is
    refused now, not when export/model.keras fails after training."""
    import sys

    from tfgpu.models import user

    module = sys.modules.get(getattr(model_fn, "__module__", None) or "")
    if module is not None:
        reference = getattr(model_fn, "__qualname__", None) or type(model_fn).__name__
        user.UserBuilder(reference, "model_fn", model_fn, module, getattr(module, "__file__", None) or "") \
            .check_saveable(model)


def _fresh_runtime_if_needed(config, multi_worker: bool) -> None:
    """Restarts TensorFlow's eager runtime when this run needs an unstarted one (see the module docstring)."""
    from tensorflow.python.eager import context

    from tfgpu.config import RuntimeConfig
    from tfgpu.runtime import distribute

    if not multi_worker:
        try:
            distribute.configure_devices(RuntimeConfig.of(config))
            return
        except RuntimeError:
            pass
    log.info("restarting TensorFlow's runtime to apply %s (tensors and datasets made before this call may not be "
             "usable after it)", "MultiWorkerMirrored's collectives" if multi_worker else "the device settings")
    context._reset_context()
