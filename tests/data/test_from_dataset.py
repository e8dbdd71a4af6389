"""A tf.data.Dataset written once as a converted dataset: the converter's records, one clear error for each wrong
element structure, a fingerprint that ignores order but not content, reuse and refusal, a worker waiting for the
chief."""
import os

import numpy as np
import pytest
import tensorflow as tf
from hypothesis import given, settings, strategies as st

from tfgpu.config import Config, ConfigError
from tfgpu.data import builtin, catalog, elements, from_dataset, tfrecord

ARGS = {"train": "train_data", "val": "eval_data"}


@pytest.fixture(scope="module")
def digits():
    """200 train and 50 val digits (uint8 8x8x1, int64 labels)."""
    splits = builtin.load_builtin("digits")["splits"]
    (xt, yt), (xv, yv) = splits["train"], splits["val"]
    return (xt[:200], yt[:200]), (xv[:50], yv[:50])


def _ds(images, labels):
    return tf.data.Dataset.from_tensor_slices((images, labels))


def test_written_records_are_the_converters_and_the_pipeline_reads_them(digits, tmp_path):
    """Byte-identical shards to tfrecord.write_arrays (the built-in datasets' writer) for the same examples, and a
    manifest the input pipeline reads: classes from the labels, the image shape, both splits."""
    (xt, yt), (xv, yv) = digits
    out = tmp_path / "data"
    manifest = from_dataset.materialize(str(out), {"train": _ds(xt, yt), "val": _ds(xv, yv)}, ARGS)
    for split, (x, y) in (("train", (xt, yt)), ("val", (xv, yv))):
        entry = tfrecord.write_arrays(str(tmp_path / "reference"), split, x, y, num_shards=1, image_format="png")
        assert [s["sha256"] for s in manifest["splits"][split]["shards"]] == [s["sha256"] for s in entry["shards"]]
        assert manifest["splits"][split]["class_counts"] == {**{str(c): 0 for c in range(10)},
                                                           **entry["class_counts"]}
    info = catalog.prepare(Config(model_dir=str(tmp_path / "run"), data_dir=str(out)))
    assert info.num_classes == 10 and info.image_shape == (8, 8, 1)
    assert info.split_sizes == {"train": 200, "val": 50} and info.eval_split == "val"
    assert not [f for f in os.listdir(out) if f.endswith(".tmp")]


def test_unknown_cardinality_is_counted_and_num_classes_sets_the_classes(digits, tmp_path):
    (xt, yt), _ = digits
    filtered = _ds(xt, yt).filter(lambda x, y: y < 5)
    assert int(filtered.cardinality()) == tf.data.UNKNOWN_CARDINALITY
    manifest = from_dataset.materialize(str(tmp_path), {"train": filtered}, ARGS, num_classes=7)
    assert manifest["splits"]["train"]["num_examples"] == int(np.sum(yt < 5))
    assert manifest["classes"] == [str(c) for c in range(7)]


@settings(max_examples=10, deadline=None)
@given(seed=st.integers(0, 2 ** 16), n=st.integers(1, 9), batch=st.integers(1, 4))
def test_keras_batches_of_float_pixels_and_one_hot_labels_are_the_same_examples_as_uint8(seed, n, batch):
    """What keras.utils.image_dataset_from_directory gives (batches of float32 pixels, int or one-hot labels) is
    taken as the uint8 examples it holds: the same fingerprint, so the same records."""
    rng = np.random.default_rng(seed)
    images, labels = rng.integers(0, 256, (n, 3, 2, 3), dtype=np.uint8), rng.integers(0, 4, n)
    plain = from_dataset.fingerprint({"train": _ds(images, labels)}, ARGS)["splits"]["train"]
    one_hot = np.eye(4, dtype=np.float32)[labels]
    for label_form in (labels.astype(np.int32), one_hot):
        keras_like = _ds(images.astype(np.float32), label_form).batch(batch)
        accepted, note = elements.accept(keras_like, "train_data")
        assert note.startswith("train_data: elements are batches") and "float32 images: stored as uint8" in note
        taken = from_dataset.fingerprint({"train": accepted}, ARGS)["splits"]["train"]
        assert (taken["num_examples"], taken["content_hash"]) == (plain["num_examples"], plain["content_hash"])


def test_float_pixels_are_rounded_and_refused_outside_0_255_naming_the_example(tmp_path):
    images = np.full((3, 2, 2, 1), 100.0, np.float32)
    images[0, 0, 0, 0], images[1, 0, 0, 0] = 12.4, 12.6  # what a bilinear resize leaves
    from_dataset.materialize(str(tmp_path / "ok"), {"train": _ds(images, np.array([0, 1, 1]))}, ARGS)
    records = tf.data.TFRecordDataset(tf.io.gfile.glob(str(tmp_path / "ok" / "train-*")))
    written = [tf.io.decode_png(tf.train.Example.FromString(r.numpy()).features.feature["image/encoded"]
                                .bytes_list.value[0]).numpy()[0, 0, 0] for r in records]
    assert sorted(written) == [12, 13, 100]
    bad = images.copy()
    bad[2, 1, 1, 0] = 255.5
    with pytest.raises(ConfigError, match=r"example 2: pixel values span \[100, 255.5\], not within \[0, 255\]"):
        from_dataset.materialize(str(tmp_path / "bad"), {"train": _ds(bad, np.array([0, 1, 1]))}, ARGS)
    with pytest.raises(ConfigError, match=r"float pixels all lie in \[0, 1\].*x \* 255"):
        from_dataset.materialize(str(tmp_path / "unit"), {"train": _ds(images / 255, np.array([0, 1, 1]))}, ARGS)
    one_hot = np.array([[0, 1, 0], [0.5, 0.5, 0], [1, 0, 0]], np.float32)
    with pytest.raises(ConfigError, match=r"example 1: label \[0.5 0.5 0. \] is not one-hot") as e:
        from_dataset.materialize(str(tmp_path / "hot"), {"train": _ds(images, one_hot)}, ARGS)
    assert e.value.flag == "train_data"
    for name in ("bad", "unit", "hot"):
        assert not os.path.exists(tmp_path / name / tfrecord.MANIFEST)


def test_bad_labels_stop_before_a_dataset_exists(tmp_path):
    images = np.zeros((3, 4, 4, 3), np.uint8)
    with pytest.raises(ConfigError, match="example 2: label -1 is not a class index"):
        from_dataset.materialize(str(tmp_path), {"train": _ds(images, np.array([0, 1, -1]))}, ARGS)
    with pytest.raises(ConfigError, match=r"label 3 .*num_classes=3"):
        from_dataset.materialize(str(tmp_path), {"train": _ds(images, np.array([0, 3, 1]))}, ARGS, num_classes=3)
    assert not os.path.exists(tmp_path / tfrecord.MANIFEST)


@settings(max_examples=10, deadline=None)
@given(seed=st.integers(0, 2 ** 16), n=st.integers(1, 12))
def test_fingerprint_ignores_order_and_sees_any_changed_pixel_or_label(seed, n):
    rng = np.random.default_rng(seed)
    images, labels = rng.integers(0, 256, (n, 3, 3, 1), dtype=np.uint8), rng.integers(0, 4, n)
    base = from_dataset.fingerprint({"train": _ds(images, labels)}, ARGS)
    order = rng.permutation(n)
    assert from_dataset.fingerprint({"train": _ds(images[order], labels[order])}, ARGS) == base
    i = int(rng.integers(n))
    changed = images.copy()
    changed[i, 1, 2, 0] ^= 1
    relabelled = labels.copy()
    relabelled[i] += 1
    for x, y in ((changed, labels), (images, relabelled)):
        other = from_dataset.fingerprint({"train": _ds(x, y)}, ARGS)
        assert from_dataset.difference(base, other, ARGS) == ("train_data", "its content differs from the data "
                                                                           "written")


def test_ensure_reuses_matching_data_and_refuses_other_data(digits, tmp_path, monkeypatch):
    (xt, yt), (xv, yv) = digits
    out = str(tmp_path / "data")
    first = from_dataset.ensure(out, {"train": _ds(xt, yt)}, ARGS, is_chief=True)
    shard = os.path.join(out, first["splits"]["train"]["shards"][0]["file"])
    written = os.stat(shard).st_mtime_ns

    def no_writing(*args, **kwargs):
        raise AssertionError("wrote the data again")

    monkeypatch.setattr(from_dataset, "materialize", no_writing)
    again = from_dataset.ensure(out, {"train": _ds(xt, yt).shuffle(64, seed=1)}, ARGS, is_chief=True)
    assert again == first and os.stat(shard).st_mtime_ns == written
    with pytest.raises(ConfigError, match="number of examples differs .*199 now.*use a new model_dir") as e:
        from_dataset.ensure(out, {"train": _ds(xt[1:], yt[1:])}, ARGS, is_chief=True)
    assert e.value.flag == "train_data"
    with pytest.raises(ConfigError, match="is given now but was None") as e:
        from_dataset.ensure(out, {"train": _ds(xt, yt), "val": _ds(xv, yv)}, ARGS, is_chief=True)
    assert e.value.flag == "eval_data"
    with pytest.raises(ConfigError, match="worker 1 differs from the chief"):
        from_dataset.ensure(out, {"train": _ds(xt, 9 - yt)}, ARGS, is_chief=False, worker="worker 1")
    assert from_dataset.ensure(out, {"train": _ds(xt, yt)}, ARGS, is_chief=False) == first


def test_a_worker_gives_up_when_the_chief_shows_no_progress(tmp_path, monkeypatch):
    monkeypatch.setattr(from_dataset, "WAIT_STALL_S", 0.2)
    monkeypatch.setattr(from_dataset, "_POLL_S", 0.05)
    data = _ds(np.zeros((2, 4, 4, 1), np.uint8), np.array([0, 1]))
    with pytest.raises(ConfigError, match="storage every worker sees") as e:
        from_dataset.ensure(str(tmp_path), {"train": data}, ARGS, is_chief=False)
    assert e.value.flag == "model_dir"


def test_a_dataset_on_ram_is_written_reused_and_waited_for_there(digits, tmp_path, monkeypatch):
    """A directory on a TensorFlow file system (ram://, standing in for gs://): the chief writes it there (nothing
    lands on the local disk as ./ram:), a second call reuses it without writing, and a worker that starts first
    waits for the chief's dataset.json there."""
    import threading
    import uuid

    from tfgpu.runtime import fileio

    monkeypatch.chdir(tmp_path)  # a "ram://" path written through os would land here, as ./ram:
    monkeypatch.setattr(from_dataset, "_POLL_S", 0.05)
    monkeypatch.setattr(from_dataset, "WAIT_STALL_S", 5.0)
    (xt, yt), _ = digits
    out = f"ram://tfgpu-test-{uuid.uuid4().hex[:8]}/data"
    try:
        chief = threading.Timer(0.3, from_dataset.ensure, (out, {"train": _ds(xt, yt)}, ARGS, True))
        chief.start()
        waited = from_dataset.ensure(out, {"train": _ds(xt, yt)}, ARGS, is_chief=False)
        chief.join()
        assert waited["splits"]["train"]["num_examples"] == 200
        assert fileio.exists(f"{out}/{waited['splits']['train']['shards'][0]['file']}")

        def no_writing(*args, **kwargs):
            raise AssertionError("wrote the data again")

        monkeypatch.setattr(from_dataset, "materialize", no_writing)
        assert from_dataset.ensure(out, {"train": _ds(xt, yt).shuffle(64, seed=1)}, ARGS, is_chief=True) == waited
        with pytest.raises(ConfigError, match="content differs"):
            from_dataset.ensure(out, {"train": _ds(xt, 9 - yt)}, ARGS, is_chief=True)
        assert os.listdir(tmp_path) == []
    finally:
        fileio.rmtree(out.rsplit("/", 1)[0])
