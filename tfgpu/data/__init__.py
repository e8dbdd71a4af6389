"""Datasets, in two halves that share only the schema (checked by tests/data/test_halves.py), one sub-package each:

- ``schema/``, what a converted dataset is on disk: ``tfrecord`` (the record format, ``dataset.json``'s reader and
  writer), ``shards`` (shards checked against their manifest).
- **Writing** (the converter, ``python -m tfgpu.convert``):
  - ``sources/``, where examples come from: ``source_formats`` (every kind of ``--source``), ``source`` (a
    ``Source`` and its splits), ``builtin``, ``folders``, ``csvlist``, ``tfds_source``, ``foreign``;
  - ``conversion/``, how they are written: ``convert``, ``encode``, ``workers``, ``outdir``, ``manifest``.
- **Reading** (a run's input):
  - ``index/``, where a run is in its data and in which order it reads: ``order``, ``chunks``, ``position``,
    ``input_position``, ``resume``;
  - ``input/``, the pipelines: ``dataset_info`` (a converted directory described from its ``dataset.json``),
    ``records``, ``augment``, ``pipeline``, ``memory`` (a pipeline's train images held decoded in memory),
    ``loader`` (``tfgpu.data.load``: a split as a Keras script's Dataset, read by index).
- **Bridge**: ``catalog`` (which dataset a run names; a built-in or TFDS one converted into the cache first) imports
  both halves; neither half imports it.

The read half imports nothing of the write half, nor the write half of the read half: reading a dataset does not
depend on how it was written.

``tfgpu.data.load(data_dir, split="train", batch_size=32, *, shuffle=None, seed=42, cache=False)``: a converted
split as a ``tf.data.Dataset`` of ``(images, labels)`` batches for ``model.fit`` or ``tfgpu.fit``
(``input/loader.py``; loaded when first used, so importing ``tfgpu.data`` stays cheap).
"""


def __getattr__(name):
    if name == "load":
        from tfgpu.data.input.loader import load

        return load
    raise AttributeError(f"module 'tfgpu.data' has no attribute {name!r}")
