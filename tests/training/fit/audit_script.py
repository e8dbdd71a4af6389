"""An exactly-once audit of a real tfgpu.fit run, for tests/training/fit/test_run.py: a model whose own train_step
counts, per example, how often it was trained on (a sum over every replica and worker), on numpy arrays whose
first column is the example's index.

    python audit_script.py MODEL_DIR EPOCHS [STOP_AT]   # STOP_AT "epoch:batch": SIGTERM to itself there

Prints ``AUDIT <json>``: how many examples were trained on 0, 1, 2, ... times. Exits 143 when preempted.
"""
import tfgpu
import json
import sys

import keras
import numpy as np
import tensorflow as tf

import helpers  # tests/training/fit/helpers.py, beside this script

NUM_EXAMPLES = 203  # not a multiple of the batch: the last batch of an epoch is partial
model_dir, epochs = sys.argv[1], int(sys.argv[2])
stop_at = sys.argv[3] if len(sys.argv) > 3 else ""
keras.utils.set_random_seed(0)
x = np.concatenate([np.arange(NUM_EXAMPLES)[:, None], np.random.rand(NUM_EXAMPLES, 3)], 1).astype("float32")
y = (x[:, 1] > 0.5).astype("float32")


class Counting(keras.Model):
    def __init__(self):
        super().__init__()
        self.dense = keras.layers.Dense(1)
        # each replica adds its own examples; read as the sum over replicas and workers (as Keras' metrics are)
        self.counts = keras.Variable(np.zeros(NUM_EXAMPLES, "float32"), trainable=False, aggregation="sum",
                                     synchronization="on_read", name="counts")

    def call(self, inputs):
        return self.dense(inputs[:, 1:])

    def train_step(self, data):
        inputs, targets = data
        ids = tf.cast(inputs[:, 0], tf.int32)
        self.counts.assign_add(tf.scatter_nd(ids[:, None], tf.ones_like(ids, tf.float32), [NUM_EXAMPLES]))
        return super().train_step(data)


model = Counting()
model.compile(optimizer="sgd", loss=keras.losses.BinaryCrossentropy(from_logits=True))
try:
    tfgpu.fit(model, x, y, batch_size=16, epochs=epochs, verbose=0,
              callbacks=[helpers.sigterm_at(stop_at)] if stop_at else None, model_dir=model_dir)
except tfgpu.Preempted:
    sys.exit(143)
counts = np.asarray(tf.convert_to_tensor(model.counts)).astype(int)
print("AUDIT " + json.dumps({int(k): int(v) for k, v in zip(*np.unique(counts, return_counts=True))}), flush=True)
