"""Checkpoints: the chief saves to ``<model_dir>/checkpoints``; every other worker saves the same
collective checkpoint into a temporary directory that it deletes at the end.

All workers restore from the chief's directory, so a rerun of the same command
resumes every worker at the same step. TensorFlow writes a checkpoint's data and
``.index`` files first and the ``checkpoint`` state file (which names the latest)
last, under a temporary name renamed over the old one
(``file_io.atomic_write_string_to_file``), so a crash during a save leaves the
previous checkpoint as the latest usable one. Each checkpoint also holds the data position and topology that
trained it (``DataPosition``: JSON in the checkpoint itself, so it is written and replaced with it); a checkpoint
written before it was recorded restores without it. Each also holds the fingerprint of the models that wrote it
(``ModelFingerprint``; ``experiment.setup`` compares it with the models it built before anything is restored or
written: ``config_change.model_changes``). ``model_dir`` may be any path
TensorFlow opens (``gs://``, ``ram://``): on an object store that rename is a copy
and a delete, so the state file is replaced whole but not in one atomic step.

Nothing restored is trusted: before TensorFlow restores a checkpoint, ``first_mismatch`` compares its index
(variable names and shapes) with the objects being restored, so a checkpoint of another model, task or head,
a truncated or corrupt file, or a path that is no checkpoint stops with one ``ConfigError`` naming the
checkpoint and the first variable that does not fit. Cost: one read of the ``.index`` file and a walk of the
objects' variables (milliseconds; no weight is read twice).
"""
import json
import logging
import shutil

import tensorflow as tf
from tensorflow.core.protobuf import trackable_object_graph_pb2
from tensorflow.python.checkpoint import graph_view, util as checkpoint_util  # TF's own names for variables

from tfgpu.config import ConfigError
from tfgpu.runtime import fileio
from tfgpu.runtime.distribute import Placement, worker_dir
from tfgpu.runtime import run_dir

log = logging.getLogger("tfgpu")


VALUE_SUFFIX = "/.ATTRIBUTES/VARIABLE_VALUE"  # how a checkpoint's index names a variable's value
FIX = {"model_dir": "train this model into a new --model_dir",  # by the flag that named the checkpoint
       "checkpoint": "pass a checkpoint of a run of this model, task and dataset"}
UNREADABLE_FIX = {"model_dir": f"its .index file is truncated or corrupt: put back an intact copy, or "
                               f"{FIX['model_dir']}",
                  "checkpoint": "pass a checkpoint's prefix (its files without .index or .data-*), e.g. "
                                "<model_dir>/checkpoints/ckpt-N"}


def checkpoint_dir(model_dir: str) -> str:
    return run_dir.checkpoints(model_dir)


DATA_POSITION = "data_position"


class DataPosition(tf.train.experimental.PythonState):
    """The data position record (``tfgpu.data.index.position.to_record``) saved inside each checkpoint: ``current()``
    gives the one to save; ``restored`` is the one read back (``None`` until a checkpoint holding one is restored)."""

    def __init__(self, current):
        self.current = current
        self.restored = None

    def serialize(self):
        return json.dumps(self.current())

    def deserialize(self, string_value):
        try:
            self.restored = json.loads(string_value)
        except ValueError:
            self.restored = string_value  # position.from_record refuses it, naming the checkpoint


MODEL_FINGERPRINT = "model_fingerprint"
_PY_STATE = "/.ATTRIBUTES/py_state"  # how a checkpoint's index names a PythonState's value


class ModelFingerprint(tf.train.experimental.PythonState):
    """The fingerprint of the models a checkpoint holds (``tfgpu.models.fingerprint.of``), saved inside it so that it
    is written and replaced with the weights it describes; ``current``: the one to save ({} until recorded)."""

    def __init__(self):
        self.current = {}

    def serialize(self):
        return json.dumps(self.current, sort_keys=True)

    def deserialize(self, string_value):
        pass  # read before the restore, by ``recorded_fingerprint``; the built models are the current ones


def _saved_items(path: str) -> set:
    """The top-level names the checkpoint at ``path`` saves; empty for what is no readable checkpoint (which
    ``restore`` then refuses in one line)."""
    try:
        return {name.split("/")[0] for name, _ in tf.train.list_variables(path)}
    except (tf.errors.OpError, ValueError):
        return set()


def has_data_position(path: str) -> bool:
    """Whether the checkpoint at ``path`` records its data position (one written before it did not); False for
    what is no readable checkpoint, which ``restore`` then refuses in one line."""
    return DATA_POSITION in _saved_items(path)


def _recorded_state(path: str, name: str):
    """The JSON object the PythonState ``name`` saved in the checkpoint at ``path``, read without restoring it;
    None when it holds none (older, or unreadable: ``restore`` names that)."""
    if name not in _saved_items(path):
        return None
    try:
        value = json.loads(tf.train.load_checkpoint(path).get_tensor(name + _PY_STATE))
    except (tf.errors.OpError, ValueError):
        return None
    return value if isinstance(value, dict) and value else None


def recorded_fingerprint(path: str):
    """The model fingerprint the checkpoint at ``path`` recorded, or None when it has none."""
    return _recorded_state(path, MODEL_FINGERPRINT)


def recorded_data_position(path: str):
    """The data position record (``tfgpu.data.index.position.to_record``) of the checkpoint at ``path``, or None."""
    return _recorded_state(path, DATA_POSITION)


def latest(model_dir: str) -> str | None:
    """The latest checkpoint of a run, or None when it has none; ConfigError(model_dir) when the ``checkpoint``
    state file names one whose files are gone (training would otherwise silently start again from step 0)."""
    directory = checkpoint_dir(model_dir)
    try:
        found = tf.train.latest_checkpoint(directory)
    except (ValueError, OSError, tf.errors.OpError) as e:  # e.g. a state file that is not text
        raise ConfigError("model_dir", f"{run_dir.checkpoint_state(model_dir)} is not a checkpoint state file "
                          f"TensorFlow can read ({type(e).__name__}); restore it from a copy, or train into a new "
                          "--model_dir") from None
    if found is None and fileio.exists(run_dir.checkpoint_state(model_dir)):
        named = tf.train.get_checkpoint_state(directory)  # None (TensorFlow logs why) when it does not parse
        if named is None:
            raise ConfigError("model_dir", f"{directory}/checkpoint is unreadable; put back an intact copy, or "
                              f"remove {directory} to start the run afresh")
        if named.model_checkpoint_path:
            raise ConfigError("model_dir", f"{directory}/checkpoint names {named.model_checkpoint_path}, whose "
                              f"files are missing; put them back, or remove {directory} to start afresh")
    return found


def _first_line(error: Exception) -> str:
    text = getattr(error, "message", None) or str(error)
    return text.strip().splitlines()[0] if text.strip() else type(error).__name__


def variables_by_key(checkpoint: tf.train.Checkpoint) -> dict:
    """{checkpoint key: variable} of every variable ``checkpoint`` saves, named as TensorFlow names them (the
    first path that reaches each variable, e.g. a model's kernel under ``optimizer/_trainable_variables/0``):
    the models' variables first, then the optimizers' own state (so a mismatch names a layer, not its momentum)."""
    import keras

    objects, _, _, _, names = checkpoint_util.objects_ids_and_slot_variables_and_paths(
        graph_view.ObjectGraphView(checkpoint))
    state = {id(v) for o in objects if isinstance(o, keras.optimizers.Optimizer) for v in o.variables}
    variables = [o for o in objects if isinstance(o, tf.Variable) or (hasattr(o, "shape") and hasattr(o, "assign"))]
    return {names[v] + VALUE_SUFFIX: v for v in sorted(variables, key=lambda v: id(v) in state)}


def items(checkpoint: tf.train.Checkpoint) -> list:
    """The names of the objects ``checkpoint`` saves at its top (step, model, optimizer, ...)."""
    return [child.name for child in graph_view.ObjectGraphView(checkpoint).list_children(checkpoint)
            if child.name != "save_counter"]  # TensorFlow's own count of saves: not part of a run's state


def saved_items(reader) -> list:
    """The names of the objects a checkpoint holds at its top, from its object graph."""
    graph = trackable_object_graph_pb2.TrackableObjectGraph()
    graph.ParseFromString(reader.get_tensor("_CHECKPOINTABLE_OBJECT_GRAPH"))
    return [child.local_name for child in graph.nodes[0].children]


def first_mismatch(checkpoint: tf.train.Checkpoint, reader) -> str | None:
    """What first keeps the checkpoint ``reader`` reads from restoring into ``checkpoint``: items it lacks (a
    checkpoint of another task), then the first variable it lacks or holds in another shape (another model or
    head); None when every variable fits."""
    held = saved_items(reader)
    lacked = [item for item in items(checkpoint) if item not in held]
    if lacked:
        return f"it has no {', '.join(map(repr, lacked))} (it holds {', '.join(sorted(held))})"
    shapes = reader.get_variable_to_shape_map()
    ours = variables_by_key(checkpoint)
    for key, variable in ours.items():
        name = key[:-len(VALUE_SUFFIX)]
        path = (getattr(variable, "path", None) or variable.name).split(":")[0]  # Keras's layer path, else TF's
        shown = name if path in name else f"{name} ({path})"
        wanted = [int(d) for d in variable.shape]
        if key not in shapes:
            return f"it has no variable {shown} (shape {wanted})"
        if list(shapes[key]) != wanted:
            return f"its {shown} has shape {list(shapes[key])}, the model built here {wanted}"
    return None


def restore(checkpoint: tf.train.Checkpoint, path: str, flag: str) -> None:
    """Restores ``path`` into ``checkpoint`` once its index shows every variable fits; ConfigError(``flag``)
    naming the checkpoint and what does not fit, or why it cannot be read (not a checkpoint, truncated, corrupt)."""
    # A checkpoint is a prefix with an .index beside it; ram:// also calls such a prefix a directory.
    if fileio.isdir(path) and not fileio.exists(path + ".index"):
        inside = tf.train.latest_checkpoint(path)
        raise ConfigError(flag, f"{path} is a directory, not a checkpoint; " + (
            f"pass a checkpoint's prefix, e.g. {inside}" if inside else "it holds no checkpoint"))
    try:
        # The reader itself when the prefix has its .index: load_checkpoint would take a ram:// prefix for a
        # directory and look for a checkpoint inside it.
        reader = (tf.compat.v1.train.NewCheckpointReader(path) if fileio.exists(path + ".index") else
                  tf.train.load_checkpoint(path))
    except (tf.errors.OpError, ValueError) as e:  # no checkpoint there, or an .index that does not parse
        raise ConfigError(flag, f"{path} is not a readable checkpoint ({_first_line(e)}); {UNREADABLE_FIX[flag]}"
                          ) from None
    try:
        mismatch = first_mismatch(checkpoint, reader)  # reads the object graph from the data file
    except Exception as e:  # noqa: BLE001 (a short data file raises IndexError, a corrupt one DataLossError, ...)
        raise _damaged(flag, path, e) from None
    if mismatch:
        raise ConfigError(flag, f"checkpoint {path} does not fit the model built here: {mismatch}; it was written "
                          f"by another model, task or dataset: {FIX[flag]}")
    try:
        checkpoint.restore(path).assert_existing_objects_matched().expect_partial()
    except Exception as e:  # noqa: BLE001 (as above)
        raise _damaged(flag, path, e) from None


def _damaged(flag: str, path: str, error: Exception) -> ConfigError:
    return ConfigError(flag, f"checkpoint {path} cannot be restored ({type(error).__name__}: {_first_line(error)}); "
                       f"its files may be truncated or corrupt: put back intact copies, or {FIX[flag]}")


class Checkpointer:
    def __init__(self, model_dir: str, placement: Placement, items: dict, step: tf.Variable, keep: int,
                 data_position=None):
        self.model_dir = model_dir
        self.real_dir = checkpoint_dir(model_dir)
        self._own_dir = worker_dir(model_dir, placement)
        self._temporary = not placement.is_chief
        directory = self.real_dir if placement.is_chief else run_dir.checkpoints(self._own_dir)
        self._items = {"step": step, **items}
        self.data_position = DataPosition(data_position or (lambda: {}))
        self.fingerprint = ModelFingerprint()  # recorded by ``record_fingerprint`` once the run is checked
        self._states = {DATA_POSITION: self.data_position, MODEL_FINGERPRINT: self.fingerprint}
        self.checkpoint = tf.train.Checkpoint(**self._items, **self._states)
        self.manager = tf.train.CheckpointManager(self.checkpoint, directory, checkpoint_name=run_dir.CHECKPOINT_NAME, max_to_keep=keep if
                                                  placement.is_chief else 1, step_counter=step)
        self.step = step

    def restore_latest(self) -> int:
        """Restores the chief's latest checkpoint, if any; returns the step to continue from."""
        path = latest(self.model_dir)
        if path is None:
            return 0
        step = self.restore(path, "model_dir")
        log.info("restored %s: resuming at step %d", path, step)
        return step

    def restore(self, path: str, flag: str) -> int:
        """Restores checkpoint ``path`` (checked to fit; ``flag``: the option that named it), with its data position
        when it records one (then in ``data_position.restored``); returns its step. A checkpoint written before it
        recorded a data position or a model fingerprint restores without them."""
        self.restored_path = path
        saved = _saved_items(path)
        restore(tf.train.Checkpoint(**self._items, **{k: v for k, v in self._states.items() if k in saved}), path,
                flag)
        return int(self.step.numpy())

    def record_fingerprint(self, fingerprint: dict) -> None:
        """The model fingerprint every later save of this run records (``tfgpu.models.fingerprint.of``)."""
        self.fingerprint.current = fingerprint

    def save(self) -> str:
        """Saves at the current step (all workers must call it together)."""
        return self.manager.save(checkpoint_number=int(self.step.numpy()))

    def close(self) -> None:
        if self._temporary:
            shutil.rmtree(self._own_dir, ignore_errors=True)
