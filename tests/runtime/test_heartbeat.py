"""tfgpu.runtime.heartbeat: what a worker tells tfgpu.launch about its progress, and nothing without the launcher."""
import json
import os

from tfgpu.runtime import heartbeat


def test_a_beat_replaces_the_file_the_launcher_named(tmp_path):
    path = tmp_path / "worker-0.json"
    environ = {heartbeat.ENV: str(path)}
    heartbeat.beat("restored", 100, "/runs/r", environ=environ)
    first = heartbeat.read(str(path))
    heartbeat.beat("training", 145, "/runs/r", environ=environ)
    second = heartbeat.read(str(path))
    assert (first["phase"], first["step"]) == ("restored", 100)
    assert (second["phase"], second["step"], second["model_dir"], second["pid"]) == ("training", 145, "/runs/r",
                                                                                   os.getpid())
    assert second["time"] >= first["time"]
    assert sorted(os.listdir(tmp_path)) == ["worker-0.json"]  # no temporary file left beside it


def test_without_the_launcher_nothing_is_written_and_bad_files_read_as_none(tmp_path):
    heartbeat.beat("training", 1, environ={})
    assert list(tmp_path.iterdir()) == []
    assert heartbeat.read(str(tmp_path / "missing.json")) is None
    (tmp_path / "half.json").write_text('{"phase": "train')
    (tmp_path / "other.json").write_text(json.dumps({"phase": "sleeping", "step": 3}))
    assert heartbeat.read(str(tmp_path / "half.json")) is None and heartbeat.read(str(tmp_path / "other.json")) is None


def test_an_unwritable_heartbeat_does_not_stop_training(tmp_path):
    heartbeat.beat("training", 1, environ={heartbeat.ENV: str(tmp_path / "no" / "such" / "dir" / "w.json")})
