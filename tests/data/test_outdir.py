"""The output directory: writes stay inside it; a finished dataset is replaced only once the new one is complete."""
import json
import os

import pytest

from tfgpu.data import outdir


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
