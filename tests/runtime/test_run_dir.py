"""runtime/run_dir.py: every name under model_dir lives there, each path is under model_dir and distinct, and
no other module spells a run directory's file by joining model_dir with it."""
import ast
import inspect
import os
import pathlib

import pytest
from hypothesis import given, strategies as st

from tfgpu.runtime import restarts, run_dir

REPO = pathlib.Path(__file__).resolve().parents[2]
ARGUMENTS = {"step": 7, "run": "train", "name": "loss", "pid": 123, "split": "test"}
PATHS = [f for name, f in inspect.getmembers(run_dir, inspect.isfunction)
         if f.__module__ == run_dir.__name__ and next(iter(inspect.signature(f).parameters)) == "model_dir"]
NAMES = {name: value for name, value in vars(run_dir).items() if name.isupper() and isinstance(value, str)}


def _path(function, model_dir):
    parameters = list(inspect.signature(function).parameters)[1:]
    return function(model_dir, *(ARGUMENTS[p] for p in parameters))


def test_every_path_function_is_found():
    """The walk below covers the module: a new path function is tested without a new line here."""
    assert len(PATHS) >= 20 and run_dir.checkpoints in PATHS and run_dir.config_yaml in PATHS


@given(model_dir=st.sampled_from(["/tmp/run", "run", "gs://bucket/a/run", "ram://run", "/tmp/run/"]))
def test_every_path_is_under_model_dir(model_dir):
    """Local, relative and file-system (gs://, ram://) run directories keep their prefix, as os.path.join did."""
    for function in PATHS:
        path = _path(function, model_dir)
        assert path.startswith(model_dir.rstrip("/") + "/") and path != model_dir, (function.__name__, path)


def test_paths_are_distinct():
    """No two files or folders of a run share a path (a file and the folder it sits in differ too)."""
    paths = [_path(function, "/r") for function in PATHS]
    assert len(set(paths)) == len(paths)


def test_checkpoints_are_named_as_tensorflow_names_them():
    """``checkpoint(model_dir, step)`` is the prefix TensorFlow's CheckpointManager writes for ``step`` with
    ``CHECKPOINT_NAME``, in ``checkpoints(model_dir)`` beside TensorFlow's state file."""
    assert run_dir.checkpoint("/r", 12) == os.path.join(run_dir.checkpoints("/r"), run_dir.CHECKPOINT_NAME + "-12")
    assert run_dir.checkpoint_state("/r") == os.path.join(run_dir.checkpoints("/r"), "checkpoint")


def test_the_launcher_reads_the_step_from_the_state_file_it_names(tmp_path):
    """runtime/restarts.checkpoint_step (no TensorFlow) reads the state file at ``checkpoint_state``."""
    os.makedirs(run_dir.checkpoints(str(tmp_path)))
    with open(run_dir.checkpoint_state(str(tmp_path)), "w") as f:
        f.write(f'model_checkpoint_path: "{os.path.basename(run_dir.checkpoint(str(tmp_path), 225))}"\n')
    assert restarts.checkpoint_step(str(tmp_path)) == 225


def test_the_table_names_every_file_and_folder():
    """The module docstring's table lists each name, so a maintainer finds who writes and reads it."""
    doc = run_dir.__doc__
    missing = [name for name, value in NAMES.items() if value not in doc]
    assert missing == []


def test_run_dir_imports_nothing_heavy():
    """The launcher and the light commands import it: only the standard library's os."""
    tree = ast.parse(pathlib.Path(run_dir.__file__).read_text())
    imported = [alias.name for node in ast.walk(tree) if isinstance(node, (ast.Import, ast.ImportFrom))
                for alias in node.names]
    assert imported == ["os"]


def _spells_model_dir(node) -> bool:
    """``model_dir``, ``self.model_dir``, ``config.model_dir``, ``opts.model_dir``, ``model_dir_or_file``..."""
    name = node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else ""
    return name.startswith("model_dir")


def joins_model_dir(source: str) -> list:
    """Line numbers of ``<anything>.join(model_dir, ...)`` calls (os.path, posixpath, fileio...)."""
    return [node.lineno for node in ast.walk(ast.parse(source))
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "join"
            and len(node.args) >= 2 and _spells_model_dir(node.args[0])]


def test_the_check_finds_every_spelling():
    source = ("import os, posixpath\nos.path.join(model_dir, 'x')\nposixpath.join(self.model_dir, 'y')\n"
              "os.path.join(config.model_dir, a, b)\nos.path.join(workdir, 'run')\n', '.join(model_dir)\n")
    assert joins_model_dir(source) == [2, 3, 4]


@pytest.mark.parametrize("root", ["tfgpu", "tools"])
def test_no_module_but_run_dir_joins_model_dir(root):
    """Renaming a file or folder of a run is a change to run_dir.py alone."""
    found = [f"{path.relative_to(REPO)}:{line}" for path in sorted((REPO / root).rglob("*.py"))
             if path != pathlib.Path(run_dir.__file__) for line in joins_model_dir(path.read_text())]
    assert found == []
