"""examples/finetune: weights saved by a plain Keras script, fine-tuned by tfgpu with a new head, as documented.

Default suite: the pretraining function runs one epoch in this process, then the example's flagfile trains a
few steps in-process: the backbone loads, the 2-class head is kept as initialized (logged), the backbone is
frozen until --unfreeze_at_step and the counts say so. Slow (two processes and the documented 300 steps,
about a minute on 2 CPU cores): the commands exactly as the files give them, reaching the accuracy measured.
"""
import os
import subprocess
import sys

import numpy as np
import pytest

from tests.conftest import REPO, read_history, read_metrics

EXAMPLE = os.path.join(REPO, "examples", "finetune")
FLAGS = "--flagfile=examples/finetune/finetune.flags"


def test_the_example_pretrains_in_plain_keras_and_tfgpu_fine_tunes_it(train_here, tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(EXAMPLE)  # as running the script puts its folder on sys.path
    import pretrain

    weights = str(tmp_path / "pretrained.weights.h5")
    assert pretrain.pretrain(weights, epochs=1)["accuracy"] > 0.5
    monkeypatch.chdir(REPO)  # the flagfile names the model file relative to the repository root
    model_dir = tmp_path / "run"
    result = train_here(FLAGS, f"--init_weights={weights}", f"--model_dir={model_dir}", "--train_steps=6",
                        "--unfreeze_at_step=3", "--steps_per_loop=3", "--checkpoint_every_steps=0",
                        "--eval_every_steps=0", "--verbose=2")
    assert "--init_weights: loaded 4 layer(s)" in result.output
    assert "kept as initialized (--init_skip_mismatch): head (weight kernel has shape (32, 2) in the file, " \
           "(32, 10) in the model)" in result.output
    assert "params=5,178 (330 trainable)" in result.output  # the head alone until step 3
    metrics = read_metrics(model_dir)
    assert (metrics["parameters"], metrics["trainable_parameters_before_unfreeze"]) == (5178, 330)
    assert metrics["trainable_parameters"] == 5178
    assert [r["step"] for r in read_history(model_dir)] == [3, 6]
    assert np.isfinite(metrics["train_loss"])


@pytest.mark.slow  # two processes and the documented 300 steps: about a minute on 2 CPU cores
def test_the_documented_commands_reach_the_accuracy_measured(tmp_path, data_cache):
    env = {**os.environ, "TFGPU_DATA_CACHE": data_cache, "TF_CPP_MIN_LOG_LEVEL": "2"}
    weights = str(tmp_path / "finetune" / "pretrained.weights.h5")
    for command in ([sys.executable, "examples/finetune/pretrain.py", f"--out={weights}"],
                    [sys.executable, "-m", "tfgpu.train", FLAGS, f"--init_weights={weights}",
                     f"--model_dir={tmp_path / 'run'}"]):
        proc = subprocess.run(command, cwd=REPO, env=env, text=True, capture_output=True, timeout=600)
        assert proc.returncode == 0, proc.stderr[-3000:]
    assert read_metrics(tmp_path / "run")["val_accuracy"] >= 0.9
