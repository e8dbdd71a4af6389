"""Tests of the scripts in tools/ (not part of the package): ``load`` imports one by file name."""
import importlib.util
import os

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def load(name: str, folder: str = "tools"):
    """The module of ``<repo>/<folder>/<name>.py``."""
    spec = importlib.util.spec_from_file_location(name, os.path.join(REPO, folder, f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
