"""The converter: every source kind, exact round trips, counts that add up, safe reruns and clear errors."""
import collections
import csv
import errno
import glob
import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import tensorflow as tf

from tests.data.conftest import CLASSES, png_bytes, save_image, tiny_tfds_examples
from tfgpu import convert as cli
from tfgpu.data.schema import tfrecord
from tfgpu.data.sources import builtin

from tests.conftest import REPO


def convert(*args, capsys=None):
    """Runs the entrypoint in this process; returns (exit code, stdout, stderr)."""
    code = cli.main([str(a) for a in args])
    if capsys is None:
        return code, "", ""
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def manifest(directory):
    return tfrecord.read_manifest(str(directory))


def read_back(directory, split):
    """[(filename, label, uint8 image, features)] of a converted split (or one read in place), read with tf.data +
    parse_example by the manifest's record keys."""
    m = manifest(directory)
    files = [os.path.join(directory, s["file"]) for s in m["splits"][split]["shards"]]
    ds = tf.data.TFRecordDataset(files, compression_type="GZIP" if m["compression"] == "gzip" else None)
    out = []
    for serialized in ds.map(lambda r: tfrecord.parse_example(r, keys=tfrecord.record_keys(m))):
        image = tfrecord.decode_image(serialized, m["image_shape"]["channels"]).numpy()
        name = serialized[tfrecord.FILENAME].numpy().decode("utf-8", "surrogateescape")  # names need not be UTF-8
        out.append((name, int(serialized[tfrecord.LABEL]), image,
                    {k: v.numpy() for k, v in serialized.items()}))
    return out


def shard_files(directory):
    return sorted(glob.glob(os.path.join(directory, "*.tfrecord")))


# -- sources and round trips -------------------------------------------------------------------------------------

@pytest.mark.parametrize("image_format", ["png", "raw"])
def test_folder_round_trip_is_pixel_identical_with_labels_and_classes(png_folder, tmp_path, image_format, capsys):
    root, images = png_folder
    out = tmp_path / "out"
    code, stdout, _ = convert(f"--source={root}", f"--output_dir={out}", f"--image_format={image_format}",
                              "--num_shards=2", capsys=capsys)
    assert code == 0
    m = manifest(out)
    assert m["classes"] == list(CLASSES)
    assert m["splits"]["train"]["num_examples"] == len(images) == 12
    assert m["splits"]["train"]["class_counts"] == {"0": 4, "1": 4, "2": 4}
    assert [s["num_examples"] for s in m["splits"]["train"]["shards"]] == [6, 6]
    assert m["image_shape"] == {"channels": 3, "channels_seen": {"3": 12}, "height_min": 10, "height_max": 13,
                                "height_mean": 11.5, "width_min": 12, "width_max": 18, "width_mean": 15.0}
    for shard in m["splits"]["train"]["shards"]:
        assert tfrecord.sha256_file(str(out / shard["file"])) == shard["sha256"]
    records = read_back(str(out), "train")
    assert sorted(r[0] for r in records) == sorted(images)
    for filename, label, image, features in records:
        expected, class_name = images[filename]
        assert m["classes"][label] == class_name
        np.testing.assert_array_equal(image, expected)
        assert features[tfrecord.FORMAT].decode() == image_format
        assert (features[tfrecord.HEIGHT], features[tfrecord.WIDTH], features[tfrecord.CHANNELS]) == expected.shape
    # Shards mix classes (the folder listing is sorted by class; the converter shuffles with --seed).
    first_shard_labels = {r[1] for r in records[:6]}
    assert len(first_shard_labels) > 1
    assert "train: 12 examples in 2 shard(s)" in stdout


def test_keep_stores_the_source_bytes_untouched(mixed_folder, tmp_path):
    out = tmp_path / "out"
    assert convert(f"--source={mixed_folder}", f"--output_dir={out}", "--skip_bad") == (0, "", "")
    records = read_back(str(out), "train")
    assert len(records) == 15
    formats = collections.Counter()
    for filename, _, image, features in records:
        with open(os.path.join(mixed_folder, filename), "rb") as f:
            assert features[tfrecord.ENCODED] == f.read(), filename
        formats[features[tfrecord.FORMAT].decode()] += 1
        assert image.shape == (16, 20, 3)
    assert formats == {"jpeg": 6, "png": 3, "bmp": 3, "gif": 3}
    assert manifest(out)["image_format"] == "keep"


def test_corrupt_image_stops_the_run_naming_it(mixed_folder, tmp_path, capsys):
    out = tmp_path / "out"
    code, _, err = convert(f"--source={mixed_folder}", f"--output_dir={out}", capsys=capsys)
    assert code == 1
    error = [line for line in err.splitlines() if line.startswith("error: ")]
    assert len(error) == 1 and os.path.join(mixed_folder, "dog", "broken.jpg") in error[0], err
    assert "--skip_bad" in error[0] and "cannot decode" in error[0]
    assert not os.path.exists(out / "dataset.json")
    assert shard_files(str(out)) == []
    assert not [f for f in os.listdir(out) if f.endswith(".tmp")]
    # Nothing was finished there, so other options may take the directory without --overwrite.
    assert convert(f"--source={mixed_folder}", f"--output_dir={out}", "--skip_bad", "--image_format=png")[0] == 0


def test_skip_bad_counts_and_names_the_skipped(mixed_folder, tmp_path, capsys):
    out = tmp_path / "out"
    code, stdout, _ = convert(f"--source={mixed_folder}", f"--output_dir={out}", "--skip_bad",
                              "--split=train:0.6,val:0.4", "--image_format=png", capsys=capsys)
    assert code == 0
    m = manifest(out)
    broken = os.path.join(mixed_folder, "dog", "broken.jpg")
    assert [s["path"] for s in m["skipped"]] == [broken] and m["num_skipped"] == 1
    assert "cannot decode" in m["skipped"][0]["reason"]
    total = sum(e["num_examples"] for e in m["splits"].values())
    sources = sum(e["num_sources"] for e in m["splits"].values())
    assert sources == 16 and total == sources - 1 == 15  # counts == sources - skipped
    for split, entry in m["splits"].items():
        assert entry["num_examples"] == entry["num_sources"] - entry["num_skipped"]
        assert entry["num_examples"] == sum(s["num_examples"] for s in entry["shards"])
        assert entry["num_examples"] == sum(entry["class_counts"].values()) == len(read_back(str(out), split))
    assert "skipped 1 bad image(s)" in stdout


def test_presplit_folders_keep_their_splits(split_folder, tmp_path):
    out = tmp_path / "out"
    assert convert(f"--source={split_folder}", f"--output_dir={out}")[0] == 0
    m = manifest(out)
    assert m["classes"] == list(CLASSES)
    assert {s: e["num_examples"] for s, e in m["splits"].items()} == {"train": 9, "val": 3}
    assert m["splits"]["val"]["class_counts"] == {"0": 1, "1": 1, "2": 1}
    assert all(name.startswith("val/") for name, *_ in read_back(str(out), "val"))
    assert m["image_shape"]["height"] == m["image_shape"]["width"] == 8


def test_split_of_a_presplit_source_cuts_its_train_split(split_folder, tmp_path, capsys):
    out = tmp_path / "out"
    assert convert(f"--source={split_folder}", f"--output_dir={out}", "--split=train:0.67,holdout:0.33")[0] == 0
    m = manifest(out)
    assert {s: e["num_examples"] for s, e in m["splits"].items()} == {"train": 6, "holdout": 3, "val": 3}
    code, _, err = convert(f"--source={split_folder}", f"--output_dir={tmp_path / 'o2'}",
                           "--split=train:0.5,val:0.5", capsys=capsys)
    assert code == 1 and "error: --split:" in err and "'val'" in err


def test_csv_and_tsv_sources(png_folder, tmp_path):
    root, images = png_folder
    listing = os.path.join(root, "labels.csv")
    with open(listing, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["path", "label"])
        for rel, (_, c) in images.items():
            writer.writerow([rel, c])
    out = tmp_path / "out"
    assert convert(f"--source={listing}", f"--output_dir={out}", "--image_format=png",
                   "--split=train:0.75,val:0.25")[0] == 0
    m = manifest(out)
    assert m["classes"] == list(CLASSES)
    assert {s: e["num_examples"] for s, e in m["splits"].items()} == {"train": 9, "val": 3}
    assert m["splits"]["val"]["class_counts"] == {"0": 1, "1": 1, "2": 1}  # stratified
    for filename, label, image, _ in read_back(str(out), "train") + read_back(str(out), "val"):
        np.testing.assert_array_equal(image, images[filename][0])
        assert m["classes"][label] == images[filename][1]

    # TSV with integer labels and a split column; a path that is absolute.
    tsv = tmp_path / "list.tsv"
    rows = [f"{os.path.join(root, rel)}\t{CLASSES.index(c)}\t{'val' if rel.endswith('0.png') else 'train'}"
            for rel, (_, c) in images.items()]
    tsv.write_text("\n".join(rows) + "\n")
    out2 = tmp_path / "out2"
    assert convert(f"--source={tsv}", f"--output_dir={out2}")[0] == 0
    m2 = manifest(out2)
    assert m2["classes"] == ["0", "1", "2"]
    assert {s: e["num_examples"] for s, e in m2["splits"].items()} == {"train": 9, "val": 3}


def test_npz_grayscale_raw_round_trip_and_seeded_stratified_split(tmp_path):
    rng = np.random.default_rng(4)
    x = rng.integers(0, 256, (40, 7, 9), dtype=np.uint8)
    y = np.repeat(np.arange(4), 10)
    path = tmp_path / "arrays.npz"
    np.savez(path, x=x, y=y, classes=np.array(["a", "b", "c", "d"]))

    def run(name, seed):
        out = tmp_path / name
        assert convert(f"--source={path}", f"--output_dir={out}", "--image_format=raw", "--split=train:0.8,val:0.2",
                       f"--seed={seed}")[0] == 0
        return out, manifest(out)

    out, m = run("a", 0)
    assert m["classes"] == ["a", "b", "c", "d"] and m["image_shape"]["channels"] == 1
    assert m["splits"]["val"]["class_counts"] == {"0": 2, "1": 2, "2": 2, "3": 2}
    val = read_back(str(out), "val")
    for filename, label, image, _ in val + read_back(str(out), "train"):
        index = int(filename.split("/")[1])
        np.testing.assert_array_equal(image[..., 0], x[index])
        assert label == y[index]
    same = {r[0] for r in read_back(str(run("b", 0)[0]), "val")}
    other = {r[0] for r in read_back(str(run("c", 1)[0]), "val")}
    assert same == {r[0] for r in val} and other != same


def test_builtin_digits_is_read_by_the_training_pipeline(tmp_path):
    from tfgpu.config import Config
    from tfgpu.data import catalog

    out = tmp_path / "digits"
    assert convert("--source=digits", f"--output_dir={out}", "--num_shards=3")[0] == 0
    m = manifest(out)
    sizes = {s: len(y) for s, (_, y) in builtin.load_builtin("digits")["splits"].items()}
    assert sum(sizes.values()) == 1797
    assert {s: e["num_examples"] for s, e in m["splits"].items()} == sizes
    assert m["classes"] == [str(i) for i in range(10)]
    info = catalog.prepare(Config(model_dir="unused", data_dir=str(out)))
    assert info.image_shape == (8, 8, 1) and info.num_classes == 10 and info.eval_split == "val"
    assert info.split_sizes == sizes


def test_tfds_source_from_a_locally_prepared_builder(tfds_dir, tmp_path, capsys):
    out = tmp_path / "out"
    assert convert("--source=tfds:tfgpu_tiny_shapes", f"--tfds_data_dir={tfds_dir}", f"--output_dir={out}")[0] == 0
    m = manifest(out)
    assert m["classes"] == list(CLASSES)
    assert {s: e["num_examples"] for s, e in m["splits"].items()} == {"train": 20, "test": 6}
    for split, n, seed in (("train", 20, 0), ("test", 6, 1)):
        expected = collections.Counter((label, image.tobytes()) for image, label in tiny_tfds_examples(n, seed))
        got = collections.Counter((label, image.tobytes()) for _, label, image, _ in read_back(str(out), split))
        assert got == expected
    assert m["image_shape"]["height"] == 12 and m["image_shape"]["width"] == 10

    # --split re-cuts its train split; test stays.
    out2 = tmp_path / "out2"
    assert convert("--source=tfds:tfgpu_tiny_shapes", f"--tfds_data_dir={tfds_dir}", f"--output_dir={out2}",
                   "--split=train:0.75,val:0.25", "--image_format=jpeg")[0] == 0
    assert {s: e["num_examples"] for s, e in manifest(out2)["splits"].items()} == {"train": 15, "val": 5, "test": 6}

    # Not prepared and no --download: a one-line error, nothing fetched.
    code, _, err = convert("--source=tfds:mnist", f"--tfds_data_dir={tmp_path / 'empty'}",
                           f"--output_dir={tmp_path / 'o3'}", capsys=capsys)
    assert code == 1 and "error: --download: tfds:mnist is not prepared" in err


def test_resize_and_gzip(png_folder, tmp_path):
    root, _ = png_folder
    out = tmp_path / "short"
    assert convert(f"--source={root}", f"--output_dir={out}", "--image_format=png", "--resize=6",
                   "--compression=gzip")[0] == 0
    m = manifest(out)
    assert m["compression"] == "gzip" and m["image_shape"]["height_min"] == 6
    assert all(min(r[2].shape[:2]) == 6 for r in read_back(str(out), "train"))
    out = tmp_path / "exact"
    assert convert(f"--source={root}", f"--output_dir={out}", "--image_format=jpeg", "--resize=16x12")[0] == 0
    assert {r[2].shape for r in read_back(str(out), "train")} == {(12, 16, 3)}


def test_resize_without_an_image_format_keeps_jpeg_as_jpeg_and_the_rest_as_png(mixed_folder, tmp_path, capsys):
    out = tmp_path / "out"
    code, _, err = convert(f"--source={mixed_folder}", f"--output_dir={out}", "--resize=8x6", "--skip_bad",
                           "--jpeg_quality=90", capsys=capsys)
    assert code == 0, err
    assert "--resize re-encodes every image: JPEG sources as JPEG at --jpeg_quality=90, the others as PNG" in err
    records = read_back(str(out), "train")
    assert len(records) == 15 and {r[2].shape for r in records} == {(6, 8, 3)}
    stored = {r[0].rsplit(".", 1)[-1]: r[3][tfrecord.FORMAT].decode() for r in records}
    assert stored == {"jpg": "jpeg", "jpeg": "jpeg", "png": "png", "bmp": "png", "gif": "png"}


@pytest.mark.slow  # ~26 s of worker start-up; the pool path stays in the default suite (a worker killed mid-shard)
def test_two_workers_write_the_same_shards_as_one(png_folder, tmp_path):
    root, _ = png_folder
    one, two = tmp_path / "one", tmp_path / "two"
    assert convert(f"--source={root}", f"--output_dir={one}", "--num_shards=4", "--image_format=png")[0] == 0
    assert convert(f"--source={root}", f"--output_dir={two}", "--num_shards=4", "--image_format=png",
                   "--workers=2")[0] == 0
    shards = lambda d: [(s["file"], s["num_examples"]) for s in manifest(d)["splits"]["train"]["shards"]]  # noqa
    assert shards(one) == shards(two) and len(shards(one)) == 4
    for shard, _ in shards(one):
        content = lambda d: [  # noqa: E731
            tf.train.Example.FromString(r.numpy()) for r in tf.data.TFRecordDataset(str(d / shard))]
        assert content(one) == content(two), shard


# -- reruns and interruptions ------------------------------------------------------------------------------------

def test_rerun_reuses_verified_shards(png_folder, tmp_path, capsys):
    root, _ = png_folder
    out = tmp_path / "out"
    args = (f"--source={root}", f"--output_dir={out}", "--num_shards=3", "--image_format=png")
    assert convert(*args, capsys=capsys)[0] == 0
    before = {f: os.stat(f).st_mtime_ns for f in shard_files(str(out))}
    first = manifest(out)
    code, _, err = convert(*args, capsys=capsys)
    assert code == 0 and "reusing 3 complete, verified shard(s) of 3" in err and "converting" not in err
    assert {f: os.stat(f).st_mtime_ns for f in shard_files(str(out))} == before
    assert manifest(out) == first


def test_interrupted_run_is_detected_and_redone(png_folder, tmp_path, capsys):
    root, _ = png_folder
    out = tmp_path / "out"
    args = (f"--source={root}", f"--output_dir={out}", "--num_shards=3", "--image_format=png")
    assert convert(*args)[0] == 0
    good = manifest(out)
    # What a killed run leaves: no manifest, a half-written temp shard, a truncated shard.
    os.unlink(out / "dataset.json")
    (out / ".train-00001-of-00003.tfrecord.abc123.tmp").write_bytes(b"partial")
    victim = out / "train-00002-of-00003.tfrecord"
    victim.write_bytes(victim.read_bytes()[:100])
    code, _, err = convert(*args, capsys=capsys)
    assert code == 0
    assert "reusing 2 complete, verified shard(s) of 3" in err and "converting 4 images into 1 shard(s)" in err
    assert manifest(out) == good
    assert not [f for f in os.listdir(out) if f.endswith(".tmp")]
    assert len(read_back(str(out), "train")) == 12


def test_killed_conversion_leaves_nothing_complete_looking_and_a_rerun_finishes(tmp_path):
    out = tmp_path / "out"
    args = [sys.executable, "-m", "tfgpu.convert", "--source=digits", f"--output_dir={out}", "--num_shards=300",
            "--workers=1"]
    proc = subprocess.Popen(args, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and proc.poll() is None:
            if len(glob.glob(str(out / ".tfgpu-convert" / "*.tfrecord.json"))) >= 3:
                break
            time.sleep(0.005)
        os.killpg(proc.pid, signal.SIGKILL)
    finally:
        proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL, "the conversion finished before it could be killed"
    assert not os.path.exists(out / "dataset.json")
    written = len(shard_files(str(out)))
    assert 3 <= written < 600
    code = cli.main(args[3:])
    assert code == 0
    m = manifest(out)
    assert sum(e["num_examples"] for e in m["splits"].values()) == 1797
    assert sum(len(read_back(str(out), s)) for s in ("train", "val")) == 1797


def test_refuses_a_directory_holding_another_dataset(png_folder, split_folder, tmp_path, capsys):
    root, _ = png_folder
    out = tmp_path / "out"
    assert convert(f"--source={root}", f"--output_dir={out}", "--num_shards=2")[0] == 0
    code, _, err = convert(f"--source={split_folder}", f"--output_dir={out}", capsys=capsys)
    assert code == 1 and "error: --output_dir:" in err and "another dataset" in err and "--overwrite" in err
    assert manifest(out)["splits"]["train"]["num_examples"] == 12  # untouched
    # Different options over the same source are another dataset too.
    assert convert(f"--source={root}", f"--output_dir={out}", "--num_shards=3", capsys=capsys)[0] == 1
    assert convert(f"--source={split_folder}", f"--output_dir={out}", "--overwrite")[0] == 0
    m = manifest(out)
    assert set(m["splits"]) == {"train", "val"}
    listed = {s["file"] for e in m["splits"].values() for s in e["shards"]}
    assert {os.path.basename(f) for f in shard_files(str(out))} == listed  # the old shards are gone

    unrelated = tmp_path / "notes"
    unrelated.mkdir()
    (unrelated / "readme.txt").write_text("mine")
    code, _, err = convert(f"--source={root}", f"--output_dir={unrelated}", capsys=capsys)
    assert code == 1 and "not empty" in err


# -- bad input ---------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("args, flag", [
    ([], "source"),
    (["--source=/nonexistent/images"], "source"),
    (["--source={root}", "--split=train:0.9,val:0.2"], "split"),
    (["--source={root}", "--split=train0.9"], "split"),
    (["--source={root}", "--image_format=webp"], "image_format"),
    (["--source={root}", "--jpeg_quality=0", "--image_format=jpeg"], "jpeg_quality"),
    (["--source={root}", "--image_format=png", "--resize=big"], "resize"),
    (["--source={root}", "--num_shards=2", "--shard_size_mb=10"], "num_shards"),
    (["--source={root}", "--num_shards=val:2"], "num_shards"),
    (["--source={root}", "--workers=x"], "workers"),
    (["--source={root}", "--compression=zstd"], "compression"),
    (["--source={root}", "--bogus=1"], "bogus"),
    (["--source={empty}"], "source"),
    (["--source={root}", "--split=train:0.99,val:0.01"], "split"),
])
def test_bad_input_is_one_line_naming_the_flag(png_folder, tmp_path, capsys, args, flag):
    root, _ = png_folder
    empty = tmp_path / "empty"
    (empty / "cat").mkdir(parents=True)
    args = [a.format(root=root, empty=empty) for a in args]
    code, _, err = convert(*args, f"--output_dir={tmp_path / 'out'}", capsys=capsys)
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert code == 1 and len(errors) == 1 and errors[0].startswith(f"error: --{flag}"), err
    assert not os.path.exists(tmp_path / "out" / "dataset.json")


# Slow: the converter's command line end to end (52 s loaded); its one-line errors and the library are tested in-
# process here.
@pytest.mark.slow
def test_command_line_exit_code_and_progress_lines(png_folder, tmp_path):
    root, _ = png_folder
    run = lambda *a: subprocess.run([sys.executable, "-m", "tfgpu.convert", *a], cwd=REPO,  # noqa: E731
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=120)
    bad = run("--source=/nonexistent", f"--output_dir={tmp_path / 'x'}")
    assert bad.returncode == 1 and "error: --source: /nonexistent does not exist" in bad.stderr
    good = run(f"--source={root}", f"--output_dir={tmp_path / 'y'}")
    assert good.returncode == 0, good.stderr[-2000:]
    progress = [line for line in good.stderr.splitlines() if line.startswith("convert: ")]
    assert progress and progress[-1].startswith("convert: images 12/12 images_per_sec=")
    assert progress[-1].endswith(" eta=0s") and "\r" not in good.stderr


def test_raw_gives_every_image_the_same_channels(tmp_path):
    rng = np.random.default_rng(5)
    root = tmp_path / "mixed_channels"
    gray = rng.integers(0, 256, (6, 7), dtype=np.uint8)
    save_image(str(root / "a" / "gray.png"), gray)
    save_image(str(root / "b" / "rgb.png"), rng.integers(0, 256, (6, 7, 3), dtype=np.uint8))
    save_image(str(root / "b" / "rgba.png"), rng.integers(0, 256, (6, 7, 4), dtype=np.uint8))
    out = tmp_path / "out"
    assert convert(f"--source={root}", f"--output_dir={out}", "--image_format=raw")[0] == 0
    m = manifest(out)
    assert m["image_shape"]["channels"] == 3 and m["image_shape"]["channels_seen"] == {"3": 3}
    records = {r[0]: r for r in read_back(str(out), "train")}
    np.testing.assert_array_equal(records["a/gray.png"][2], np.repeat(gray[..., None], 3, axis=-1))
    assert records["b/rgba.png"][3][tfrecord.CHANNELS] == 3  # alpha dropped, as the reader would


def test_output_inside_the_source_folder_and_a_second_writer_are_refused(png_folder, tmp_path, capsys):
    import fcntl

    root, _ = png_folder
    code, _, err = convert(f"--source={root}", f"--output_dir={os.path.join(root, 'tfr')}", capsys=capsys)
    assert code == 1 and "error: --output_dir:" in err and "inside the source folder" in err
    out = tmp_path / "out"
    os.makedirs(out / ".tfgpu-convert")
    with open(out / ".tfgpu-convert" / "lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        code, _, err = convert(f"--source={root}", f"--output_dir={out}", capsys=capsys)
    assert code == 1 and "another tfgpu.convert is writing to" in err
    assert convert(f"--source={root}", f"--output_dir={out}")[0] == 0  # once the other one is gone


def test_output_inside_a_symlinked_source_or_holding_the_source_is_refused(png_folder, tmp_path, capsys):
    """Issue 28 item 6: --source given through a symlink and --output_dir inside it (or the reverse) is one line,
    and nothing is written into the source."""
    root, _ = png_folder
    before = sorted(os.walk(root))
    link, up = tmp_path / "link", tmp_path / "up"
    os.symlink(root, link)
    os.symlink(tmp_path, up)
    for source, output, what in ((link, link / "tfr", "inside the source folder"),
                                 (root, link / "tfr", "inside the source folder"),
                                 (link, f"{root}/../pngs/x/..", "inside the source folder"),
                                 (link, up, "holds the source folder")):
        code, _, err = convert(f"--source={source}", f"--output_dir={output}", capsys=capsys)
        assert code == 1 and one_error(err).startswith("error: --output_dir:") and what in err, (source, output)
    assert sorted(os.walk(root)) == before


# Slow (18 s): a killed conversion leaving nothing complete-looking and workers dying with their parent stay in
# the default suite.
@pytest.mark.slow
def test_a_worker_killed_mid_shard_stops_the_run_and_a_rerun_finishes(tmp_path):
    import psutil

    out = tmp_path / "out"
    args = [sys.executable, "-m", "tfgpu.convert", "--source=digits", f"--output_dir={out}", "--num_shards=150",
            "--workers=2"]
    proc = subprocess.Popen(args, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline and proc.poll() is None:
            if len(glob.glob(str(out / ".tfgpu-convert" / "*.tfrecord.json"))) >= 2:
                break
            time.sleep(0.005)
        children = psutil.Process(proc.pid).children()
        workers = [c for c in children if "spawn_main" in " ".join(c.cmdline())]
        assert workers, "no worker processes found"
        workers[0].kill()
        _, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
    assert proc.returncode == 1, stderr[-2000:]
    assert "error: a worker process died while writing shards" in stderr
    assert not os.path.exists(out / "dataset.json")
    assert not [f for f in os.listdir(out) if f.endswith(".tmp")]
    _, alive = psutil.wait_procs(children, timeout=30)
    assert not alive, f"the converter left processes behind: {alive}"
    assert cli.main(args[3:5] + ["--num_shards=150"]) == 0
    assert sum(len(read_back(str(out), s)) for s in ("train", "val")) == 1797


# -- messy real sources: what a careful person expects ---------------------------------------------------------

def exif_jpeg(path, array, orientation):
    from PIL import Image

    exif = Image.Exif()
    exif[0x0112] = orientation
    os.makedirs(os.path.dirname(path), exist_ok=True)
    Image.fromarray(array).save(path, format="JPEG", exif=exif.tobytes(), quality=100)


def one_error(err):
    errors = [line for line in err.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and "Traceback" not in err, err
    return errors[0]


@pytest.fixture
def messy_folder(tmp_path):
    """A presplit folder as users have them: Mac zip debris, an unlabelled Kaggle test/, a symlink loop and a link into
    another class, a text file, WebP, TIFF, BMP and an EXIF-rotated JPEG; returns (root, {relpath: (pixels, class)})
    (pixels None for the rotated JPEG)."""
    rng = np.random.default_rng(17)
    root = tmp_path / "messy"
    expected = {}

    def image(rel, cls, fmt=None, **kwargs):
        from PIL import Image

        array = rng.integers(0, 256, (6, 8, 3), dtype=np.uint8)
        os.makedirs(os.path.dirname(root / rel), exist_ok=True)
        Image.fromarray(array).save(root / rel, format=fmt, **kwargs)
        expected[rel] = (array, cls)

    image("train/cat/0.png", "cat")
    image("train/cat/1.webp", "cat", "WEBP", lossless=True)
    image("train/cat/2.tif", "cat", "TIFF")
    stored = rng.integers(0, 256, (4, 8, 3), dtype=np.uint8)
    exif_jpeg(str(root / "train/cat/3.jpg"), stored, 6)
    expected["train/cat/3.jpg"] = (None, "cat")  # upright: 8 high, 4 wide
    image("train/dog/0.png", "dog")
    image("train/dog/1.bmp", "dog", "BMP")
    image("val/cat/0.png", "cat")
    image("val/dog/0.png", "dog")
    save_image(str(root / "test/0.png"), rng.integers(0, 256, (6, 8, 3), dtype=np.uint8))  # unlabelled
    save_image(str(root / "test/1.png"), rng.integers(0, 256, (6, 8, 3), dtype=np.uint8))
    for junk in ("__MACOSX/train/cat/._0.png", ".DS_Store", "train/.DS_Store", "train/cat/._0.png",
                 "train/dog/Thumbs.db"):
        os.makedirs(os.path.dirname(root / junk), exist_ok=True)
        (root / junk).write_bytes(b"\0\x05\x16\x07 AppleDouble")
    (root / "train/cat/notes.txt").write_text("not an image")
    os.symlink("..", root / "train" / "cat" / "up")
    os.symlink(os.path.join("..", "cat"), root / "train" / "dog" / "cats")
    return str(root), expected


def test_a_messy_folder_converts_to_exactly_the_expected_dataset(messy_folder, tmp_path, capsys):
    root, expected = messy_folder
    out = tmp_path / "out"
    code, stdout, err = convert(f"--source={root}", f"--output_dir={out}", capsys=capsys)
    assert code == 0, err
    m = manifest(out)
    assert m["classes"] == ["cat", "dog"]
    assert {s: (e["num_examples"], e["class_counts"]) for s, e in m["splits"].items()} == {
        "train": (6, {"0": 4, "1": 2}), "val": (2, {"0": 1, "1": 1})}
    assert {k: v["count"] for k, v in m["not_converted"].items()} == {
        "os_or_hidden": 5, "not_an_image": 1, "unlabelled_split": 2, "symlink_loop": 1, "symlink_to_other_class": 1}
    assert m["not_converted"]["unlabelled_split"]["paths"] == [os.path.join(root, "test", f"{i}.png") for i in (0, 1)]
    assert m["adjusted"] == {"exif_orientation_applied": 1, "tiff_as_png": 1}
    assert "skipping test/: its 2 image(s) are not in class folders" in err
    assert "not converted: 5 hidden or OS entries" in err and "1 symlinks into or around another class" in err
    assert m["image_shape"]["channels"] == 3
    for split in m["splits"]:
        for filename, label, image, _ in read_back(str(out), split):
            array, cls = expected[filename]
            assert m["classes"][label] == cls, filename
            if array is None:
                assert image.shape == (8, 4, 3)  # the EXIF-rotated photo, upright
            else:
                np.testing.assert_array_equal(image, array, err_msg=filename)


@pytest.mark.parametrize("split", ["../escaped", "{tmp}/abs/escaped"])
def test_csv_split_names_cannot_write_outside_the_output_dir(png_folder, tmp_path, capsys, split):
    root, images = png_folder
    split = split.format(tmp=tmp_path)
    listing = tmp_path / "list.csv"
    listing.write_text("".join(f"{os.path.join(root, rel)},{c},{split if i % 2 else 'train'}\n"
                               for i, (rel, (_, c)) in enumerate(images.items())))
    out = tmp_path / "work" / "out"
    before = set(os.listdir(tmp_path))
    code, _, err = convert(f"--source={listing}", f"--output_dir={out}", capsys=capsys)
    assert code == 1 and one_error(err).startswith(f"error: --source: {listing} line 2: split name")
    assert set(os.listdir(tmp_path)) == before and not os.path.exists(out)


def test_npz_split_names_cannot_write_outside_the_output_dir(tmp_path, capsys):
    path = tmp_path / "a.npz"
    np.savez(path, **{"x_../escaped": np.zeros((2, 4, 4), np.uint8), "y_../escaped": np.array([0, 1])})
    code, _, err = convert(f"--source={path}", f"--output_dir={tmp_path / 'out'}", capsys=capsys)
    assert code == 1 and "split name '../escaped' must be letters" in one_error(err)
    assert sorted(os.listdir(tmp_path)) == ["a.npz"]


def test_csv_integer_labels_stay_ids_with_a_header_a_bom_and_excel_floats(png_folder, tmp_path):
    root, images = png_folder
    listing = tmp_path / "labels.csv"
    rows = [f"{os.path.join(root, rel)},{CLASSES.index(c) * 2}{'.0' if i == 0 else ''}"
            for i, (rel, (_, c)) in enumerate(images.items())]
    listing.write_bytes(("\ufeffimg,label\n" + "\n".join(rows) + "\n").encode())
    out = tmp_path / "out"
    assert convert(f"--source={listing}", f"--output_dir={out}", "--image_format=png")[0] == 0
    m = manifest(out)
    assert m["classes"] == ["0", "1", "2", "3", "4"]
    assert m["splits"]["train"]["class_counts"] == {"0": 4, "1": 0, "2": 4, "3": 0, "4": 4}
    for filename, label, _, _ in read_back(str(out), "train"):
        assert label == 2 * CLASSES.index(images[os.path.relpath(filename, root)][1])


def test_an_edited_source_image_is_reconverted_not_reused(png_folder, tmp_path, capsys):
    root, images = png_folder
    out = tmp_path / "out"
    args = (f"--source={root}", f"--output_dir={out}", "--num_shards=3", "--image_format=png")
    assert convert(*args)[0] == 0
    edited = np.zeros((10, 12, 3), np.uint8)
    save_image(os.path.join(root, "cat", "0.png"), edited)
    code, _, err = convert(*args, capsys=capsys)
    assert code == 0 and "reusing 2 complete, verified shard(s) of 3" in err and "converting 4 images" in err
    got = {name: image for name, _, image, _ in read_back(str(out), "train")}
    np.testing.assert_array_equal(got["cat/0.png"], edited)


def test_exif_orientation_is_applied(tmp_path):
    rng = np.random.default_rng(8)
    root = tmp_path / "photos"
    stored = rng.integers(0, 256, (4, 8, 3), dtype=np.uint8)
    exif_jpeg(str(root / "cat" / "portrait.jpg"), stored, 8)
    save_image(str(root / "dog" / "0.png"), rng.integers(0, 256, (8, 4, 3), dtype=np.uint8))
    out = tmp_path / "out"
    assert convert(f"--source={root}", f"--output_dir={out}")[0] == 0
    m = manifest(out)
    assert m["image_shape"]["height"] == 8 and m["image_shape"]["width"] == 4
    assert m["adjusted"] == {"exif_orientation_applied": 1}
    records = {r[0]: r for r in read_back(str(out), "train")}
    assert records["cat/portrait.jpg"][3][tfrecord.FORMAT] == b"jpeg"
    assert records["cat/portrait.jpg"][2].shape == (8, 4, 3)


def test_a_grayscale_dataset_with_bmp_webp_and_tiff_trains(tmp_path):
    from PIL import Image

    rng = np.random.default_rng(9)
    root = tmp_path / "gray"
    pixels = {}
    for i, (cls, ext, kwargs) in enumerate([("a", "png", {}), ("a", "bmp", {}), ("b", "tif", {}),
                                            ("b", "jpg", {"quality": 100})]):
        array = rng.integers(0, 256, (4, 4), dtype=np.uint8)
        os.makedirs(root / cls, exist_ok=True)
        Image.fromarray(array).save(root / cls / f"{i}.{ext}", **kwargs)
        pixels[f"{cls}/{i}.{ext}"] = array
    out = tmp_path / "out"
    assert convert(f"--source={root}", f"--output_dir={out}")[0] == 0
    m = manifest(out)
    assert m["image_shape"]["channels"] == 1
    records = read_back(str(out), "train")  # decodes every record at the manifest's channels, as training does
    assert len(records) == 4
    for name, _, image, _ in records:
        if not name.endswith(".jpg"):
            np.testing.assert_array_equal(image[..., 0], pixels[name])


def test_rerunning_a_skip_bad_conversion_without_it_leaves_the_dataset(mixed_folder, tmp_path, capsys):
    out = tmp_path / "out"
    assert convert(f"--source={mixed_folder}", f"--output_dir={out}", "--skip_bad")[0] == 0
    good = manifest(out)
    shards = {f: tfrecord.sha256_file(f) for f in shard_files(str(out))}
    code, _, err = convert(f"--source={mixed_folder}", f"--output_dir={out}", capsys=capsys)
    assert code == 1 and "broken.jpg: cannot decode" in one_error(err)
    assert manifest(out) == good
    assert {f: tfrecord.sha256_file(f) for f in shard_files(str(out))} == shards
    assert sorted(os.listdir(out)) == sorted([os.path.basename(f) for f in shards] + [".tfgpu-convert", "dataset.json"])
    assert len(read_back(str(out), "train")) == 15


def test_a_rebuild_that_fails_leaves_the_finished_dataset_then_a_fixed_one_swaps_in(png_folder, tmp_path, capsys):
    root, _ = png_folder
    out = tmp_path / "out"
    args = (f"--source={root}", f"--output_dir={out}", "--num_shards=3", "--image_format=png")
    assert convert(*args)[0] == 0
    good = manifest(out)
    victim = os.path.join(root, "dog", "1.png")
    with open(victim, "wb") as f:
        f.write(b"\x89PNG\r\n\x1a\n truncated")
    code, _, err = convert(*args, capsys=capsys)
    assert code == 1 and f"{victim}: cannot decode" in one_error(err)
    assert manifest(out) == good and len(read_back(str(out), "train")) == 12
    save_image(victim, np.full((11, 14, 3), 7, np.uint8))
    assert convert(*args)[0] == 0
    assert not [f for f in os.listdir(out) if f.startswith(".") and f != ".tfgpu-convert"]
    got = {name: image for name, _, image, _ in read_back(str(out), "train")}
    assert len(got) == 12 and (got["dog/1.png"] == 7).all()


def test_every_image_skipped_is_refused_and_one_class_is_warned(tmp_path, capsys):
    root = tmp_path / "bad"
    for cls in ("cat", "dog"):
        os.makedirs(root / cls)
        (root / cls / "0.jpg").write_bytes(b"\xff\xd8\xff not a jpeg")
    code, _, err = convert(f"--source={root}", f"--output_dir={tmp_path / 'out'}", "--skip_bad", capsys=capsys)
    assert code == 1 and "every image of split 'train' was skipped as bad (2 of 2" in one_error(err)
    assert not os.path.exists(tmp_path / "out" / "dataset.json")

    single = tmp_path / "single"
    save_image(str(single / "faces" / "0.png"), np.zeros((4, 4, 3), np.uint8))
    code, _, err = convert(f"--source={single}", f"--output_dir={tmp_path / 'out1'}", capsys=capsys)
    assert code == 0 and "warning: only one class (faces) has images" in err


def test_files_not_converted_are_counted_by_reason(tmp_path, capsys, monkeypatch):
    rng = np.random.default_rng(10)
    root = tmp_path / "src"
    for rel in ("cat/0.png", "cat/locked/1.png", "dog/0.png"):
        save_image(str(root / rel), rng.integers(0, 256, (4, 4, 3), dtype=np.uint8))
    (root / "dog" / "1.heic").write_bytes(b"heic")
    real_scandir = os.scandir

    def scandir(path="."):
        if os.fspath(path).endswith("locked"):
            raise PermissionError(13, "Permission denied", os.fspath(path))
        return real_scandir(path)

    monkeypatch.setattr(os, "scandir", scandir)
    code, _, err = convert(f"--source={root}", f"--output_dir={tmp_path / 'out'}", capsys=capsys)
    assert code == 1 and one_error(err).startswith(f"error: {root / 'cat' / 'locked'}: cannot list this folder")
    code, _, err = convert(f"--source={root}", f"--output_dir={tmp_path / 'out'}", "--skip_bad", capsys=capsys)
    assert code == 0
    assert "not converted: 1 files that are not images tfgpu converts (by extension), 1 folders that cannot be " \
           "listed" in err
    m = manifest(tmp_path / "out")
    assert m["not_converted"] == {"not_an_image": {"count": 1, "paths": [str(root / "dog" / "1.heic")]},
                                  "unreadable_folder": {"count": 1, "paths": [str(root / "cat" / "locked")]}}
    assert m["splits"]["train"]["num_examples"] == 2


def test_names_that_are_not_utf8_convert_or_stop_in_one_line(tmp_path, capsys):
    root = os.fsencode(str(tmp_path / "src"))
    for folder in (b"cat", b"dog"):
        os.makedirs(os.path.join(root, folder))
        with open(os.path.join(root, folder, b"caf\xe9.png"), "wb") as f:
            f.write(png_bytes(np.zeros((4, 4, 3), np.uint8)))
    for extra in ([], ["--skip_bad"]):
        out = tmp_path / f"out{len(extra)}"
        code, stdout, err = convert(f"--source={tmp_path / 'src'}", f"--output_dir={out}", *extra, capsys=capsys)
        assert code == 0, err
        names = sorted(r[3][tfrecord.FILENAME] for r in read_back(str(out), "train"))
        assert names == [b"cat/caf\xe9.png", b"dog/caf\xe9.png"]
    os.makedirs(os.path.join(root, b"\xe9t\xe9"))
    with open(os.path.join(root, b"\xe9t\xe9", b"0.png"), "wb") as f:
        f.write(png_bytes(np.zeros((4, 4, 3), np.uint8)))
    code, _, err = convert(f"--source={tmp_path / 'src'}", f"--output_dir={tmp_path / 'o3'}", capsys=capsys)
    assert code == 1 and "\\xe9t\\xe9: a class folder name must be UTF-8" in one_error(err)


def test_an_output_dir_that_cannot_be_written_is_one_line(png_folder, tmp_path, capsys, monkeypatch):
    root, _ = png_folder
    out = tmp_path / "readonly"
    out.mkdir()
    real_makedirs = os.makedirs

    def makedirs(path, *args, **kwargs):
        if os.fspath(path).startswith(str(out)) and not os.path.isdir(path):
            raise PermissionError(13, "Permission denied", os.fspath(path))
        return real_makedirs(path, *args, **kwargs)

    monkeypatch.setattr(os, "makedirs", makedirs)
    code, _, err = convert(f"--source={root}", f"--output_dir={out}", capsys=capsys)
    assert code == 1 and one_error(err) == f"error: --output_dir: cannot write to {out}: Permission denied"


@pytest.mark.parametrize("case", ["empty arrays", "object dtype", "text file", "empty file", "npy file"])
def test_npz_files_that_cannot_be_used_are_one_line_naming_them(tmp_path, capsys, case):
    path = tmp_path / "data.npz"
    if case == "empty arrays":
        np.savez(path, x=np.zeros((0, 4, 4), np.uint8), y=np.zeros((0,), np.int64))
    elif case == "object dtype":
        np.savez(path, x=np.array([np.zeros((4, 4), np.uint8), None], dtype=object), y=np.array([0, 1]))
    elif case == "text file":
        path.write_text("x,y\n1,2\n")
    elif case == "empty file":
        path.write_bytes(b"")
    else:
        with open(path, "wb") as f:
            np.save(f, np.zeros((2, 4, 4), np.uint8))
    code, _, err = convert(f"--source={path}", f"--output_dir={tmp_path / 'out'}", capsys=capsys)
    assert code == 1 and one_error(err).startswith(f"error: --source: {path}")


def test_rgba_npz_drops_alpha_as_the_docs_say(tmp_path, capsys):
    rng = np.random.default_rng(11)
    x = rng.integers(0, 256, (6, 4, 4, 4), dtype=np.uint8)
    path = tmp_path / "rgba.npz"
    np.savez(path, x=x, y=np.arange(6) % 2)
    out = tmp_path / "out"
    code, _, err = convert(f"--source={path}", f"--output_dir={out}", capsys=capsys)
    assert code == 0 and "dropping the alpha channel (4 -> 3 channels)" in err
    m = manifest(out)
    assert m["image_shape"]["channels"] == 3 and m["image_shape"]["channels_seen"] == {"3": 6}
    for filename, _, image, _ in read_back(str(out), "train"):
        np.testing.assert_array_equal(image, x[int(filename.split("/")[1])][..., :3])


# -- a disk that fills up (issue 28 item 7) --------------------------------------------------------------------------

def noise_npz(tmp_path, n=240, size=48):
    """n random RGB images of size x size (raw: 6,912 bytes each, 1.6 MiB in all) in 3 classes."""
    rng = np.random.default_rng(7)
    x = rng.integers(0, 256, (n, size, size, 3), dtype=np.uint8)
    y = np.arange(n) % 3
    path = tmp_path / "noise.npz"
    np.savez(path, x=x, y=y)
    return path, collections.Counter((int(label), image.tobytes()) for image, label in zip(x, y))


def test_a_disk_too_small_for_the_dataset_is_refused_before_writing(tmp_path, small_disk, capsys):
    path, _ = noise_npz(tmp_path)
    out = small_disk(1024) / "out"
    code, _, err = convert(f"--source={path}", f"--output_dir={out}", "--image_format=raw", capsys=capsys)
    line = one_error(err)
    assert code == 1 and line.startswith(f"error: --output_dir: {out} has ") and "MiB free but this conversion " \
        "needs about 1.6 MiB" in line
    assert not shard_files(str(out)) and not os.path.exists(out / tfrecord.MANIFEST)


def test_a_disk_filling_up_mid_conversion_is_one_line_and_a_rerun_rebuilds_every_image(tmp_path, small_disk, capsys,
                                                                                       monkeypatch):
    """The estimate said it fits, the disk filled anyway: one line naming the directory and the space it needs, no
    manifest, no shard that is not complete and verified; with room, the same command finishes byte for byte."""
    from tfgpu.data.conversion import outdir

    path, expected = noise_npz(tmp_path)
    disk = small_disk(1024)
    out = disk / "out"
    # An estimate that was too low (raising=False: the test also runs, and fails, on a tree without the check).
    monkeypatch.setattr(outdir, "check_space", lambda directory, needed: None, raising=False)
    code, _, err = convert(f"--source={path}", f"--output_dir={out}", "--image_format=raw", "--num_shards=4",
                           capsys=capsys)
    line = one_error(err)
    assert code == 1 and line.startswith(f"error: --output_dir: {out} ran out of space (no space left on device)")
    assert "needs about 1.6 MiB" in line and "rerun" in line
    assert not os.path.exists(out / tfrecord.MANIFEST)
    assert 0 < len(shard_files(str(out))) < 4  # those written before the disk filled: each complete and verified
    for shard in shard_files(str(out)):
        sidecar = out / ".tfgpu-convert" / (os.path.basename(shard) + ".json")
        assert tfrecord.sha256_file(shard) == json.loads(sidecar.read_text())["entry"]["sha256"]
    assert not [f for f in os.listdir(out) if f.endswith(".tmp")]

    subprocess.run(["mount", "-o", "remount,size=8m", str(disk)], check=True)
    code, _, err = convert(f"--source={path}", f"--output_dir={out}", "--image_format=raw", "--num_shards=4",
                           capsys=capsys)
    assert code == 0 and "reusing" in err
    got = collections.Counter((label, image.tobytes()) for _, label, image, _ in read_back(str(out), "train"))
    assert got == expected


def test_no_space_for_dataset_json_is_one_line_and_a_rerun_finishes(png_folder, tmp_path, capsys, monkeypatch):
    root, _ = png_folder
    out = tmp_path / "out"

    def full(directory, manifest):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(out / tfrecord.MANIFEST))

    with monkeypatch.context() as patch:
        patch.setattr(tfrecord, "write_manifest", full)
        code, _, err = convert(f"--source={root}", f"--output_dir={out}", capsys=capsys)
    assert code == 1 and one_error(err).startswith(f"error: --output_dir: {out} ran out of space")
    assert not os.path.exists(out / tfrecord.MANIFEST)
    code, _, err = convert(f"--source={root}", f"--output_dir={out}", capsys=capsys)
    assert code == 0 and "reusing" in err and manifest(out)["splits"]["train"]["num_examples"] == 12
