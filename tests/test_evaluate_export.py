"""Commands around training: evaluate a checkpoint under any strategy; export a model that loads without tfgpu."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from tests.conftest import REPO, read_history, train_in_process

RUN = ["--dataset=digits", "--model=small_cnn", "--global_batch_size=32", "--train_steps=30", "--steps_per_loop=10",
       "--precision=mixed_bfloat16", "--base_learning_rate=0.8", "--input_range=0,1"]


@pytest.fixture(scope="module")
def trained(tmp_path_factory, data_cache):
    """A finished run (trained in this process) and the environment for the commands run on it."""
    model_dir = tmp_path_factory.mktemp("run")
    assert train_in_process([*RUN, f"--model_dir={model_dir}"], data_cache) == 0
    return model_dir, {**os.environ, "TFGPU_DATA_CACHE": data_cache, "TF_CPP_MIN_LOG_LEVEL": "2"}


def _tool(name, args, env, check=True):
    proc = subprocess.run([sys.executable, "-m", f"tfgpu.{name}", *args], cwd=REPO, env=env, text=True,
                          capture_output=True, timeout=300)
    if check:
        assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def test_evaluate_reproduces_the_runs_final_eval_under_another_strategy(trained):
    """Also in the run's --input_range (0,1 here), read back from its config.yaml."""
    from tfgpu.evaluate import parser
    from tfgpu.training.restore import run_config

    model_dir, env = trained
    assert run_config(str(model_dir), parser().parse_args([f"--model_dir={model_dir}"])).input_range == (0.0, 1.0)
    final = read_history(model_dir, "eval")[-1]
    out = os.path.join(model_dir, "eval-two-replicas.json")
    _tool("evaluate", [f"--model_dir={model_dir}", "--cpu_logical_devices=2", f"--output_json={out}"], env)
    with open(out) as f:
        metrics = json.load(f)
    assert metrics["step"] == 30 and metrics["val_examples"] == 359
    assert metrics["val_accuracy"] == pytest.approx(final["val_accuracy"], abs=1e-6)
    assert metrics["val_loss"] == pytest.approx(final["val_loss"], rel=1e-3)


def test_evaluate_without_a_run_dir_names_the_flag(tmp_path, trained):
    proc = _tool("evaluate", [f"--model_dir={tmp_path}"], trained[1], check=False)
    assert proc.returncode == 1 and "--model_dir" in proc.stderr and "config.yaml not found" in proc.stderr


# Slow: (66 s loaded); an export that loads without tfgpu stays in the default suite through
# tests/examples/test_own_model.py.
@pytest.mark.slow
def test_exports_load_without_tfgpu_and_predict_like_the_trained_model(trained, tmp_path):
    model_dir, env = trained
    logs = [_tool("export", [f"--model_dir={model_dir}", "--format=saved_model", f"--output={tmp_path / 'sm'}"],
                  env).stdout,
            _tool("export", [f"--model_dir={model_dir}", "--format=keras", f"--output={tmp_path / 'm.keras'}"],
                  env).stdout]
    with open(model_dir / "export" / "model.input.json") as f:  # the run's own export is described too
        assert json.load(f)["bare"]["input"]["range"] == [0.0, 1.0]
    for log, described, bare in zip(logs, ("sm.input.json", "m.input.json"), ("sm.bare", "m.bare.keras")):
        assert (f"input: NHWC pixels 0..255 (uint8 or float32); {bare}: float32 in [0, 1], described in "
                f"{tmp_path / described}") in log
        with open(tmp_path / described) as f:
            description = json.load(f)
        assert description["input"]["range"] == [0.0, 255.0] and description["input"]["shape"] == [None, 8, 8, 1]
        assert description["bare"]["input"]["range"] == [0.0, 1.0] and description["bare"]["file"] == bare
        assert description["output"]["shape"] == [None, 10] and description["classes"] == [str(i) for i in range(10)]
    batch = np.random.default_rng(0).uniform(0, 1, (5, 8, 8, 1)).astype(np.float32)
    np.save(tmp_path / "batch.npy", batch)
    reference = f"""
import numpy as np
from tfgpu import train
from tfgpu.training import experiment
config = train.parse(["--config={model_dir}/config.yaml"])
built = experiment.setup(config, write_config=False)
built.trainer.restore()
np.save("{tmp_path}/reference.npy", np.asarray(built.task.model(np.load("{tmp_path}/batch.npy"), training=False)))
"""
    subprocess.run([sys.executable, "-c", reference], cwd=REPO, env=env, check=True, capture_output=True, timeout=300)
    without_tfgpu = f"""
import sys
sys.modules["tfgpu"] = None  # any import of tfgpu now fails
import numpy as np, keras, tensorflow as tf
batch = np.load("{tmp_path}/batch.npy")
outputs = {{}}
for name, images in (("sm", batch * 255), ("sm.bare", batch)):
    saved_model = tf.saved_model.load(f"{tmp_path}/{{name}}")  # keep a reference: its variables live in it
    outputs[name] = saved_model.serve(tf.constant(images))
for name, images in (("m.keras", batch * 255), ("m.bare.keras", batch)):
    outputs[name] = keras.saving.load_model(f"{tmp_path}/{{name}}")(images, training=False)
for name, out in outputs.items():
    assert out.dtype == tf.float32, (name, out.dtype)
    np.save(f"{tmp_path}/{{name}}.npy", np.asarray(out))
"""
    subprocess.run([sys.executable, "-c", without_tfgpu], cwd=str(tmp_path), env=env, check=True, timeout=300)
    reference = np.load(tmp_path / "reference.npy")
    assert reference.shape == (5, 10)
    # The run computes in bfloat16 (8 significant bits): graph and eager execution may round differently.
    for name in ("sm.npy", "sm.bare.npy", "m.keras.npy", "m.bare.keras.npy"):
        exported = np.load(tmp_path / name)
        np.testing.assert_allclose(exported, reference, atol=1e-2, err_msg=name)
        np.testing.assert_array_equal(exported.argmax(-1), reference.argmax(-1))


def _foreign_checkpoint(directory) -> str:
    """A checkpoint a TensorFlow user wrote (not tfgpu) of a classifier shaped like the run's but with a 5-class
    head: every item of a run's checkpoint is there, the head does not fit."""
    import keras
    import tensorflow as tf

    model = keras.Sequential([keras.Input((8, 8, 1)), keras.layers.Flatten(), keras.layers.Dense(5)])
    root = tf.train.Checkpoint(step=tf.Variable(30, dtype=tf.int64), model=model,
                               optimizer=keras.optimizers.SGD())
    return tf.train.CheckpointManager(root, str(directory), max_to_keep=1).save()


@pytest.mark.parametrize("command, checkpoint, message", [
    ("evaluate", "foreign", "does not fit the model built here: "),
    ("export", "a file", "is not a readable checkpoint (Unable to open table file"),
])
def test_a_checkpoint_that_is_not_the_runs_is_one_line_naming_it(trained, data_cache, tmp_path, capsys, monkeypatch,
                                                                 command, checkpoint, message):
    """Before: a ValueError traceback (another model), or a silent evaluation of freshly initialised weights (a
    checkpoint of another task restored with expect_partial)."""
    import importlib

    from tests.conftest import process_state_restored

    model_dir, _ = trained
    if checkpoint == "foreign":
        path = _foreign_checkpoint(tmp_path)
    else:
        path = str(tmp_path / "notes.txt")
        with open(path, "w") as f:
            f.write("not a checkpoint\n")
    output = [f"--output={tmp_path / 'm.keras'}"] if command == "export" else []
    monkeypatch.setenv("TFGPU_DATA_CACHE", data_cache)
    with process_state_restored():
        code = importlib.import_module(f"tfgpu.{command}").main([f"--model_dir={model_dir}", f"--checkpoint={path}",
                                                                 *output])
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert code == 1 and len(errors) == 1, err
    assert errors[0].startswith("error: --checkpoint: ") and path in errors[0] and message in errors[0]
    assert "Traceback" not in err
