"""A plain Keras script ported by the two edits, for tests/training/fit/test_run.py: a small classifier on the
digits as numpy arrays, with a Dataset and a metric of the script's own made before fit and used after it.

    python fit_script.py MODEL_DIR [STOP_AT]   # STOP_AT: "epoch:batch[@worker]": there the script (only worker
                                               # ``worker``'s, with @) sends itself SIGTERM

Prints one line ``RESULT <json>``: the history, a sha256 of the trained weights (and one of the weights after every
loop: its callback acts on every batch, so a loop is one step), the optimizer's iterations and what the script's own
objects gave after fit. Exits 143 when tfgpu.fit raised Preempted.
"""
import tfgpu
import hashlib
import json
import os
import signal
import sys

import keras
import numpy as np
import tensorflow as tf
from sklearn.datasets import load_digits

model_dir, stop_at = sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else ""
if "@" in stop_at:
    stop_at, only = stop_at.split("@")
    stop_at = stop_at if json.loads(os.environ.get("TF_CONFIG", "{}")).get("task", {}).get("index") == int(only) else ""
keras.utils.set_random_seed(0)
digits = load_digits()
x, y = (digits.images[..., None] / 16.0).astype("float32"), digits.target
held_out = tf.data.Dataset.from_tensor_slices((x[:200], y[:200])).batch(50)
seen = keras.metrics.Mean(name="seen")  # the script's own Keras object, made before fit, updated by its callback
batches = []


class SigtermAt(keras.callbacks.Callback):
    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_end(self, batch, logs=None):
        seen.update_state(1.0)
        batches.append(hashlib.sha256(b"".join(np.asarray(v.numpy()).tobytes() for v in model.weights)).digest())
        if stop_at and f"{self.epoch}:{batch}" == stop_at:
            os.kill(os.getpid(), signal.SIGTERM)


model = keras.Sequential([keras.Input((8, 8, 1)), keras.layers.Flatten(), keras.layers.Dense(32, activation="relu"),
                          keras.layers.Dense(10)])
model.compile(optimizer=keras.optimizers.Adam(1e-3), metrics=["accuracy"],
              loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
try:
    history = tfgpu.fit(model, x, y, batch_size=64, epochs=3, validation_split=0.2, verbose=0,
                        callbacks=[SigtermAt()], model_dir=model_dir)
except tfgpu.Preempted:
    sys.exit(143)
weights = b"".join(np.asarray(v.numpy()).tobytes() for v in model.weights)
result = {"history": {k: v[-1] for k, v in history.history.items()}, "epochs": history.epoch,
          "weights": [float(np.sum(np.asarray(v.numpy(), np.float64))) for v in model.weights],
          "sha256": hashlib.sha256(weights).hexdigest(), "iterations": int(model.optimizer.iterations.numpy()),
          "evaluate": model.evaluate(held_out, verbose=0, return_dict=True),
          "held_out_examples": sum(int(b[0].shape[0]) for b in held_out), "seen": float(seen.result().numpy()), "batches": len(batches),
          "loop_digests": hashlib.sha256(b"".join(batches)).hexdigest()}
print("RESULT " + json.dumps(result), flush=True)
