"""Class weights on tabular data, after keras-io examples/structured_data/imbalanced_classification.py.

The example's pattern: a numeric table with a rare positive class, the last 20% held out for validation, features
normalized by the training part's mean and standard deviation, an MLP (three Dense 256, Dropout 0.3 after the last two,
a sigmoid), counting metrics (FalseNegatives, FalsePositives, TrueNegatives, TruePositives, Precision, Recall),
Adam(1e-2), and ``fit(..., validation_data=(val_features, val_targets), class_weight={0: 1/count_0, 1: 1/count_1})``.

Data instead of the credit-card fraud CSV (no downloads): scikit-learn's bundled breast-cancer table (569 rows,
30 features; the minority class, malignant, made the positive class: 212 of 569). Cuts: Dense 256 -> 64,
30 epochs -> 10, batch 2048 -> 64 (the table is small).

Tolerance: three checks. The validation recall of the last epoch within 0.08 (the class weights exist to raise
it; ~1.0 here, a missed case is 0.02 of 45 positives) and the validation accuracy after fit within 0.05 (~0.99
here; an untrained model scores ~0.4-0.6). Both hold for an unweighted run too on this easy table, so the third
check is on where the weights act: the weighted training loss of the last epoch (~1e-4, since each weight is
1/count ~ 1/300) within rel 3.0, i.e. at most 4x plain Keras'. It varies ~2x between seeds; a port that drops
``class_weight`` reports an unweighted loss ~100x larger.
"""
import keras
import numpy as np
from sklearn.datasets import load_breast_cancer

import corpus_report

keras.utils.set_random_seed(0)

TOLERANCE = [
    {"key": "val_recall", "abs": 0.08},
    {"key": "val_accuracy", "abs": 0.05},
    {"key": "loss", "rel": 3.0},
]

table = load_breast_cancer()
order = np.random.RandomState(0).permutation(len(table.target))
features = table.data[order].astype("float32")
targets = (table.target[order] == 0).astype("float32")[:, None]  # malignant (the rarer class) = 1
print("features.shape:", features.shape)
print("targets.shape:", targets.shape)

num_val_samples = int(len(features) * 0.2)
train_features = features[:-num_val_samples]
train_targets = targets[:-num_val_samples]
val_features = features[-num_val_samples:]
val_targets = targets[-num_val_samples:]

counts = np.bincount(train_targets[:, 0].astype("int64"))
print(
    "Number of positive samples in training data: {} ({:.2f}% of total)".format(
        counts[1], 100 * float(counts[1]) / len(train_targets)
    )
)

mean = np.mean(train_features, axis=0)
train_features -= mean
val_features -= mean
std = np.std(train_features, axis=0)
train_features /= std
val_features /= std

model = keras.Sequential(
    [
        keras.Input(shape=train_features.shape[1:]),
        keras.layers.Dense(64, activation="relu"),
        keras.layers.Dense(64, activation="relu"),
        keras.layers.Dropout(0.3),
        keras.layers.Dense(64, activation="relu"),
        keras.layers.Dropout(0.3),
        keras.layers.Dense(1, activation="sigmoid"),
    ]
)

metrics = [
    keras.metrics.FalseNegatives(name="fn"),
    keras.metrics.FalsePositives(name="fp"),
    keras.metrics.TrueNegatives(name="tn"),
    keras.metrics.TruePositives(name="tp"),
    keras.metrics.Precision(name="precision"),
    keras.metrics.Recall(name="recall"),
]

model.compile(optimizer=keras.optimizers.Adam(1e-2), loss="binary_crossentropy", metrics=metrics)

weight_for_0 = 1.0 / counts[0]
weight_for_1 = 1.0 / counts[1]
class_weight = {0: weight_for_0, 1: weight_for_1}

history = model.fit(
    train_features,
    train_targets,
    batch_size=64,
    epochs=10,
    verbose=2,
    validation_data=(val_features, val_targets),
    class_weight=class_weight,
)

predicted = model.predict(val_features, verbose=0)[:, 0] > 0.5
score = model.evaluate(val_features, val_targets, verbose=0, return_dict=True)
corpus_report.report(history, model, {
    "val_accuracy": float(np.mean(predicted == (val_targets[:, 0] > 0.5))),
    "val_fn": score["fn"],
    "val_cases": score["fn"] + score["fp"] + score["tn"] + score["tp"],
    "recall_metric_result": metrics[5].result(),
})
