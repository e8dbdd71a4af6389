"""One ``tfgpu.fit`` call wired together: placement, inputs, the model's build, run directory, checkpoints, stops,
callbacks, then ``epochs.Epochs``. Every check that can fail does so before the first file is written."""
import json
import logging

import numpy as np

from tfgpu.training.fit import arguments, batch_norm, callbacks as callbacks_lib, inputs, labels, \
    placement as placement_lib
from tfgpu.training.fit.arguments import FitError

log = logging.getLogger("tfgpu")


def fit(model, loop: arguments.LoopOptions, *, x, y, batch_size, epochs, verbose, callbacks, validation_split,
        validation_data, shuffle, class_weight, sample_weight, initial_epoch, steps_per_epoch, validation_steps,
        validation_batch_size, validation_freq):
    from tfgpu.runtime.keras_internals import internal

    array_slicing, data_adapter_utils = internal("array_slicing"), internal("data_adapter_utils")

    if not logging.getLogger("tfgpu").handlers:  # the lines fit says (how the data is split, a resume) are seen
        from tfgpu.runtime import logs

        logs.setup()
    placement = placement_lib.of_model(model)
    if placement.num_replicas > 1:
        from tfgpu.runtime import keras_variables

        keras_variables.read_as_numbers()  # the script's float(metric.result()) after fit, as on one device
        from tfgpu.training import keras_adapter

        keras_adapter.adapt_script()  # the script's own predict/evaluate after fit, as on one device
    if model.run_eagerly and placement.num_workers > 1:
        raise FitError("run_eagerly", "compile(run_eagerly=True) runs on one worker: each worker's steps must be "
                       "compiled to meet in the same collectives")
    user_callbacks, backup_dir = callbacks_lib.prepare(callbacks)
    validation_named = "y" if validation_split and validation_data is None else "validation_data"
    if validation_split and validation_data is None:  # Keras' own cut: the last fraction, before shuffling
        (x, y, sample_weight), validation_data = array_slicing.train_validation_split(
            (x, y, sample_weight), validation_split=validation_split)
    seed = agreed_seed(placement, loop.seed)
    train = inputs.make(x, y, sample_weight, batch_size, steps_per_epoch, shuffle, class_weight, seed)
    val = None
    if validation_data is not None:
        val_x, val_y, val_weight = data_adapter_utils.unpack_x_y_sample_weight(validation_data)
        val = inputs.make(val_x, val_y, val_weight, validation_batch_size or batch_size, validation_steps)
    model_dir = loop.model_dir or backup_dir or arguments.new_run_dir(_job_name(placement))
    if not _first_step_builds(model, model_dir) and not _build(model, placement, train):
        from tfgpu.training.fit.steps import StepLoop

        StepLoop(model, placement.strategy, "train").trace_first_step(placement_lib.batch_spec(placement, train))
    labels.check_arrays(model, train)
    batch_norm.note_small_batches(model, placement, train)
    if val is not None:
        labels.check_arrays(model, val, validation_named)
    log.info("tfgpu.fit: %s; %s", placement.describe(), train.describe())

    from tfgpu.training import loop as loop_lib, stopping as stopping_lib
    from tfgpu.training.fit import epochs as epochs_lib, state as state_lib

    if placement.is_chief and not loop.model_dir and not backup_dir:
        print(f"tfgpu.fit: run directory {model_dir}", flush=True)
    position = state_lib.Position(epoch=initial_epoch, seed=getattr(train, "seed", seed), kind=train.kind,
                                  examples=getattr(train, "num_examples", -1), batch_size=_batch_size(train))
    state = state_lib.RunState(model, placement, model_dir, position, loop.checkpoint_every_s)
    outputs = callbacks_lib.ChiefOutputs(user_callbacks, placement)
    try:
        if state.restore() is not None:
            train.seed = position.seed
        from tfgpu.runtime import heartbeat

        heartbeat.beat("restored", int(state.steps.numpy()), model_dir)
        flag = loop_lib.StopFlag(placement.strategy, placement.num_workers)
        stopping = stopping_lib.Stopping(placement, state.steps, flag, state, state.every_s)
        steps_per_call = model.steps_per_execution if callbacks_lib.acts_on_batches(user_callbacks) else \
            max(model.steps_per_execution, loop.steps_per_loop)
        callback_list = callbacks_lib.callback_list(outputs.callbacks, model, verbose, epochs, train.steps_per_epoch,
                                                    placement.is_chief)
        run = epochs_lib.Epochs(model, placement, train, val, callback_list, state, stopping, steps_per_call,
                                validation_freq, model_dir)
        with labels.explained(model):
            return run.run(epochs, initial_epoch)
    finally:
        outputs.close()
        state.close()


def _first_step_builds(model, model_dir: str) -> bool:
    """Whether the model is left to its first step to build, as ``model.fit`` leaves a ``run_eagerly`` model made
    outside any strategy: that step runs eagerly, so nothing of the model, its losses or its step runs in graph mode
    (a symbolic build calls them on symbolic tensors). Not when a checkpoint waits to be restored into the model."""
    from tfgpu.training import checkpoint

    return bool(model.run_eagerly) and getattr(model, "_distribute_strategy", None) is None and \
        checkpoint.latest(model_dir) is None


def _build(model, placement, train) -> bool:
    """Keras' own build (fit's ``_maybe_symbolic_build``) from the batch's structure, inside the strategy; False for
    a model with no ``call`` of its own (a GAN whose ``train_step`` drives its parts), which cannot be called on a
    batch: as under ``model.fit`` on one device, its first step builds what is left (its optimizers)."""
    import keras

    if type(model).call is keras.Model.call and not isinstance(model, keras.Sequential) and \
            not getattr(model, "_is_graph_network", False):
        return False
    with placement.strategy.scope():
        model._symbolic_build(data_batch=train.element_spec())
    return True


def agreed_seed(placement, seed):
    """The seed of the arrays' order: the given one, else one drawn from numpy's global generator (which
    ``keras.utils.set_random_seed`` seeds) by the chief and told to every worker."""
    if seed is not None:
        return int(seed)
    drawn = int(np.random.randint(0, 2**31 - 1))
    if placement.num_workers == 1:
        return drawn
    import tensorflow as tf

    strategy = placement.strategy
    mine = tf.constant(float(drawn) if placement.is_chief else 0.0, tf.float64)
    total = strategy.reduce(tf.distribute.ReduceOp.SUM,
                            strategy.experimental_distribute_values_from_function(
                                lambda context: mine if context.replica_id_in_sync_group == 0 else mine * 0),
                            axis=None)
    return int(total.numpy())


def _batch_size(data) -> int:
    return int(getattr(data, "batch_size", 0) or 0)


def _job_name(placement) -> str:
    """A name every worker of a multi-worker job derives alike (its cluster spec), for a run directory."""
    if placement.num_workers == 1:
        return ""
    return json.dumps(placement.strategy.cluster_resolver.cluster_spec().as_dict(), sort_keys=True)
