"""training/fit/run across processes: a script ported by the two edits trains one model on two workers (every worker
the same weights), its own objects work after fit, and a run stopped by SIGTERM on two workers resumes on one device
to the weights of the uninterrupted run."""
import json
import os
import runpy
import subprocess
import sys

import numpy as np
import pytest

from tests.conftest import REPO, process_state_restored
from tests.training.fit import helpers

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fit_script.py")


def _run(args, cwd, launch_workers=0, expect=0, timeout=600, launch_args=()):
    return helpers.printed("fit_script.py", "RESULT", args, cwd, launch_workers, expect, timeout, launch_args)


def _run_here(args, monkeypatch, capsys):
    """The script's one-device run in this process, whose TensorFlow is started: one start-up fewer."""
    monkeypatch.setattr(sys, "argv", [SCRIPT, *args])
    capsys.readouterr()
    with process_state_restored():
        runpy.run_path(SCRIPT, run_name="__main__")
    return [json.loads(line.split("RESULT ", 1)[1]) for line in capsys.readouterr().out.splitlines()
            if "RESULT " in line]


def test_two_workers_train_one_model_and_the_scripts_objects_work_after_fit(tmp_path, monkeypatch, capsys):
    one, = _run_here([str(tmp_path / "one")], monkeypatch, capsys)
    two = _run([str(tmp_path / "two")], tmp_path, launch_workers=2)
    assert len(two) == 2
    assert two[0]["sha256"] == two[1]["sha256"]  # every worker holds the same weights
    assert two[0]["loop_digests"] == two[1]["loop_digests"]  # after every loop, too
    for worker in two:
        assert worker["iterations"] == one["iterations"] == 3 * 23  # ceil(1437 / 64) steps an epoch, as Keras
        # one device's global batch mean against two replicas' (the last partial batch's halves are averaged, as
        # tf.distribute does): a hundredth apart after 69 Adam steps; another model would be far off
        np.testing.assert_allclose(worker["weights"], one["weights"], rtol=1e-2, atol=1e-2)
        for key, value in one["history"].items():
            assert abs(worker["history"][key] - value) < 2e-3, (key, worker["history"], one["history"])
        assert worker["held_out_examples"] == 200  # a Dataset made before fit, read after it
        assert abs(worker["evaluate"]["accuracy"] - one["evaluate"]["accuracy"]) < 0.02
        assert worker["batches"] == one["batches"] == 69  # the callback saw every batch, as under model.fit
        assert worker["seen"] == one["seen"] == 1.0  # its own metric works in fit and after it
    assert one["history"]["val_accuracy"] > 0.5  # 10 classes: chance is 0.1


@pytest.mark.slow  # three runs, one on two workers: over a minute on 2 cores
def test_a_run_stopped_on_two_workers_resumes_on_one_device_to_the_uninterrupted_weights(tmp_path):
    whole, = _run([str(tmp_path / "whole")], tmp_path)
    # SIGTERM to worker 1 alone: both workers stop after the same step and save there
    _run([str(tmp_path / "moved"), "1:9@1"], tmp_path, launch_workers=2, expect=143)
    resumed, = _run([str(tmp_path / "moved")], tmp_path)
    assert resumed["iterations"] == whole["iterations"]
    assert resumed["epochs"] == [1, 2]  # the stopped epoch ends, then the last one
    np.testing.assert_allclose(resumed["weights"], whole["weights"], rtol=1e-2, atol=1e-2)
    assert abs(resumed["history"]["val_accuracy"] - whole["history"]["val_accuracy"]) < 0.01


@pytest.mark.slow  # two runs on two workers, one of them restarted: minutes on 2 cores
def test_the_launcher_heals_a_fit_script_to_the_uninterrupted_weights(tmp_path):
    """Both workers preempted mid-epoch (SIGTERM at epoch 1, batch 9): --max_restarts=1 starts the script again, which
    resumes from model_dir and ends with the very weights of an uninterrupted two-worker run."""
    whole = _run([str(tmp_path / "whole")], tmp_path, launch_workers=2)
    env_args = ["--max_restarts=1"]
    healed = _run([str(tmp_path / "healed"), "1:9"], tmp_path, launch_workers=2, launch_args=env_args)
    assert {w["sha256"] for w in healed} == {whole[0]["sha256"]}
    assert healed[0]["iterations"] == 69 and healed[0]["epochs"] == [1, 2]


def _audits(args, cwd, **options):
    return helpers.printed("audit_script.py", "AUDIT", args, cwd, **options)


@pytest.mark.slow  # three runs, two of them on two workers: minutes on 2 cores
def test_every_example_trains_once_per_epoch_on_two_workers_and_across_a_resume_on_one(tmp_path):
    """The model's own step counts each example it trains on (summed over replicas and workers): 203 examples in
    batches of 16 (the last partial), 2 epochs on two workers: each example exactly twice; stopped at epoch 1,
    batch 5 on two workers and resumed on one device: exactly twice again (the counts travel in the checkpoint)."""
    assert _audits([str(tmp_path / "two"), "2"], tmp_path, launch_workers=2) == [{"2": 203}, {"2": 203}]
    _audits([str(tmp_path / "moved"), "2", "1:5"], tmp_path, launch_workers=2, expect=143)
    assert _audits([str(tmp_path / "moved"), "2"], tmp_path) == [{"2": 203}]


EMBEDDING_SCRIPT = r'''
import tfgpu
import sys
import keras, numpy as np, tensorflow as tf
keras.utils.set_random_seed(0)
x = np.random.RandomState(0).randint(0, 500, (2000, 32)); y = (x[:, 0] > 250).astype("int64")
model = keras.Sequential([keras.Input((32,), dtype="int32"), keras.layers.Embedding(500, 16),
                          keras.layers.GlobalAveragePooling1D(), keras.layers.Dense(2, activation="softmax")])
model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
data = (x, y) if sys.argv[1] == "arrays" else (tf.data.Dataset.from_tensor_slices((x, y)).batch(32),)
history = tfgpu.fit(model, *data, batch_size=32 if sys.argv[1] == "arrays" else None, epochs=2, verbose=0,
                    steps_per_loop=100)
print("RESULT " + str(history.history["loss"][-1]))
'''


@pytest.mark.slow  # two runs on two workers: about a minute on 2 cores
@pytest.mark.parametrize("kind", ["arrays", "dataset"])
def test_sparse_gradients_train_on_two_workers_when_the_last_batch_is_partial(tmp_path, kind):
    """An Embedding's gradients are all-gathered with the batch's shape; 2000 examples in batches of 32 end each
    epoch with a batch of 16, which one call may not mix with full ones (TensorFlow's collectives keep an instance's
    first shape: "Shape mismatch in the collective instance")."""
    script = tmp_path / "embedding.py"
    script.write_text(EMBEDDING_SCRIPT)
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONPATH": REPO}
    proc = subprocess.run([sys.executable, "-m", "tfgpu.launch", "--num_workers=2", "--", sys.executable,
                           str(script), kind], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    losses = [float(line.split("RESULT ", 1)[1]) for line in proc.stdout.splitlines() if "RESULT " in line]
    assert len(losses) == 2 and losses[0] == losses[1] < 0.6932  # both workers, one model, below chance's log(2)
