"""An exactly-once audit of a real ``tfgpu.fit`` run on ``tfgpu.data.load``, for tests/training/fit/test_records.py:
the records' 2x2 images carry their index (pixels 0 and 1: index mod 256 and index div 256); a model whose own
train_step records, per optimizer step, which records it trained on (a sum over every replica and worker).

    python records_audit_script.py DATA_DIR MODEL_DIR EPOCHS [STOP_AT]   # STOP_AT "epoch:batch": SIGTERM there

Prints ``AUDIT <json>``: ``steps``, the sorted record indices of every step's global batch, and ``weights``, the
trained kernel. Exits 143 when preempted.
"""
import tfgpu
import json
import sys

import keras
import numpy as np
import tensorflow as tf

import helpers  # tests/training/fit/helpers.py, beside this script

NUM_RECORDS, BATCH = 203, 16  # not a multiple of the batch: the last batch of an epoch is partial
data_dir, model_dir, epochs = sys.argv[1], sys.argv[2], int(sys.argv[3])
stop_at = sys.argv[4] if len(sys.argv) > 4 else ""
steps = epochs * -(-NUM_RECORDS // BATCH)
keras.utils.set_random_seed(0)


class Counting(keras.Model):
    def __init__(self):
        super().__init__()
        self.dense = keras.layers.Dense(10)
        # each replica adds its own records at the step's row; read as the sum over replicas and workers
        self.seen = keras.Variable(np.zeros((steps, NUM_RECORDS), "float32"), trainable=False, aggregation="sum",
                                   synchronization="on_read", name="seen")

    def call(self, images):
        return self.dense(tf.reshape(tf.cast(images, "float32") / 255.0, [-1, 4]))

    def train_step(self, data):
        images, labels = data
        ids = tf.cast(images[:, 0, 0, 0], tf.int32) + 256 * tf.cast(images[:, 0, 1, 0], tf.int32)
        step = tf.cast(self.optimizer.iterations, tf.int32)
        self.seen.assign_add(tf.scatter_nd(tf.stack([tf.fill(tf.shape(ids), step), ids], 1),
                                           tf.ones_like(ids, tf.float32), [steps, NUM_RECORDS]))
        return super().train_step(data)


model = Counting()
model.compile(optimizer="sgd", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
try:
    tfgpu.fit(model, tfgpu.data.load(data_dir, batch_size=BATCH, seed=5), epochs=epochs, verbose=0,
              callbacks=[helpers.sigterm_at(stop_at)] if stop_at else None, model_dir=model_dir, steps_per_loop=4)
except tfgpu.Preempted:
    sys.exit(143)
seen = np.asarray(tf.convert_to_tensor(model.seen)).astype(int)
print("AUDIT " + json.dumps({"steps": [np.repeat(np.arange(NUM_RECORDS), row).tolist() for row in seen],
                             "weights": np.asarray(model.dense.kernel.numpy(), np.float64).ravel().tolist()}),
      flush=True)
