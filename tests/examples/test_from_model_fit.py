"""examples/from_model_fit: three plain Keras scripts ported by two edits score like plain Keras.

Each script runs as plain Keras (``--keras``) and through tfgpu.fit on one device, and the model it returns scores
within 0.02 of plain Keras' (docs/from-model-fit.md's table); through ``python -m tfgpu.launch --num_workers=2``,
the same script with no edit, within 0.05. Minutes each on 2 cores: marked slow (the behaviours they rest on are
tests/training/test_fit_keras.py's).
"""
import json
import os
import subprocess
import sys

import pytest

from tests.conftest import REPO

FOLDER = os.path.join(REPO, "examples", "from_model_fit")
SCRIPTS = {"arrays_validation_split.py": "test_accuracy", "image_folder_early_stopping.py": "val_accuracy",
           "tfdata_schedule_smoothing.py": "test_accuracy"}


def _run(command, cwd, timeout=1500) -> dict:
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = [line.split("] ", 1)[-1] for line in proc.stdout.splitlines() if '"script"' in line]
    return json.loads(lines[-1])


@pytest.mark.slow
@pytest.mark.parametrize("script", sorted(SCRIPTS))
def test_a_ported_script_scores_like_plain_keras_on_one_and_two_workers(script, tmp_path):
    key = SCRIPTS[script]
    path = os.path.join(FOLDER, script)
    extra = [f"--image_dir={tmp_path / 'images'}"] if "image_folder" in script else []
    keras_score = _run([sys.executable, path, "--keras", *extra], tmp_path)[key]
    one = _run([sys.executable, path, *extra], tmp_path)[key]
    two = _run([sys.executable, "-m", "tfgpu.launch", "--num_workers=2", "--", "python", path, *extra], tmp_path)[key]
    assert abs(one - keras_score) <= 0.02, (keras_score, one)
    assert abs(two - keras_score) <= 0.05, (keras_score, two)
