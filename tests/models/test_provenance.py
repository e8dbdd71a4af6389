"""model_source.json (tfgpu.models.provenance): which user file built a run's models, and a warning when it changed."""
import hashlib
import json
import logging
import os
import uuid

import pytest

from tfgpu.config import Config
from tfgpu.models import provenance, registration, user

NET = """
import keras


def build(input_shape, num_classes):
    return keras.Sequential([keras.Input(input_shape), keras.layers.Flatten(), keras.layers.Dense(num_classes)])
"""


@pytest.fixture
def net_file(tmp_path):
    """A user's model file whose module name is unique to the test."""
    path = tmp_path / f"net_{uuid.uuid4().hex[:8]}.py"
    path.write_text(NET)
    return path


def test_the_source_record_names_module_file_and_hash_and_a_changed_file_is_a_warning(net_file, tmp_path, caplog):
    config = Config(model=f"{net_file}:build", dataset="digits", model_dir=str(tmp_path))
    provenance.write_source_record(config, str(tmp_path))
    record = json.loads((tmp_path / user.SOURCE_FILE).read_text())["model"]
    assert record["file"] == str(net_file) and record["module"].startswith(f"tfgpu_user_{net_file.stem}_")
    assert record["sha256"] == hashlib.sha256(net_file.read_bytes()).hexdigest()
    with caplog.at_level(logging.WARNING, logger="tfgpu"):
        provenance.warn_if_changed(config, str(tmp_path))
        assert "changed since" not in caplog.text
        net_file.write_text(NET + "\n# edited\n")
        provenance.warn_if_changed(config, str(tmp_path))
    assert f"--model: {net_file} changed since this run recorded it" in caplog.text


@pytest.mark.parametrize("model", ["small_cnn", "zoo:net"])
def test_a_registered_model_writes_no_source_record(model, tmp_path, monkeypatch):
    """A registered name is never a user builder, even one with a colon (as tfgpu.fit registers)."""
    spec = registration.ModelSpec("zoo:net", lambda *a: None, "classifier", 32)
    monkeypatch.setitem(registration._MODELS, "zoo:net", spec)
    provenance.write_source_record(Config(model=model, dataset="digits", model_dir=str(tmp_path)), str(tmp_path))
    assert not os.listdir(tmp_path)


def test_an_unchanged_source_record_is_not_written_again_and_reads_back_as_recorded_sources(net_file, tmp_path):
    """An unchanged resume leaves model_source.json as it was (issue 37); a checkpoint older than fingerprints is
    checked against the sha256 it holds."""
    config = Config(model=f"{net_file}:build", dataset="digits", model_dir=str(tmp_path))
    provenance.write_source_record(config, str(tmp_path))
    path = tmp_path / user.SOURCE_FILE
    first = path.stat().st_ino
    provenance.write_source_record(config, str(tmp_path))
    assert path.stat().st_ino == first
    digest = hashlib.sha256(net_file.read_bytes()).hexdigest()
    assert provenance.recorded_sources(str(tmp_path)) == {
        "sources": {"model": {"what": f"--model file {net_file}", "sha256": digest}}}
    assert provenance.builder_sources(config)["model"]["sha256"] == digest
    net_file.write_text(NET + "\n# edited\n")
    provenance.write_source_record(config, str(tmp_path))  # reached only with --allow_config_change=model
    assert json.loads(path.read_text())["model"]["sha256"] != digest
