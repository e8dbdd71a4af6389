"""Per-sample weights on tabular data, after keras-io guides/training_with_built_in_methods.py ("Using sample
weighting and class weighting": a ``sample_weight`` array that counts one class twice, passed to ``fit``).

The guide's pattern: a functional MLP with named layers, ``SparseCategoricalCrossentropy`` and
``SparseCategoricalAccuracy``, RMSprop, ``sample_weight = np.ones(...); sample_weight[y_train == 5] = 2.0`` given
to ``fit`` beside ``x`` and ``y``, a validation set, then ``evaluate`` on the test arrays.

Data instead of MNIST (no downloads): a seeded synthetic table from scikit-learn's ``make_classification``
(2400 rows, 20 features of which 8 informative, 4 classes, no download), 2000 train / 400 test. The weighted class
is class 2 (the guide's digit 5). Cuts: Dense 64 -> 32, 1 epoch -> 8, batch 64 -> 32.

Tolerance: the weighted training loss of the last epoch within 15% relative of plain Keras (the loss is where
the weights act: a port that ignores them reports a visibly different value), and the test accuracy after fit
within 0.06 (reported in after_fit, checked as well).
"""
import keras
import numpy as np
from keras import layers
from sklearn.datasets import make_classification

import corpus_report

keras.utils.set_random_seed(0)

TOLERANCE = [{"key": "loss", "rel": 0.15}, {"key": "test_accuracy", "abs": 0.06}]

features, labels = make_classification(
    n_samples=2400, n_features=20, n_informative=8, n_redundant=4, n_classes=4,
    n_clusters_per_class=1, class_sep=1.2, random_state=0,
)
x_train, y_train = features[:2000].astype("float32"), labels[:2000]
x_test, y_test = features[2000:].astype("float32"), labels[2000:]
x_val, y_val = x_train[-300:], y_train[-300:]
x_train, y_train = x_train[:-300], y_train[:-300]

inputs = keras.Input(shape=(20,), name="features")
x = layers.Dense(32, activation="relu", name="dense_1")(inputs)
x = layers.Dense(32, activation="relu", name="dense_2")(x)
outputs = layers.Dense(4, activation="softmax", name="predictions")(x)
model = keras.Model(inputs=inputs, outputs=outputs)

model.compile(
    optimizer=keras.optimizers.RMSprop(learning_rate=1e-3),
    loss=keras.losses.SparseCategoricalCrossentropy(),
    metrics=[keras.metrics.SparseCategoricalAccuracy(name="acc")],
)

sample_weight = np.ones(shape=(len(y_train),))
sample_weight[y_train == 2] = 2.0

print("Fit with sample weight")
history = model.fit(
    x_train, y_train, sample_weight=sample_weight, batch_size=32, epochs=8,
    validation_data=(x_val, y_val),
)

score = model.evaluate(x_test, y_test, verbose=0, return_dict=True)
predicted = np.argmax(model.predict(x_test, verbose=0), axis=-1)
corpus_report.report(history, model, {
    "test_accuracy": score["acc"],
    "test_loss": score["loss"],
    "test_recall_weighted_class": float(np.mean(predicted[y_test == 2] == 2)),
})
