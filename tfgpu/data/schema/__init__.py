"""The one schema both halves of tfgpu.data share: the TFRecord format and ``dataset.json``'s reader and writer
(``tfrecord``), and the checks of shards against their manifest (``shards``)."""
