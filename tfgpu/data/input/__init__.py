"""A run's input pipelines over a converted dataset: its ``dataset.json`` described (``dataset_info``), its records
read and checked (``records``), augmented (``augment``) and batched into the train and eval ``tf.data``
pipelines (``pipeline``)."""
