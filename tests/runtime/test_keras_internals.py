"""runtime/keras_internals: the one module that imports ``keras.src``; outside the tested Keras releases tfgpu stops
in one line naming the installed and the supported ones; setup.cfg's pin is the tested range; and (slow) the fit
tests pass on the lowest and the highest Keras of that range, each installed from PyPI beside this one."""
import configparser
import os
import pathlib
import re
import subprocess
import sys

import pytest

from tests.conftest import REPO
from tfgpu.config import ConfigError
from tfgpu.runtime import keras_internals


def test_versions_are_read_and_judged_against_the_tested_range():
    assert keras_internals.version_tuple("3.15.1") == (3, 15, 1)
    assert keras_internals.version_tuple("3.16.0.dev2026120701") == (3, 16, 0)
    assert keras_internals.version_tuple("3.13.0rc1") == (3, 13, 0)
    low, high = keras_internals.SUPPORTED
    assert keras_internals.is_supported(".".join(map(str, low)))
    assert keras_internals.is_supported("3.15.1")
    for outside in ("3.10.0", "3.11.3", "3.12.3", ".".join(map(str, high)), "4.0.0"):
        assert not keras_internals.is_supported(outside), outside


def test_an_unsupported_keras_is_one_line_naming_both_releases(monkeypatch):
    import keras

    monkeypatch.setattr(keras, "__version__", "3.11.3")
    with pytest.raises(ConfigError) as raised:
        keras_internals.internal("tree")
    message = str(raised.value)
    assert "\n" not in message and raised.value.flag == "keras"
    assert "Keras 3.11.3 is installed; tfgpu supports Keras 3.12.4 up to (not including) 3.16" in message
    assert "pip install 'keras>=3.12.4,<3.16'" in message


def test_a_script_stops_with_that_line_and_no_traceback(tmp_path):
    script = tmp_path / "old_keras.py"
    script.write_text("import keras\nkeras.__version__ = '3.10.0'\nimport numpy as np\nimport tfgpu\n"
                      "model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])\n"
                      "model.compile('sgd', 'mse')\n"
                      "tfgpu.fit(model, np.zeros((4, 2)), np.zeros((4, 1)), verbose=0)\n")
    env = {**os.environ, "PYTHONPATH": REPO + os.pathsep + os.environ.get("PYTHONPATH", ""),
           "TF_CPP_MIN_LOG_LEVEL": "3"}
    proc = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr
    assert "tfgpu: --keras: Keras 3.10.0 is installed; tfgpu supports Keras 3.12.4 up to (not including) 3.16" in \
        proc.stderr


def test_only_keras_internals_imports_keras_src():
    found = []
    for path in pathlib.Path(REPO, "tfgpu").rglob("*.py"):
        if path.name == "keras_internals.py":
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if re.search(r"^\s*(from|import)\s+keras\.src", line) or "import_module(\"keras.src" in line:
                found.append(f"{path.relative_to(REPO)}:{number}: {line.strip()}")
    assert found == []


def test_every_internal_imports():
    for name in keras_internals.INTERNALS:
        assert keras_internals.internal(name) is not None, name


def test_setup_cfg_pins_the_tested_range():
    parser = configparser.ConfigParser()
    parser.read(os.path.join(REPO, "setup.cfg"))
    requires = [line.strip() for line in parser["options"]["install_requires"].splitlines()]
    assert [line for line in requires if line.startswith("keras")] == [keras_internals.requirement()]


# -- the two ends of the range, each installed from PyPI beside this Keras (pip install --target) -----------------

FIT_TESTS = ["tests/training/fit/test_steps.py", "tests/training/fit/test_labels.py", "tests/training/fit/test_inputs.py",
             "tests/training/fit/test_run.py::test_two_workers_train_one_model_and_the_scripts_objects_work_after_fit",
             "tests/training/test_keras_adapter.py::test_guard_rejects_unverified_keras",
             "tests/runtime/test_replica_batches.py"]


def _install(version: str, target: pathlib.Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(target),
                           f"keras=={version}"], capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        text = proc.stdout + proc.stderr
        if re.search(r"No matching distribution|Could not find a version|connection|resolve|network|"
                     r"Temporary failure|timed out", text, flags=re.I):
            pytest.skip(f"pip cannot install keras=={version} from an index here: {text.strip().splitlines()[-1]}")
        raise AssertionError(f"pip install keras=={version} failed:\n{text[-3000:]}")


@pytest.mark.slow  # installs two Keras releases and runs the fit tests on each: minutes
@pytest.mark.parametrize("end", ["lowest", "highest"])
def test_the_fit_tests_pass_at_both_ends_of_the_range(tmp_path, end):
    low, high = keras_internals.SUPPORTED
    version = ".".join(map(str, low)) if end == "lowest" else LATEST_TESTED
    _install(version, tmp_path / "keras")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path / "keras"), REPO,
                                                        os.environ.get("PYTHONPATH", "")]),
           "TF_CPP_MIN_LOG_LEVEL": "2"}
    shown = subprocess.run([sys.executable, "-c", "import keras; print(keras.__version__)"], env=env,
                           capture_output=True, text=True, timeout=120)
    assert shown.stdout.strip() == version, shown.stderr[-2000:]
    tests = [test for test in FIT_TESTS if os.path.exists(os.path.join(REPO, test.split("::")[0]))]
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", "-m", "not slow",
                           *tests], cwd=REPO, env=env, capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 0, f"Keras {version}:\n{proc.stdout[-5000:]}\n{proc.stderr[-2000:]}"


LATEST_TESTED = "3.15.1"  # the highest release of the range (the registry's newest when the range was set)
