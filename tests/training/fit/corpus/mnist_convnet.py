"""Simple MNIST convnet, after keras-io examples/vision/mnist_convnet.py.

The example's pattern: numpy image arrays scaled to [0, 1], one-hot labels, a small Sequential convnet (two
Conv2D + MaxPooling2D, Flatten, Dropout, softmax), categorical cross-entropy, ``fit`` with ``validation_split``,
then ``evaluate`` on the test arrays.

Data instead of MNIST (no downloads): scikit-learn's bundled 8x8 digits (1797 images, values 0..16), split
1500 train / 297 test by a seeded permutation. Cuts: filters 32/64 -> 16/32 and padding "same" (8x8 images),
15 epochs -> 8, batch 128 -> 32.

Tolerance: the test accuracy of ``evaluate`` after fit within 0.06. A run that trains the same model on the same
data in another order or on two replicas lands within a few hundredths of this (~0.9); one that does not train,
trains on the validation part, or loses an epoch's updates falls short by more.
"""
import keras
import numpy as np
from keras import layers
from sklearn.datasets import load_digits

import corpus_report

keras.utils.set_random_seed(0)

TOLERANCE = {"key": "test_accuracy", "abs": 0.06}

num_classes = 10
input_shape = (8, 8, 1)

digits = load_digits()
images = (digits.images.astype("float32") / 16.0)[..., None]
order = np.random.RandomState(0).permutation(len(images))
x_train, y_train = images[order[:1500]], digits.target[order[:1500]]
x_test, y_test = images[order[1500:]], digits.target[order[1500:]]
print("x_train shape:", x_train.shape, "-", x_test.shape[0], "test samples")

y_train = keras.utils.to_categorical(y_train, num_classes)
y_test = keras.utils.to_categorical(y_test, num_classes)

model = keras.Sequential(
    [
        keras.Input(shape=input_shape),
        layers.Conv2D(16, kernel_size=(3, 3), activation="relu", padding="same"),
        layers.MaxPooling2D(pool_size=(2, 2)),
        layers.Conv2D(32, kernel_size=(3, 3), activation="relu", padding="same"),
        layers.MaxPooling2D(pool_size=(2, 2)),
        layers.Flatten(),
        layers.Dropout(0.5),
        layers.Dense(num_classes, activation="softmax"),
    ]
)
model.summary()

batch_size = 32
epochs = 8

model.compile(loss="categorical_crossentropy", optimizer="adam", metrics=["accuracy"])
history = model.fit(x_train, y_train, batch_size=batch_size, epochs=epochs, validation_split=0.1)

score = model.evaluate(x_test, y_test, verbose=0, return_dict=True)
print("Test loss:", score["loss"], "Test accuracy:", score["accuracy"])
corpus_report.report(history, model, {
    "test_loss": score["loss"],
    "test_accuracy": score["accuracy"],
    "predict_shape": model.predict(x_test[:8], verbose=0).shape,
})
