"""tfgpu.fit as keras.Model.fit: the user's compiled model object trained as compile() says and given its trained
weights back, Keras' History keys, callbacks on the loop, and Keras' refusals in one line before any work. Tiny
models on 8x8 digits; the scripts compared with plain Keras on one and two workers are examples/from_model_fit."""
import os

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfgpu
from tfgpu.data import builtin
from tfgpu.training import fit as fit_lib
from tfgpu.training import exporting, run_dir


@pytest.fixture(scope="module")
def digits():
    """96 uint8 8x8x1 digits and their labels."""
    x, y = builtin.load_builtin("digits")["splits"]["train"]
    return x[:96], y[:96].astype("int64")


def small_model(compile_with=None, name="small"):
    keras.utils.set_random_seed(1)
    model = keras.Sequential([keras.Input((8, 8, 1)), keras.layers.Rescaling(1 / 255), keras.layers.Flatten(),
                              keras.layers.Dense(16, activation="relu"), keras.layers.Dense(10, activation="softmax")],
                             name=name)
    if compile_with is not None:
        model.compile(**compile_with)
    return model


class Batches(keras.utils.PyDataset):
    """Arrays in batches of 16, as a PyDataset."""

    def __init__(self, x, y, **kwargs):
        super().__init__(**kwargs)
        self.x, self.y = x, y

    def __len__(self):
        return -(-len(self.x) // 16)

    def __getitem__(self, i):
        return self.x[16 * i:16 * (i + 1)], self.y[16 * i:16 * (i + 1)]


QUICK = dict(verbose=0, steps_per_loop=2, tensorboard=False)


def test_a_compiled_model_object_trains_as_compiled_and_holds_the_trained_weights_after(digits, fit_in_tmp_path,
                                                                                         capsys):
    """Adam as compiled (its moments in the checkpoint, its state back in model.optimizer), Keras' History keys
    (equal to plain model.fit's for the same script), the last fraction validating, and model.evaluate on that
    fraction afterwards giving the run's last val_loss: the user's object holds the trained weights."""
    x, y = digits
    compiled = dict(optimizer=keras.optimizers.Adam(0.01), loss="sparse_categorical_crossentropy",
                    metrics=["accuracy"])
    keras_model = small_model(compiled, "plain")
    plain = keras_model.fit(x, y, batch_size=16, epochs=2, validation_split=0.25, verbose=0)
    model = small_model(compiled)
    before = [w.copy() for w in model.get_weights()]
    history = tfgpu.fit(model, x, y, batch_size=16, epochs=2, validation_split=0.25, **QUICK)
    assert isinstance(history, keras.callbacks.History) and model.history is history
    assert history.history.keys() == plain.history.keys() == {"loss", "accuracy", "val_loss", "val_accuracy"}
    assert history.epoch == [0, 1] and all(len(v) == 2 for v in history.history.values())
    out = capsys.readouterr().out
    assert out.startswith(f"tfgpu.fit: run directory {history.model_dir}\n") and history.model_dir.startswith(
        "tfgpu_runs" + os.sep)
    # 72 train examples: the epochs end at steps 5 and 9
    assert history.results["val_examples"] == 24 and history.results["step"] == 9
    loss, accuracy = model.evaluate(x[72:], y[72:], verbose=0)
    assert loss == pytest.approx(history.history["val_loss"][-1], abs=1e-4)
    assert accuracy == pytest.approx(history.history["val_accuracy"][-1], abs=1e-6)
    assert not all(np.array_equal(a, b) for a, b in zip(before, model.get_weights()))
    assert int(model.optimizer.iterations.numpy()) == 9
    reader = tf.train.load_checkpoint(tf.train.latest_checkpoint(run_dir.checkpoints(history.model_dir)))
    saved = [reader.get_tensor(name) for name in reader.get_variable_to_shape_map()]
    moments = [v for v in model.optimizer.variables if "momentum" in v.path or "velocity" in v.path]
    assert len(moments) == 2 * len(model.trainable_variables)  # Adam's, copied back from the run
    for moment in moments:  # each is in the checkpoint, and not zero: trained
        assert np.any(moment.numpy()) and any(np.array_equal(moment.numpy(), a) for a in saved), moment.path


def test_sgd_at_learning_rate_zero_moves_no_weight_and_class_weight_counts(digits, fit_in_tmp_path):
    """compile() is the truth: SGD(0.0) leaves every weight where it was (tfgpu's default SGD would move them);
    class_weight 0 for every class makes the train loss 0."""
    x, y = digits
    model = small_model(dict(optimizer=keras.optimizers.SGD(0.0), loss="sparse_categorical_crossentropy"))
    before = model.get_weights()
    history = tfgpu.fit(model, x, y, batch_size=32, epochs=2, class_weight={c: 0.0 for c in range(10)},
                        validation_split=1 / 3, validation_freq=2, model_dir="run", **QUICK)
    for a, b in zip(before, model.get_weights()):
        np.testing.assert_array_equal(a, b)
    assert history.history["loss"] == [0.0, 0.0] and len(history.history["val_loss"]) == 1  # the 2nd epoch's
    assert set(history.history) == {"loss", "val_loss"}  # no metrics compiled: Keras' keys


def test_a_model_object_trains_under_the_runs_precision(digits, fit_in_tmp_path):
    """precision="mixed_bfloat16": the rebuilt model computes in bfloat16 (its variables float32), and the user's
    float32 model gets the trained weights."""
    x, y = digits
    model = small_model(dict(optimizer="adam", loss="sparse_categorical_crossentropy"))
    history = tfgpu.fit(model, x, y, epochs=1, precision="mixed_bfloat16", **QUICK)
    built = fit_lib._RUNS[history.results["model"]].built
    assert built.layers[-1].compute_dtype == "bfloat16" and built.layers[-1].kernel.dtype == "float32"
    assert model.layers[-1].compute_dtype == "float32"
    np.testing.assert_array_equal(model.get_weights()[0], built.get_weights()[0])


def test_a_builder_in_either_signature_trains_compiled_or_with_tfgpus_defaults(digits, fit_in_tmp_path, capsys):
    x, y = digits

    def command_line_builder(input_shape, num_classes):
        inputs = keras.Input(input_shape)
        model = keras.Model(inputs, keras.layers.Dense(num_classes)(keras.layers.Flatten()(inputs)))
        model.compile(optimizer=keras.optimizers.SGD(0.0),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["acc"])
        return model

    history = tfgpu.fit(command_line_builder, x, y, epochs=1, validation_data=(x[:16], y[:16]), **QUICK)
    assert set(history.history) == {"loss", "acc", "val_loss", "val_acc"}
    assert "compile(): optimizer=SGD(learning_rate=0)" in capsys.readouterr().err
    assert history.results["step"] == 3 and history.results["learning_rate"] == 0.0  # batch_size: Keras' 32
    defaults = tfgpu.fit(lambda: small_model(), Batches(x, y), epochs=1, **QUICK)  # a PyDataset: its batch of 16
    assert defaults.results["step"] == 6 and defaults.model is not None
    assert "the model is not compiled: tfgpu's defaults train it (optimizer=sgd" in capsys.readouterr().err


def test_callbacks_see_keras_logs_and_act_on_the_run(digits, fit_in_tmp_path, tmp_path):
    """EarlyStopping stops the run (restoring the best weights), LearningRateScheduler sets the optimizer's rate
    each epoch, LambdaCallback and a user's Callback get Keras' epoch logs, CSVLogger and ModelCheckpoint write
    their files, BackupAndRestore's directory becomes the run directory."""
    x, y = digits
    seen = []

    class Recorder(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            seen.append((epoch, sorted(logs), float(self.model.optimizer.learning_rate.numpy())))

    epochs = []
    callbacks = [
        keras.callbacks.LearningRateScheduler(lambda epoch, lr: 0.01 * (epoch + 1)),
        Recorder(),
        keras.callbacks.LambdaCallback(on_epoch_end=lambda epoch, logs: epochs.append(epoch)),
        keras.callbacks.EarlyStopping(monitor="val_loss", min_delta=100.0, patience=1, restore_best_weights=True),
        keras.callbacks.CSVLogger(str(tmp_path / "log.csv")),
        keras.callbacks.ModelCheckpoint(str(tmp_path / "best.keras")),
        keras.callbacks.BackupAndRestore(str(tmp_path / "backup")),
        keras.callbacks.TerminateOnNaN(),
        keras.callbacks.TensorBoard(str(tmp_path / "tb"), write_graph=False),
    ]
    model = small_model(dict(optimizer=keras.optimizers.SGD(0.1), loss="sparse_categorical_crossentropy",
                             metrics=["accuracy"]))
    history = tfgpu.fit(model, x, y, batch_size=16, epochs=5, validation_split=0.25, callbacks=callbacks, **QUICK)
    assert epochs == [0, 1] and history.epoch == [0, 1]  # stopped after patience=1 epoch without improvement
    assert [(e, lr) for e, _, lr in seen] == [(0, pytest.approx(0.01)), (1, pytest.approx(0.02))]
    assert seen[0][1] == ["accuracy", "learning_rate", "loss", "val_accuracy", "val_loss"]
    assert float(model.optimizer.learning_rate.numpy()) == pytest.approx(0.02)
    assert history.model_dir == str(tmp_path / "backup") and (tmp_path / "backup" / run_dir.CHECKPOINTS_DIR).is_dir()
    assert len((tmp_path / "log.csv").read_text().splitlines()) == 3
    assert sorted(os.listdir(tmp_path / "tb")) == ["train", "validation"]
    assert keras.saving.load_model(tmp_path / "best.keras").count_params() == model.count_params()
    loss, _ = model.evaluate(x[72:], y[72:], verbose=0)  # the best epoch's weights: the first
    assert loss == pytest.approx(history.history["val_loss"][0], abs=1e-4)


@pytest.mark.parametrize("call, argument, message", [
    (lambda m, x, y: tfgpu.fit(m, tf.data.Dataset.from_tensor_slices((x, y)), validation_split=0.2),
     "validation_split", "is only supported for Tensors or NumPy arrays"),
    (lambda m, x, y: tfgpu.fit(m, x, y, batch_size=32, global_batch_size=64), "batch_size",
     "give either batch_size or global_batch_size"),
    (lambda m, x, y: tfgpu.fit(m, x, y, learning_rate=0.1), "learning_rate", "is compile()'s: model.compile("),
    (lambda m, x, y: tfgpu.fit(m, x, y, batchsize=32), "batchsize", "did you mean batch_size"),
    (lambda m, x, y: tfgpu.fit(m, x, y, sample_weight=np.ones(len(y) - 1)), "sample_weight",
     "weights of shape (95,) for 96 examples"),
    (lambda m, x, y: tfgpu.fit(m, x, y, sample_weight=-np.ones(len(y))), "sample_weight", "must be finite and >= 0"),
    (lambda m, x, y: tfgpu.fit(m, tf.data.Dataset.from_tensor_slices((x, y)), sample_weight=np.ones(len(y))),
     "sample_weight", "give its elements as (image, label, sample_weight)"),
    (lambda m, x, y: tfgpu.fit(m, x, y, shuffle="batch"), "shuffle", "True (shuffled every epoch"),
    (lambda m, x, y: tfgpu.fit(m, x), "y", "pass their labels as y"),
    (lambda m, x, y: tfgpu.fit(m, x, y, epochs=0), "epochs", "positive integer"),
    (lambda m, x, y: tfgpu.fit(m, x, y, callbacks=[keras.callbacks.ProgbarLogger()]), "callbacks", "ProgbarLogger"),
    (lambda m, x, y: tfgpu.fit(m, x[:, :, :, 0].reshape(len(x), -1), y), "x", "image classifiers"),
    (lambda m, x, y: tfgpu.fit(m, Batches(x, y, workers=4)), "x", "a PyDataset with workers=4"),
    (lambda m, x, y: tfgpu.fit(m, x, y, input_range=(1, 0)), "input_range", "MIN < MAX"),
])
def test_arguments_keras_refuses_or_tfgpu_cannot_honour_are_one_line_before_any_work(call, argument, message,
                                                                                     digits, fit_in_tmp_path, tmp_path):
    x, y = digits
    with pytest.raises(tfgpu.ConfigError) as e:
        call(small_model(), x, y)
    assert e.value.flag == argument and str(e.value).startswith(f"tfgpu.fit: {argument}: ") and \
        message in str(e.value), str(e.value)
    assert os.listdir(tmp_path) == []


def test_with_model_dir_a_second_call_resumes_at_the_epoch_the_first_ended(digits, fit_in_tmp_path):
    """epochs=1 then epochs=2 into the same model_dir: the second call trains epoch 1 only, from the checkpoint
    (its History holds that epoch), on the data the first wrote."""
    x, y = digits
    model = small_model(dict(optimizer="adam", loss="sparse_categorical_crossentropy"))
    first = tfgpu.fit(model, x, y, batch_size=32, epochs=1, model_dir="run", **QUICK)
    second = tfgpu.fit(model, x, y, batch_size=32, epochs=2, model_dir="run", **QUICK)
    assert (first.results["step"], second.results["step"]) == (3, 6) and second.epoch == [1]
    assert int(model.optimizer.iterations.numpy()) == 6


def test_a_callback_stopping_inside_an_epoch_stops_the_run_at_that_loop(digits, fit_in_tmp_path):
    """model.stop_training set in on_train_batch_end ends the run at the end of that loop (steps_per_loop steps),
    and the epoch ends with what it trained, as in Keras."""
    x, y = digits

    class StopAtFirstBatch(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            self.model.stop_training = True

    model = small_model(dict(optimizer="sgd", loss="sparse_categorical_crossentropy"))
    history = tfgpu.fit(model, x, y, batch_size=16, epochs=3, callbacks=[StopAtFirstBatch()], **QUICK)
    assert history.results["step"] == 2 and history.epoch == [0] and list(history.history) == ["loss"]


def test_refused_compile_choices_and_models_are_named(digits, fit_in_tmp_path, tmp_path):
    x, y = digits
    cases = [
        (dict(optimizer="adam", loss="binary_focal_crossentropy"), "loss binary_focal_crossentropy"),
        (dict(optimizer="adam", loss="sparse_categorical_crossentropy", metrics=[keras.metrics.R2Score()]),
         "metric 'r2_score'"),
        (dict(optimizer=keras.optimizers.Adam(gradient_accumulation_steps=2), loss="sparse_categorical_crossentropy"),
         r"Adam\(gradient_accumulation_steps=2\)"),
    ]
    for compiled, message in cases:
        with pytest.raises(tfgpu.ConfigError, match=f"tfgpu.fit: model: compiled with {message}"):
            tfgpu.fit(small_model(compiled), x, y)

    class Unrebuildable(keras.Model):
        def __init__(self, width):
            super().__init__()
            self.dense = keras.layers.Dense(width)

        def call(self, inputs):
            return self.dense(keras.ops.reshape(inputs, (-1, 64)))

    subclassed = Unrebuildable(10)
    subclassed(np.zeros((1, 8, 8, 1), "float32"))
    with pytest.raises(tfgpu.ConfigError, match="model: Unrebuildable is a subclassed model that cannot be rebuilt "
                                                ".*pass a function that builds and compiles it"):
        tfgpu.fit(subclassed, x, y)
    assert os.listdir(tmp_path) == []


def test_errors_from_inside_the_run_speak_python_arguments(digits, fit_in_tmp_path):
    """The input-range advice raised when the model is built reads input_range=(0, 255), not a flag."""
    x, y = digits
    with pytest.raises(tfgpu.ConfigError) as e:
        tfgpu.fit(small_model(), x, y, input_range=(-1, 1), **QUICK)
    assert e.value.flag == "input_range" and str(e.value).endswith("set input_range=(0, 255)"), str(e.value)


def binary_model(name, from_logits=False, activation="sigmoid"):
    keras.utils.set_random_seed(1)
    model = keras.Sequential([keras.Input((8, 8, 1)), keras.layers.Rescaling(1 / 255), keras.layers.Flatten(),
                              keras.layers.Dense(16, activation="relu"),
                              keras.layers.Dense(1, activation=None if from_logits else activation)], name=name)
    model.compile(optimizer=keras.optimizers.SGD(0.5),
                  loss=keras.losses.BinaryCrossentropy(from_logits=from_logits, label_smoothing=0.1),
                  metrics=["accuracy", keras.metrics.AUC(name="auc"), keras.metrics.Precision(name="precision")])
    return model


@pytest.mark.parametrize("from_logits", [False, pytest.param(True, marks=pytest.mark.slow)])
def test_binary_crossentropy_in_order_trains_as_plain_keras_on_two_replicas(from_logits, digits, fit_in_tmp_path):
    """A sigmoid unit (or a logit) compiled with binary_crossentropy on float 0/1 labels, shuffle=False: every
    epoch's loss, Keras' binary "accuracy", AUC and precision and their val_ equal plain model.fit's on one device,
    trained on 2 replicas batch for batch in the same order (SGD moves the weights)."""
    x, y = digits
    labels = (y % 2).astype("float32")
    plain = binary_model("plain", from_logits).fit(x, labels, batch_size=16, epochs=2, validation_split=1 / 3,
                                                   shuffle=False, verbose=0)
    history = tfgpu.fit(binary_model("mine", from_logits), x, labels, batch_size=16, epochs=2, validation_split=1 / 3,
                        shuffle=False, cpu_logical_devices=2, distribution_strategy="mirrored", **QUICK)
    assert history.history.keys() == plain.history.keys()
    for key, values in plain.history.items():
        assert history.history[key] == pytest.approx(values, abs=1e-5), key
    assert history.results["model_output"] == ("logits" if from_logits else "probabilities")
    described = exporting.read_description(exporting.description_path(run_dir.exported_model(history.model_dir)))
    assert described["output"]["shape"] == [None, 1] and "class 1" in described["output"]["meaning"]


def test_binary_crossentropy_refuses_a_softmax_head_and_more_than_two_classes(digits, fit_in_tmp_path, tmp_path):
    x, y = digits
    with pytest.raises(tfgpu.ConfigError, match="ends in a softmax .* compiled with binary_crossentropy"):
        tfgpu.fit(binary_model("soft", activation="softmax"), x, (y % 2).astype("float32"), **QUICK)
    with pytest.raises(tfgpu.ConfigError, match="binary_crossentropy, but the labels hold 10 classes"):
        tfgpu.fit(binary_model("ten"), x, y, **QUICK)
