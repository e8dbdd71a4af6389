"""Training from a Python generator, after keras-io guides/training_with_built_in_methods.py (``fit`` takes
"Python generators that yield batches of data", endless ones with ``steps_per_epoch``) in the model style of its
MNIST example (a functional MLP, RMSprop, sparse categorical cross-entropy and accuracy).

The pattern: a Python generator function that loops forever over the training arrays in a seeded random order,
yielding (features, labels) batches of numpy arrays; ``fit(generator(...), steps_per_epoch=..., epochs=...,
validation_data=(x_val, y_val))``; afterwards the same generator function serves ``predict`` on fresh batches.

Data instead of MNIST (no downloads): scikit-learn's bundled 8x8 digits flattened to 64 features, 1500 train /
297 validation by a seeded permutation. Cuts: Dense 64 -> 32, 1 epoch of 782 steps -> 6 epochs of 40 steps.

Tolerance: the validation accuracy of the last epoch within 0.06 (it reaches ~0.93 here from chance); another
batch order or a 2-replica run moves it a few hundredths; a port that reads the generator for the wrong number of
steps, or trains on the validation arrays, misses by more.
"""
import keras
import numpy as np
from keras import layers
from sklearn.datasets import load_digits

import corpus_report

keras.utils.set_random_seed(0)

TOLERANCE = {"key": "val_accuracy", "abs": 0.06}

digits = load_digits()
features = digits.data.astype("float32") / 16.0
order = np.random.RandomState(0).permutation(len(features))
x_train, y_train = features[order[:1500]], digits.target[order[:1500]]
x_val, y_val = features[order[1500:]], digits.target[order[1500:]]


def batches(x, y, batch_size, seed):
    """Endless (x, y) batches of the arrays in a new seeded order every pass."""
    rng = np.random.RandomState(seed)
    while True:
        order = rng.permutation(len(x))
        for start in range(0, len(x) - batch_size + 1, batch_size):
            index = order[start:start + batch_size]
            yield x[index], y[index]


inputs = keras.Input(shape=(64,), name="digits")
x = layers.Dense(32, activation="relu", name="dense_1")(inputs)
x = layers.Dense(32, activation="relu", name="dense_2")(x)
outputs = layers.Dense(10, activation="softmax", name="predictions")(x)
model = keras.Model(inputs=inputs, outputs=outputs)
model.compile(
    optimizer=keras.optimizers.RMSprop(learning_rate=3e-3),
    loss="sparse_categorical_crossentropy",
    metrics=["accuracy"],
)

history = model.fit(
    batches(x_train, y_train, batch_size=32, seed=1),
    steps_per_epoch=40,
    epochs=6,
    validation_data=(x_val, y_val),
)

fresh = batches(x_val, y_val, batch_size=32, seed=2)
x_batch, y_batch = next(fresh)
corpus_report.report(history, model, {
    "predict_shape": model.predict(x_batch, verbose=0).shape,
    "val_evaluate": model.evaluate(x_val, y_val, verbose=0, return_dict=True),
    "generator_batch_accuracy": float(np.mean(np.argmax(model.predict(x_batch, verbose=0), -1) == y_batch)),
})
