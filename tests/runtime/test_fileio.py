"""tfgpu.runtime.fileio: the same calls on local paths (os, POSIX guarantees) and on TensorFlow file systems
(``ram://`` here, standing in for ``gs://``); atomic writes leave the old file or the whole new one."""
import os
import stat
import uuid

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tfgpu.config import ConfigError
from tfgpu.runtime import fileio


@pytest.fixture
def ram_dir():
    root = f"ram://fileio-{uuid.uuid4().hex[:8]}"
    fileio.makedirs(root)
    yield root
    fileio.rmtree(root)


@pytest.fixture(params=["local", "ram"])
def directory(request, tmp_path, ram_dir):
    return str(tmp_path) if request.param == "local" else ram_dir


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(first=st.binary(max_size=300), second=st.binary(max_size=300))
def test_an_atomic_write_replaces_the_whole_file_and_leaves_no_temporary(directory, first, second):
    """(The directory is shared by the examples: each one removes its file at the end.)"""
    path = os.path.join(directory, "metrics.json")
    for data in (first, second):
        fileio.atomic_write_bytes(path, data)
        assert fileio.read_bytes(path) == data
        assert fileio.listdir(directory) == ["metrics.json"]
    fileio.remove(path)


def test_a_failed_write_leaves_the_old_file_and_no_temporary(directory):
    path = os.path.join(directory, "config.yaml")
    fileio.atomic_write_bytes(path, b"old")
    with pytest.raises(RuntimeError):
        with fileio.atomic_path(path) as tmp:
            with fileio.open_file(tmp, "wb") as f:
                f.write(b"half of the ne")
            raise RuntimeError("killed mid-write")
    assert fileio.read_bytes(path) == b"old" and fileio.listdir(directory) == ["config.yaml"]


def test_a_local_atomic_write_gives_the_mode_a_plain_open_gives(tmp_path):
    umask = os.umask(0o022)
    try:
        fileio.atomic_write_bytes(str(tmp_path / "a"), b"x")
    finally:
        os.umask(umask)
    assert stat.S_IMODE(os.stat(tmp_path / "a").st_mode) == 0o644


@pytest.mark.parametrize("proc", [True, False], ids=["proc-status", "probe-file"])
def test_the_mode_comes_from_the_umask_read_never_set(tmp_path, monkeypatch, proc):
    """No process-wide umask change (another thread could create a world-writable file meanwhile): the umask is
    read from /proc/self/status, or where that is missing from a probe file's mode."""
    import builtins

    umask = os.umask(0o027)
    try:
        if not proc:
            def no_proc(path, *args, **kwargs):
                if str(path).startswith("/proc/"):
                    raise FileNotFoundError(path)
                return builtins.open(path, *args, **kwargs)
            monkeypatch.setattr(fileio, "open", no_proc, raising=False)
        calls = []
        monkeypatch.setattr(os, "umask", lambda *a: calls.append(a) or 0)
        assert fileio.current_umask() == 0o027 and fileio.default_mode(directory=True) == 0o750
        fileio.atomic_write_bytes(str(tmp_path / "a"), b"x")
        assert calls == []
    finally:
        monkeypatch.undo()
        os.umask(umask)
    assert stat.S_IMODE(os.stat(tmp_path / "a").st_mode) == 0o640


def test_a_writer_of_local_files_only_still_writes_to_a_remote_path(ram_dir):
    """Keras saves .keras files to the local disk only: atomic_local_path hands it one and copies the result."""
    path = f"{ram_dir}/export/model.keras"
    fileio.makedirs(fileio.parent(path))
    with fileio.atomic_local_path(path, suffix=".keras") as tmp:
        assert not fileio.has_scheme(tmp) and tmp.endswith(".keras")
        with open(tmp, "wb") as f:
            f.write(b"model bytes")
    assert fileio.read_bytes(path) == b"model bytes" and fileio.listdir(f"{ram_dir}/export") == ["model.keras"]


def test_missing_files_and_directories_raise_the_oserror_a_local_call_raises(directory):
    missing = os.path.join(directory, "nope")
    for call in (fileio.read_bytes, fileio.listdir):
        with pytest.raises(FileNotFoundError):
            call(missing)
    with pytest.raises(FileNotFoundError):
        fileio.remove(missing)
    fileio.remove(missing, missing_ok=True)
    assert not fileio.exists(missing) and not fileio.isdir(missing)


def test_directories_listing_appending_and_copying_a_tree(directory, tmp_path_factory):
    run = os.path.join(directory, "run")
    fileio.makedirs(os.path.join(run, "plots"))
    fileio.append_text(os.path.join(run, "history.jsonl"), "1\n")
    fileio.append_text(os.path.join(run, "history.jsonl"), "2\n")
    assert fileio.read_text(os.path.join(run, "history.jsonl")) == "1\n2\n"
    assert sorted(fileio.listdir(run)) == ["history.jsonl", "plots"] and fileio.isdir(os.path.join(run, "plots"))
    assert fileio.isfile(os.path.join(run, "history.jsonl")) and not fileio.isfile(os.path.join(run, "plots"))
    assert fileio.glob(os.path.join(run, "*.jsonl")) == [os.path.join(run, "history.jsonl")]
    local = tmp_path_factory.mktemp("saved_model")
    (local / "variables").mkdir()
    (local / "saved_model.pb").write_bytes(b"pb")
    (local / "variables" / "variables.index").write_bytes(b"index")
    fileio.copy_tree(str(local), os.path.join(run, "sm"))
    assert fileio.read_bytes(os.path.join(run, "sm", "variables", "variables.index")) == b"index"
    fileio.rmtree(run)
    assert not fileio.exists(os.path.join(run, "history.jsonl"))


def test_absolute_keeps_a_scheme_and_normalises_the_rest():
    assert fileio.absolute("gs://bucket/a/../b/") == "gs://bucket/b"
    assert fileio.parent("ram://run/export/model.keras") == "ram://run/export"
    assert fileio.absolute("rel") == os.path.abspath("rel")


def test_a_scheme_tensorflow_lacks_is_refused_naming_the_flag_and_the_plugin():
    assert fileio.unsupported_scheme("ram://x") == fileio.unsupported_scheme("/local/x") == ""
    with pytest.raises(ConfigError) as e:
        fileio.check_scheme("s3://bucket/run", "model_dir")
    assert e.value.flag == "model_dir" and "s3://" in str(e.value) and "tensorflow-io" in str(e.value)
    assert "ram://" in str(e.value)  # it says which file systems there are
    with pytest.raises(ConfigError, match="nosuchfs://.*plugin"):
        fileio.check_schemes({"data_dir": "", "output_dir": "nosuchfs://x"})
