"""The output directory: writes stay inside it; a finished dataset is replaced only once the new one is complete."""
import json
import os
import subprocess

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tfgpu.config import ConfigError
from tfgpu.data.conversion import outdir


def test_paths_outside_the_directory_are_refused(tmp_path):
    d = str(tmp_path / "out")
    os.makedirs(d)
    assert outdir.inside(d, os.path.join(d, "train-00000-of-00001.tfrecord"))
    for bad in ("../x-00000-of-00001.tfrecord", "/tmp/x.tfrecord", "sub/x.tfrecord"):
        with pytest.raises(RuntimeError, match="not a file directly in"):
            outdir.inside(d, os.path.join(d, bad))


def test_publish_swaps_staged_shards_in_and_removes_earlier_plans(tmp_path):
    d = tmp_path
    os.makedirs(d / outdir.STATE_DIR)
    (d / "dataset.json").write_text("{}")
    (d / "train-00000-of-00002.tfrecord").write_text("old 0")
    (d / "train-00001-of-00002.tfrecord").write_text("old 1")
    (d / "val-00000-of-00001.tfrecord").write_text("old val")  # not in the new plan
    (d / outdir.STATE_DIR / "val-00000-of-00001.tfrecord.json").write_text("{}")
    (d / ".train-00001-of-00002.tfrecord.staged").write_text("new 1")
    (d / "notes.txt").write_text("the user's")
    tasks = [{"path": str(d / f"train-0000{i}-of-00002.tfrecord")} for i in range(2)]
    outdir.publish(str(d), tasks, [{"staged": False}, {"staged": True}],
                   lambda: (d / "dataset.json").write_text(json.dumps({"new": True})))
    assert sorted(os.listdir(d)) == [".tfgpu-convert", "dataset.json", "notes.txt", "train-00000-of-00002.tfrecord",
                                     "train-00001-of-00002.tfrecord"]
    assert (d / "train-00001-of-00002.tfrecord").read_text() == "new 1"
    assert (d / "train-00000-of-00002.tfrecord").read_text() == "old 0"
    assert json.loads((d / "dataset.json").read_text()) == {"new": True}
    assert os.listdir(d / outdir.STATE_DIR) == []


# -- the output directory and the source folder stay apart, however either is spelled ------------------------------

# Ways to spell the source folder root/data/src (and its parent root/data) from root: real, through a symlink to it,
# through a symlink to its parent, through "..".
SOURCE_SPELLINGS = ("data/src", "link_src", "link_data/src", "data/other/../src", "link_src/../src")
PARENT_SPELLINGS = ("data", "link_data", "link_src/..", "data/other/..")
# Output directory -> what it is to the source: (parts after a spelling of the source, or of its parent), verdict.
RELATIONS = (
    ("source", (), "inside"), ("source", ("tfr",), "inside"), ("source", ("a", "b"), "inside"),
    ("source", ("cat", "..", "tfr"), "inside"), ("parent", (), "holds"), ("parent", ("other", "tfr"), "apart"),
    ("parent", ("src-tfr",), "apart"), ("parent", ("srcx",), "apart"),
)


@pytest.fixture
def tree(tmp_path):
    (tmp_path / "data" / "src" / "cat").mkdir(parents=True)
    (tmp_path / "data" / "other").mkdir()
    os.symlink(tmp_path / "data" / "src", tmp_path / "link_src")
    os.symlink("data", tmp_path / "link_data")
    return tmp_path


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(source=st.sampled_from(SOURCE_SPELLINGS), base=st.integers(0, 9), relation=st.sampled_from(RELATIONS),
       relative=st.booleans())
def test_output_and_source_folder_overlap_is_refused_however_spelled(tree, monkeypatch, source, base, relation,
                                                                     relative):
    """The output inside the source folder, or holding it, is refused whichever of symlinks, '..' and relative
    paths spell either side; an output beside the source (even one whose name starts with the source's) is not."""
    monkeypatch.chdir(tree)
    whose, parts, verdict = relation
    spellings = SOURCE_SPELLINGS if whose == "source" else PARENT_SPELLINGS
    output = os.path.join(spellings[base % len(spellings)], *parts)
    prefix = "" if relative else str(tree)
    output, source = os.path.join(prefix, output), os.path.join(prefix, source)
    if verdict == "apart":
        outdir.check_apart(output, source)
        return
    with pytest.raises(ConfigError, match="inside the source folder" if verdict == "inside" else "holds the source"):
        outdir.check_apart(output, source)


def test_an_output_reached_through_a_bind_mount_of_the_source_is_refused(tree):
    """A bind mount is an alias realpath cannot see; the device and inode comparison does."""
    alias = tree / "alias"
    alias.mkdir()
    if subprocess.run(["mount", "--bind", str(tree / "data" / "src"), str(alias)], capture_output=True).returncode:
        pytest.skip("bind mounts are not permitted here")
    try:
        with pytest.raises(ConfigError, match="inside the source folder"):
            outdir.check_apart(str(alias / "tfr"), str(tree / "data" / "src"))
    finally:
        subprocess.run(["umount", str(alias)], check=True)


def test_a_full_device_is_recognised_as_each_writer_reports_it_and_nothing_else_is():
    """Python's writes (sidecars, dataset.json) raise OSError ENOSPC/EDQUOT; TensorFlow's shard writer raises
    ResourceExhaustedError, also after crossing from a worker process (pickled)."""
    import errno
    import pickle

    import tensorflow as tf

    full = tf.errors.ResourceExhaustedError(None, None, "/out/.train-00000-of-00001.tfrecord.x.tmp; No space left")
    for error in (OSError(errno.ENOSPC, "No space left on device"), OSError(errno.EDQUOT, "Disk quota exceeded"),
                  full, pickle.loads(pickle.dumps(full))):
        assert outdir.is_out_of_space(error), error
    for error in (OSError(errno.EIO, "Input/output error"), PermissionError(13, "Permission denied"),
                  tf.errors.InternalError(None, None, "x"), MemoryError(), ValueError("ResourceExhaustedError")):
        assert not outdir.is_out_of_space(error), error


def test_a_written_shard_gets_the_umasks_mode_without_the_umask_changing(tmp_path, monkeypatch):
    """Temporary files are created 0600; a finished shard is meant to be shared: 0666 less the umask, read, never
    set (a moment of umask 0 could make another thread's files world-writable)."""
    import stat

    path = tmp_path / "shard"
    path.write_bytes(b"x")
    path.chmod(0o600)
    umask = os.umask(0o002)
    try:
        monkeypatch.setattr(os, "umask", lambda *a: pytest.fail("the process umask was set"))
        outdir.make_readable(str(path))
    finally:
        monkeypatch.undo()
        os.umask(umask)
    assert stat.S_IMODE(path.stat().st_mode) == 0o664
