"""``tfgpu.fit`` is ``keras.Model.fit`` on many devices: a Keras script ports with two edits.

    import tfgpu
    model.compile(optimizer=keras.optimizers.Adam(1e-3), loss="sparse_categorical_crossentropy",
                  metrics=["accuracy"])
    history = tfgpu.fit(model, x, y, batch_size=64, epochs=5, validation_split=0.1,
                        callbacks=[keras.callbacks.EarlyStopping(patience=2, restore_best_weights=True)])
    model.evaluate(x_test, y_test)   # the trained weights are in the user's model, as after model.fit

The same script runs on N workers unchanged: ``python -m tfgpu.launch --num_workers=N -- python script.py``
(docs/from-model-fit.md). The arguments are Keras' ``fit`` arguments, meant as Keras means them
(``tfgpu.training.fit_arguments``), plus keyword-only ``model_dir`` and any tfgpu option by name:

- ``model``: a built ``keras.Model`` (compiled or not): built again inside the strategy scope with its weights,
  trained, and the trained weights and optimizer state copied back (``fit_model.Rebuild``); or a builder function,
  ``build()`` or the command line's ``build(input_shape, num_classes, **kwargs)``, called inside the scope. What
  ``compile()`` says is what trains (``fit_compile``); an uncompiled model trains with tfgpu's defaults (one log
  line says which).
- ``x``/``y``: numpy image arrays (N, H, W[, C]) with labels; a ``tf.data.Dataset`` of (image, label), batched
  (``image_dataset_from_directory``'s output included: its batch is the batch size) or not; a ``keras.utils.PyDataset``
  without workers; or a converted data directory. Arrays and Datasets are written once into ``<model_dir>/data``
  (``data.from_dataset``) and read by the normal input pipeline: every record once per epoch over any number of
  workers, exact resume. The model sees the pixels as given (``input_range`` (0, 255); float arrays in [0, 1] are
  stored as 0..255 and reach the model in (0, 1) again).
- ``sample_weight`` (or a Dataset's (x, y, w) elements, ``validation_data=(x, y, w)``) weighs the loss as Keras'
  reduction does, kept beside the records (``fit_weights``); ``shuffle=False`` trains arrays in their order
  (``shuffle_buffer=1``).
- Epochs are Keras' (``fit_arguments.epoch_ends``); ``validation_data``/``validation_split`` (the last fraction
  of the arrays, before shuffling) are evaluated after each ``validation_freq``-th epoch; ``callbacks`` run on the
  loop (``fit_callbacks``). Returns a ``keras.callbacks.History`` with Keras' per-epoch keys; ``history.results``
  is metrics.json's dict (tfgpu's own results) and ``history.model_dir`` the run directory.
- ``model_dir``: without it each call trains into a new directory under ``./tfgpu_runs`` (printed first) and never
  resumes by accident; with it, a call resumes from that directory's checkpoint.

Errors are ``tfgpu.ConfigError`` naming the argument (``batch_size``, not ``--global_batch_size``) in one line,
before any work; an unknown keyword argument gets a did-you-mean over Keras' and tfgpu's names.

Multi-worker: every worker runs the same script (TF_CONFIG or Slurm). The chief writes ``<model_dir>/data``; every
other worker hashes its own data (one pass, no writing), waits for the chief's ``dataset.json`` and refuses to
train if its data differs. ``model_dir`` must be storage every worker sees; it may be on any file system TensorFlow
opens (``gs://``; ``ram://`` in one process). TensorFlow applies device settings and MultiWorkerMirrored's
collectives only to a runtime that has not started, so once the data is on disk ``fit`` starts TensorFlow's runtime
afresh when the run needs it; tensors and datasets made before such a call may not be usable after it (the
model's weights are copied back as numpy).
"""
import dataclasses
import logging
import os

from tfgpu import config_sources
from tfgpu.config import ConfigError
from tfgpu.training import fit_arguments, fit_data, fit_runtime
from tfgpu.training import run_dir

log = logging.getLogger("tfgpu")

DATA_SUBDIR = run_dir.FIT_DATA_DIR
TRAIN_SPLIT, EVAL_SPLIT = "train", "val"
DEFAULT_BATCH_SIZE = 32  # Keras' batch_size=None
SET_BY_FIT = {
    "model": "the model is tfgpu.fit's first argument",
    "data_dir": "pass the directory as x",
    "dataset": "pass arrays, a tf.data.Dataset or a converted directory as x",
}
SET_FOR_DATASETS = {
    "train_split": "a Dataset is written as split 'train'",
    "eval_split": "a Dataset given as validation_data is written as split 'val'; leave validation_data out for no "
                  "evaluation",
}
ONLY_REGISTERED = {
    "sync_batch_norm": "applies to tfgpu's registered models; build yours with "
                       "keras.layers.BatchNormalization(synchronized=True)",
    "zero_init_residual": "applies to tfgpu's registered ResNets; initialise your model's layers yourself",
}
_RUNS = {}  # registered name -> the _Model given under it (latest)


class FitError(ConfigError):
    """A bad argument or option of ``tfgpu.fit``: ``flag`` names it; the message reads ``tfgpu.fit: NAME: why``."""

    def __init__(self, flag: str, message: str):
        ValueError.__init__(self, f"tfgpu.fit: {flag}: {message}")
        self.flag, self.reason = flag, message


@dataclasses.dataclass
class _Model:
    """What ``tfgpu.fit`` was given as the model and what the run built from it."""
    builder: object = None  # a builder function, or None for a model object
    rebuild: object = None  # fit_model.Rebuild of a model object
    compiled: object = None  # fit_compile.Compiled (of the object at once; of a builder's model when built)
    class_weight: dict = None
    one_hot: bool = False
    sample_weights: dict = None  # split -> per-example weights (fit_weights)
    built: object = None  # the model the run trains (inside the scope)
    defaults: tuple = ("sgd", 0.1, "cosine")  # the run's optimizer, base learning rate and schedule (uncompiled)


def fit(model, x=None, y=None, batch_size=None, epochs=1, verbose="auto", callbacks=None, validation_split=0.0,
        validation_data=None, shuffle=True, class_weight=None, sample_weight=None, initial_epoch=0,
        steps_per_epoch=None, validation_steps=None, validation_freq=1, *, model_dir=None, **tfgpu_options):
    """``model.fit(x, y, ...)`` as ``tfgpu.fit(model, x, y, ...)`` on every device of the job; returns a
    ``keras.callbacks.History`` (``.results``: metrics.json's dict; ``.model_dir``).

    See the module docstring. Raises ``tfgpu.ConfigError`` (``FitError``) for a bad argument or option, before any
    training; training failures raise those of ``tfgpu.training.failures``: a SIGTERM raises ``tfgpu.Preempted``
    once the checkpoint is saved (calling fit again with the same ``model_dir`` resumes from it)."""
    arguments = dict(x=x, y=y, batch_size=batch_size, epochs=epochs, verbose=verbose, callbacks=callbacks,
                     validation_split=validation_split, validation_data=validation_data, shuffle=shuffle,
                     class_weight=class_weight, sample_weight=sample_weight, initial_epoch=initial_epoch,
                     steps_per_epoch=steps_per_epoch, validation_steps=validation_steps,
                     validation_freq=validation_freq)
    names = {name: name for name in arguments}
    for alias, name in fit_arguments.ALIASES.items():  # tfgpu.fit's earlier names: train_data, eval_data
        if alias in tfgpu_options:
            if arguments[name] is not None:
                raise FitError(alias, f"give either {name} or {alias}, not both")
            arguments[name], names[name] = tfgpu_options.pop(alias), alias
    try:
        return _fit(model, arguments, model_dir, tfgpu_options, names)
    except FitError:
        raise
    except ConfigError as e:
        flag = fit_arguments.ARGUMENT_OF.get(e.flag, e.flag) if e.flag not in tfgpu_options else e.flag
        raise FitError(names.get(flag, flag), fit_arguments.in_keras_words(e.reason)) from None


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


def _fit(model, args: dict, model_dir, options: dict, names: dict):
    fit_arguments.check_names(options, config_sources.options())
    options = {**_recipe_options(options.pop("recipe", "")), **options}
    for keras_name, option in fit_arguments.OPTION_OF.items():
        if args[keras_name] is not None and option in options:
            raise FitError(keras_name, f"give either {keras_name} or {option}, not both")
    explicit = {name: config_sources.coerce(name, value) for name, value in options.items()}
    for name, why in {**SET_BY_FIT, **ONLY_REGISTERED}.items():
        if name in options and (name in SET_BY_FIT or explicit[name]):
            raise FitError(name, f"is set by tfgpu.fit: {why}" if name in SET_BY_FIT else why)
    if explicit.get("task", "classification") != "classification":
        raise FitError("task", "tfgpu.fit trains classifiers (task='classification')")
    if explicit.get("max_restarts"):
        raise FitError("max_restarts", "restarts re-execute python -m tfgpu.train; run your script again instead "
                       "(tfgpu.fit resumes from the last checkpoint in model_dir)")
    if model_dir is not None and (not isinstance(model_dir, (str, os.PathLike)) or not os.fspath(model_dir)):
        raise FitError("model_dir", f"must be a directory path, got {model_dir!r}")
    _check_keras_arguments(args)
    given = _model_argument(model)
    data = fit_data.resolve(args, names)
    given.class_weight, given.one_hot, given.sample_weights = args["class_weight"], data.one_hot, data.sample_weights
    batch = args["batch_size"] or data.batch_size
    if "global_batch_size" not in explicit:
        explicit["global_batch_size"] = batch or DEFAULT_BATCH_SIZE
        if not batch:
            log.info("batch_size: %d (Keras' default)", DEFAULT_BATCH_SIZE)
    if args["validation_steps"]:
        explicit["eval_steps"] = args["validation_steps"]
    verbose = args["verbose"]
    if "verbose" not in explicit:
        explicit["verbose"] = -1 if verbose == "auto" else config_sources.coerce("verbose", verbose)
    explicit.setdefault("input_range", data.input_range)
    if args["shuffle"] is False and data.in_order and "shuffle_buffer" not in explicit:
        explicit["shuffle_buffer"] = 1  # arrays in their order, as Keras' shuffle=False (records in shard order)
    if data.datasets:
        for name in SET_FOR_DATASETS:
            if name in options:
                raise FitError(name, SET_FOR_DATASETS[name])
        explicit.update(train_split=TRAIN_SPLIT, eval_split=EVAL_SPLIT if EVAL_SPLIT in data.datasets else "none")

    from tfgpu.runtime import cluster, logs
    from tfgpu.training import fit_callbacks

    desc = cluster.resolve_for_run(explicit.get("cluster", "auto"), explicit.get("distribution_strategy", "auto"))
    chief = cluster.is_chief(desc)
    runs_callbacks, backup_dir = fit_callbacks.prepare(args["callbacks"], chief)
    if model_dir is None:
        model_dir = backup_dir or fit_arguments.new_run_dir(_cluster_json(desc))
    elif backup_dir:
        log.info("BackupAndRestore: model_dir %s holds the checkpoints a rerun resumes from", model_dir)
    model_dir = os.fspath(model_dir)
    data_dir = run_dir.fit_data(model_dir) if data.datasets else data.directory
    name = _register(given)
    explicit.update(model_dir=model_dir, data_dir=data_dir, model=name)
    config = config_sources.resolve(explicit)

    if not logging.getLogger("tfgpu").handlers:
        logs.setup()
    if chief:
        print(f"tfgpu.fit: run directory {model_dir}", flush=True)
    for note in data.notes:
        log.info("%s", note)
    from tfgpu.training import experiment

    if data.datasets:
        experiment.check_model_dir(model_dir)
        from tfgpu.data import from_dataset

        splits = {TRAIN_SPLIT: names["x"], EVAL_SPLIT: names["validation_data"]}
        manifest = from_dataset.ensure(data_dir, data.datasets, splits, chief, config.num_classes,
                                       worker=f"worker {desc['worker_index']}" if desc else "",
                                       class_names=data.class_names)
    else:
        from tfgpu.data import tfrecord

        manifest = tfrecord.read_manifest(data.directory)
    num_train = int(manifest["splits"][config.train_split]["num_examples"])
    num_workers = desc["num_workers"] if desc else 1
    ends = fit_arguments.epoch_ends(num_train, config.global_batch_size, num_workers, int(args["epochs"]),
                                    int(args["initial_epoch"]), int(args["steps_per_epoch"] or 0))
    config = _with_epochs(config, explicit, ends)
    import keras

    history = keras.callbacks.History()
    if given.rebuild is not None:
        history.set_model(given.rebuild.user_model)  # History.on_epoch_end sets model.history, as model.fit does
    hooks = fit_callbacks.KerasLoop(runs_callbacks, history, ends, int(args["initial_epoch"]),
                                    int(args["validation_freq"]), given)
    given.defaults = (config.optimizer, config.base_learning_rate, config.lr_schedule)
    restarted = fit_runtime.fresh_if_needed(config, multi_worker=num_workers > 1)
    with fit_runtime.collectives_noted() as note:
        results = experiment.run(config, cluster_desc=desc, hooks=hooks)
        note(int(results.get("num_replicas") or 1))
    if given.rebuild is not None:
        given.rebuild.copy_back(given.compiled.built_optimizer, restarted)
    history.results, history.model_dir = results, model_dir
    return history


def _check_keras_arguments(args: dict) -> None:
    """Keras' own checks of the scalar arguments, in its words."""
    for name in ("epochs", "initial_epoch", "validation_freq"):
        if not isinstance(args[name], int) or isinstance(args[name], bool) or args[name] < (1 if name != "initial_epoch"
                                                                                           else 0):
            raise FitError(name, f"must be a {'positive' if name != 'initial_epoch' else 'non-negative'} integer, "
                           f"got {args[name]!r}")
    for name in ("batch_size", "steps_per_epoch", "validation_steps"):
        value = args[name]
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
            raise FitError(name, f"must be a positive integer or None, got {value!r}")
    class_weight = args["class_weight"]
    if class_weight is not None and (not isinstance(class_weight, dict) or not all(
            isinstance(k, int) and float(v) >= 0 for k, v in class_weight.items())):
        raise FitError("class_weight", "must be a dict {class index: weight >= 0}")


def _model_argument(model):
    """The ``_Model`` of ``tfgpu.fit``'s first argument: a keras.Model object (kept for rebuilding, its compile()
    read now, before TensorFlow's runtime may restart) or a builder function."""
    import keras

    from tfgpu.training import fit_compile, fit_model

    if isinstance(model, keras.Model):
        return _Model(rebuild=fit_model.Rebuild(model), compiled=fit_compile.of_model(model))
    if callable(model):
        return _Model(builder=model)
    raise FitError("model", f"must be a keras.Model or a function that returns one, got {type(model).__name__}")


def _cluster_json(desc) -> str:
    import json

    return json.dumps(desc["cluster_spec"], sort_keys=True) if desc and desc["num_workers"] > 1 else ""


def _with_epochs(config, explicit: dict, ends: tuple):
    """The run's length in Keras' epochs (unless train/train_steps was given) and a checkpoint at each epoch's end
    (unless checkpoint_every was given)."""
    changes = {}
    if not explicit.get("train") and not explicit.get("train_steps"):
        changes["train_steps"] = ends[-1]
    if "checkpoint_every" not in explicit and "checkpoint_every_steps" not in explicit:
        changes["checkpoint_every_steps"] = ends[0]
    return dataclasses.replace(config, **changes) if changes else config


def register(model_fn) -> str:
    """Registers builder ``model_fn`` under ``fit:<module>.<qualname>``; returns the name (kept for callers of the
    earlier API and the tests that run ``python -m tfgpu.train --model=<name>``)."""
    return _register(_Model(builder=model_fn))


def _register(given: "_Model") -> str:
    """Registers what ``tfgpu.fit`` was given as a classifier builder named ``fit:<module>.<qualname>`` (a model
    object: ``fit:<its class module>.<its name>``); returns the name.

    The name is the same in every process that runs the script (a resumed run's config.yaml names the same
    model); registering again under a name points it at the newest model (a notebook cell run twice)."""
    from tfgpu.models import registry

    if given.builder is not None:
        model_fn = given.builder
        module = getattr(model_fn, "__module__", None) or "unknown"
        qualname = getattr(model_fn, "__qualname__", None) or type(model_fn).__name__
    else:
        module, qualname = "model", given.rebuild.user_model.name
    name = f"fit:{module}.{qualname}"
    if name not in _RUNS and name not in registry.list_models():
        registry.register_model(name)(lambda input_shape, num_classes, **_: _build(name, input_shape, num_classes))
    _RUNS[name] = given
    return name


def model_fn_of(name: str):
    """The builder function registered as ``name`` (``register``), or None (a model object: its layers are what the
    model fingerprint compares): whose source the fingerprint hashes."""
    given = _RUNS.get(name)
    return given.builder if given is not None else None


def _build(name: str, input_shape, num_classes: int):
    """Builds the model registered as ``name`` (inside the strategy scope), checks it against the data and records
    its compile()."""
    import keras

    from tfgpu.training import fit_compile, fit_model

    given = _RUNS[name]
    if given.rebuild is not None:
        model = given.rebuild.build()
    else:
        model = fit_model.call_builder(given.builder, input_shape, num_classes)
        if not isinstance(model, keras.Model):
            raise FitError("model", f"returned {type(model).__name__}, not a keras.Model")
    inputs, outputs = getattr(model, "inputs", None), getattr(model, "outputs", None)
    if inputs and outputs:
        wants = tuple(inputs[0].shape[1:])
        if len(wants) != len(input_shape) or any(w not in (None, d) for w, d in zip(wants, input_shape)):
            raise FitError("model", f"its model takes inputs {wants}, but the images are {tuple(input_shape)} "
                           "(image_size=N crops them to NxN)")
    if given.builder is not None:
        _check_saveable(given.builder, model)
        given.compiled = fit_compile.of_model(model)
    if inputs and outputs and not given.compiled.binary and outputs[0].shape[-1] != num_classes:
        raise FitError("model", f"its model has {outputs[0].shape[-1]} outputs, but the data has "
                       f"{num_classes} classes (one logit per class; num_classes=N sets the classes; one sigmoid "
                       "unit: compile with binary_crossentropy)")
    given.compiled.class_weight, given.compiled.one_hot = given.class_weight, given.one_hot
    given.compiled.sample_weights = given.sample_weights or None
    if given.compiled.compiled:
        log.info("%s", given.compiled.describe())
    else:
        log.info("%s", fit_compile.defaults_line(*given.defaults))
    fit_compile.register(name, given.compiled)
    if given.built is None:  # the model trained (the export may build a float32 twin afterwards)
        given.built = model
    return model


def _check_saveable(model_fn, model) -> None:
    """The check ``--model=MODULE:FUNCTION`` builders get (tfgpu.models.user): a model Keras cannot serialize is
    refused now, not when export/model.keras fails after training."""
    import sys

    from tfgpu.models import user

    module = sys.modules.get(getattr(model_fn, "__module__", None) or "")
    if module is not None:
        reference = getattr(model_fn, "__qualname__", None) or type(model_fn).__name__
        user.UserBuilder(reference, "model", model_fn, module, getattr(module, "__file__", None) or "") \
            .check_saveable(model)
