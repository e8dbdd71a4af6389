"""Where a ``tfgpu.fit`` run trains: the strategy the user's model was made under, as a ``runtime.distribute.Placement``.

Keras remembers the strategy a model was created in (``model.distribute_strategy``): the one ``import tfgpu`` made
for the job (``runtime.job_strategy``), one the user made and built the model under (``with strategy.scope():``), or
Keras' default (one device). ``tfgpu.fit`` trains there and nowhere else. A model made before ``import tfgpu`` made
the job's strategy lives outside it: refused in one line saying to move the import up.
"""
from tfgpu.config import ConfigError
from tfgpu.runtime import distribute, job_strategy
from tfgpu.runtime.distribute import Placement
from tfgpu.training.fit import inputs


def of_model(model) -> Placement:
    """The placement of ``model``'s strategy; ConfigError for a model made outside the job's strategy."""
    import tensorflow as tf

    job = job_strategy.strategy()
    made_in = getattr(model, "_distribute_strategy", None)
    if job is not None and made_in is not job:
        raise ConfigError("model", f"{model.name} was made before `import tfgpu` created the job's "
                          f"{type(job).__name__}, so it cannot train on the job's devices; "
                          f"{job_strategy.MOVE_IMPORT_UP}")
    strategy = made_in or tf.distribute.get_strategy()
    if distribute.is_multi_worker(strategy):
        return _multi_worker(strategy)
    replicas = strategy.num_replicas_in_sync
    try:
        devices = tuple(strategy.extended.worker_devices)
    except RuntimeError:  # Keras' default strategy: the default device
        devices = ("/cpu:0",)
    kind = "mirrored" if replicas > 1 else "one_device"
    return Placement(strategy, kind, replicas, 1, 0, True, devices,
                     replicas > 1 and not any("GPU" in d.upper() for d in devices))


def _multi_worker(strategy) -> Placement:
    from tensorflow.python.distribute import multi_worker_util

    from tfgpu.runtime import cluster

    resolver = strategy.cluster_resolver
    spec = resolver.cluster_spec().as_dict()
    index = multi_worker_util.id_in_cluster(spec, resolver.task_type, resolver.task_id)
    workers = len(spec.get("chief", [])) + len(spec.get("worker", []))
    devices = tuple(strategy.extended.worker_devices)
    return Placement(strategy, "multi_worker_mirrored", strategy.num_replicas_in_sync, workers, index,
                     cluster.is_chief_task(spec, resolver.task_type, resolver.task_id), devices, False)


def replica_ids(placement: Placement) -> range:
    """The job-wide replica ids of this worker's replicas (``replica_id_in_sync_group``): worker-major."""
    local = placement.num_replicas // placement.num_workers
    return range(placement.worker_index * local, (placement.worker_index + 1) * local)


def single(placement: Placement) -> bool:
    """Whether the run has one replica on one worker: its input pipeline is iterated as it is, not distributed (a
    distributed dataset on the host CPU alone doubled every op's CPU time: ``training.loop.input_iterator``)."""
    return placement.num_replicas == 1 and placement.num_workers == 1


def iterator(placement: Placement, data, epoch: int, first_step: int):
    """An iterator over ``data``'s batches of epoch ``epoch`` from ``first_step`` on, for ``strategy.run``:
    the pipeline's own on one replica; arrays through ``distribute_datasets_from_function`` (each worker yields its
    replicas' parts); a user's Dataset through ``experimental_distribute_dataset`` (tf.distribute's split)."""
    return iter(_distributed(placement, data, epoch, first_step))


def batch_spec(placement: Placement, data):
    """The type of the batches ``iterator`` gives (per replica when distributed), without starting the data: a
    Python generator's first elements are not drawn."""
    return _distributed(placement, data, 0, 0).element_spec


def _distributed(placement: Placement, data, epoch: int, first_step: int):
    ids = replica_ids(placement)

    def dataset(_context=None):
        return data.epoch_dataset(epoch, first_step, placement.num_replicas, ids)

    if single(placement):
        return dataset()
    if data.kind in inputs.BY_INDEX:
        return placement.strategy.distribute_datasets_from_function(dataset)
    return placement.strategy.experimental_distribute_dataset(dataset())
