"""A model with several inputs and outputs, after keras-io guides/functional_api.py ("Models with multiple inputs
and outputs": the issue-ticket ranker).

The guide's pattern: three named inputs (title and body as int token ids, tags as a binary vector), a shared-width
Embedding per text input, LSTMs, a concatenation, two named outputs (priority: one logit; department: one logit
per department), compiled with a loss dict and ``loss_weights`` dict keyed by output name, and fit on dicts:
``fit({"title": ..., "body": ..., "tags": ...}, {"priority": ..., "department": ...})``.

Data instead of the guide's random arrays (no downloads): seeded synthetic tickets whose targets depend on the
inputs, so the loss can fall: the department is the last title token's residue mod 4, the priority is 1 when
more than half of the first six tags are set. 1600 tickets, 1280 train / 320 validation. Cuts: vocabulary 10000
-> 100, embeddings 64 -> 16, LSTM 128/32 -> 16/8, title 10 tokens, body 20 tokens, 12 tags, 2 epochs -> 8.

Tolerance: the department accuracy on the validation dict after fit within 0.08 (it reaches ~0.9 here; chance is
0.25), and the weighted validation loss of the last epoch within 20% relative (a port that drops
``loss_weights`` or a loss of the dict moves it further).
"""
import keras
import numpy as np
from keras import layers

import corpus_report

keras.utils.set_random_seed(0)

TOLERANCE = [{"key": "department_accuracy", "abs": 0.08}, {"key": "val_loss", "rel": 0.20}]

num_tags = 12
num_words = 100
num_departments = 4

title_input = keras.Input(shape=(None,), name="title")
body_input = keras.Input(shape=(None,), name="body")
tags_input = keras.Input(shape=(num_tags,), name="tags")

title_features = layers.Embedding(num_words, 16)(title_input)
body_features = layers.Embedding(num_words, 16)(body_input)
title_features = layers.LSTM(16)(title_features)
body_features = layers.LSTM(8)(body_features)

x = layers.concatenate([title_features, body_features, tags_input])
priority_pred = layers.Dense(1, name="priority")(x)
department_pred = layers.Dense(num_departments, name="department")(x)

model = keras.Model(
    inputs=[title_input, body_input, tags_input],
    outputs={"priority": priority_pred, "department": department_pred},
)

model.compile(
    optimizer=keras.optimizers.RMSprop(1e-2),
    loss={
        "priority": keras.losses.BinaryCrossentropy(from_logits=True),
        "department": keras.losses.CategoricalCrossentropy(from_logits=True),
    },
    loss_weights={"priority": 1.0, "department": 0.2},
)

rng = np.random.RandomState(0)
n = 1600
title_data = rng.randint(num_words, size=(n, 10))
body_data = rng.randint(num_words, size=(n, 20))
tags_data = rng.randint(2, size=(n, num_tags)).astype("float32")
priority_targets = (tags_data[:, :6].sum(axis=1) > 3).astype("float32")[:, None]
dept_targets = keras.utils.to_categorical(title_data[:, -1] % num_departments, num_departments)

train, val = slice(0, 1280), slice(1280, n)
val_inputs = {"title": title_data[val], "body": body_data[val], "tags": tags_data[val]}
val_targets = {"priority": priority_targets[val], "department": dept_targets[val]}

history = model.fit(
    {"title": title_data[train], "body": body_data[train], "tags": tags_data[train]},
    {"priority": priority_targets[train], "department": dept_targets[train]},
    epochs=8,
    batch_size=32,
    validation_data=(val_inputs, val_targets),
)

predictions = model.predict(val_inputs, verbose=0)
corpus_report.report(history, model, {
    "department_accuracy": float(np.mean(np.argmax(predictions["department"], -1) == np.argmax(dept_targets[val], -1))),
    "priority_accuracy": float(np.mean((predictions["priority"] > 0) == (priority_targets[val] > 0.5))),
    "output_shapes": {name: value.shape for name, value in predictions.items()},
    "val_loss_evaluate": model.evaluate(val_inputs, val_targets, verbose=0, return_dict=True)["loss"],
})
