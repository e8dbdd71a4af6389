"""Datasets: TFRecord schema and writer, built-in sources, tf.data pipelines."""
