"""What ``tfgpu.fit`` was given as data, as one of its inputs: arrays read by index (``arrays.ArrayInput``), tfgpu's
records read by index (``records.RecordsInput``: a Dataset ``tfgpu.data.load`` made) or a pipeline run as written
(``datasets.DatasetInput``). Keras' own data adapters check and pack the arguments first,
so ``x``, ``y``, ``sample_weight``, ``class_weight`` and ``batch_size`` mean, and fail, as they do under
``model.fit``.
"""
from tfgpu.training.fit.arrays import ArrayInput
from tfgpu.training.fit.datasets import DatasetInput

BY_INDEX = ("arrays", "records")  # inputs read by index: an epoch's length known on every worker, parts per replica


def make(x, y=None, sample_weight=None, batch_size=None, steps=None, shuffle=False, class_weight=None, seed=0):
    """The input for ``model.fit``-style data arguments; ``steps``: Keras' ``steps_per_epoch`` (or
    ``validation_steps``)."""
    from tfgpu.runtime.keras_internals import internal

    array_data_adapter, get_data_adapter = internal("array_data_adapter"), internal("data_adapters").get_data_adapter

    from tfgpu.data.input import loader

    if loader.records_of(x) is not None:
        from tfgpu.training.fit import records

        return records.make(loader.records_of(x), y, sample_weight, batch_size, class_weight, steps)
    if array_data_adapter.can_convert_arrays((x, y, sample_weight)):
        adapter = array_data_adapter.ArrayDataAdapter(x, y, sample_weight=sample_weight, batch_size=batch_size,
                                                      steps=steps, shuffle=shuffle, class_weight=class_weight)
        return ArrayInput(adapter._inputs, adapter.batch_size, bool(shuffle), seed, steps_per_epoch=steps)
    adapter = get_data_adapter(x, y, sample_weight=sample_weight, batch_size=batch_size, steps_per_epoch=steps,
                               shuffle=shuffle, class_weight=class_weight)
    return DatasetInput(adapter, steps)
