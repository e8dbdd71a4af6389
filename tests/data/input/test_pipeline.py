"""The input pipeline: exact resume by step, full epochs, eval that sees every example once, and the pixel range
images reach the model in (--input_range)."""
import collections
import hashlib

import numpy as np
import pytest
import tensorflow as tf
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tfgpu.config import Config, ConfigError
from tfgpu.data import catalog
from tfgpu.data.input import pipeline
from tfgpu.data.sources import builtin
from tfgpu.tasks.registry import input_config


def _ctx(num_pipelines=1, pipeline_id=0, replicas=1):
    return tf.distribute.InputContext(num_pipelines, pipeline_id, replicas)


def _key(image):
    return hashlib.sha1(np.asarray(image).tobytes()).hexdigest()


def test_manifest_describes_the_data(digits):
    _, info = digits()
    assert info.image_shape == (8, 8, 1) and info.num_classes == 10
    assert info.split_sizes == {"train": 1438, "val": 359} and info.eval_split == "val"


@pytest.mark.parametrize("cache", [False, True])
def test_resumed_pipeline_yields_the_batches_of_an_uninterrupted_one(digits, cache):
    config, info = digits(global_batch_size=64, augment="cifar", cache=cache)
    for pipelines, replicas in ((1, 1), (2, 2)):
        for pid in range(pipelines):
            ctx = _ctx(pipelines, pid, replicas)
            full = list(pipeline.train_dataset_fn(input_config(config), info, 0)(ctx).take(30).as_numpy_iterator())
            resumed = list(pipeline.train_dataset_fn(input_config(config), info, 24)(ctx).take(6).as_numpy_iterator())
            for (xa, ya), (xb, yb) in zip(full[24:], resumed):  # crosses the epoch boundary at step ~22
                np.testing.assert_array_equal(xa, xb)
                np.testing.assert_array_equal(ya, yb)


@pytest.mark.parametrize("cache", [False, True])
def test_each_epoch_is_a_fresh_permutation_of_the_split(digits, cache):
    config, info = digits(global_batch_size=1, cache=cache)
    batches = pipeline.train_dataset_fn(input_config(config), info, 0)(_ctx()).take(2 * 1438)
    images = [x[0] for x, _ in batches.as_numpy_iterator()]
    first, second = [_key(x) for x in images[:1438]], [_key(x) for x in images[1438:]]
    assert collections.Counter(first) == collections.Counter(second)
    assert first != second


def test_a_global_seed_of_0_reads_every_epoch_as_a_permutation(digits):
    """--seed=0 sets TensorFlow's global seed to 0, under which TF compared the epochs' tensor shuffle seeds with 0
    in Python and failed before the first step (every run with --seed=0)."""
    import tensorflow as tf

    config, info = digits(global_batch_size=1)
    tf.random.set_seed(0)
    try:
        batches = pipeline.train_dataset_fn(input_config(config), info, 0)(_ctx()).take(2 * 1438)
        keys = [_key(x[0]) for x, _ in batches.as_numpy_iterator()]
    finally:
        tf.random.set_seed(None)
    assert collections.Counter(keys[:1438]) == collections.Counter(keys[1438:]) and keys[:1438] != keys[1438:]


def test_eval_sees_every_example_exactly_once_across_pipelines(digits):
    config, info = digits(global_batch_size=64, eval_batch_size=40)
    seen = collections.Counter()
    for pipelines in (1, 2):
        steps = pipeline.eval_steps(config, info, pipelines, num_replicas=2 * pipelines)
        keys = collections.Counter()
        for pid in range(pipelines):
            ds = pipeline.eval_dataset_fn(config, info, steps)(_ctx(pipelines, pid, 2 * pipelines))
            batches = list(ds.as_numpy_iterator())
            assert len(batches) == steps * 2  # the same number of batches for every replica
            for x, y, w in batches:
                for image, label, weight in zip(x, y, w):
                    if weight:
                        keys[(_key(image), int(label))] += 1
        assert sum(keys.values()) == 359
        seen = seen or keys
        assert keys == seen


def test_unknown_split_names_the_flag(digits):
    with pytest.raises(ConfigError, match="--eval_split"):
        digits(eval_split="holdout")


def test_missing_data_dir_names_the_flag(tmp_path):
    with pytest.raises(ConfigError, match="--data_dir: .*dataset.json not found"):
        catalog.prepare(Config(model_dir="unused", data_dir=str(tmp_path)))


def test_a_glob_trains_on_the_matching_shards_only(digits):
    config, info = digits()
    glob_config = Config(model_dir="unused", data_dir=f"{info.directory}/train-00000-of-*.tfrecord")
    subset = catalog.prepare(glob_config)
    assert len(subset.split_files["train"]) == 1
    assert subset.num_train_examples == subset.split_files["train"][0][1] < info.num_train_examples
    assert subset.classes == info.classes and subset.eval_split == "val"
    with pytest.raises(ConfigError, match="--data_dir: .* matches none"):
        catalog.prepare(Config(model_dir="unused", data_dir=f"{info.directory}/nothing-*.tfrecord"))


def _labels(config, info, start_step, num_records, pipelines=1, pipeline_id=0):
    ds = pipeline.train_dataset_fn(input_config(config), info, start_step)(_ctx(pipelines, pipeline_id, pipelines))
    per_replica = config.global_batch_size // pipelines
    batches = ds.take(-(-num_records // per_replica)).as_numpy_iterator()
    return [int(y) for _, labels in batches for y in labels][:num_records]


@pytest.fixture
def ids_with_a_corrupt_shard(tmp_path):
    """20 records labelled 0..19 in 2 shards; a flipped byte in shard 0 damages record 5's length header."""
    from tfgpu.data.schema import tfrecord

    entry = tfrecord.write_arrays(str(tmp_path), "train", np.zeros((20, 2, 2, 1), np.uint8), np.arange(20),
                                  num_shards=2)
    tfrecord.write_manifest(str(tmp_path), {"name": "ids", "classes": [str(i) for i in range(20)],
                                            "splits": {"train": entry}, "compression": "none",
                                            "image_shape": {"height": 2, "width": 2, "channels": 1}})
    shard = tmp_path / entry["shards"][0]["file"]
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    return str(tmp_path)


@pytest.mark.parametrize("pipelines", [1, 2])
def test_skip_corrupt_records_costs_only_the_unreadable_record(ids_with_a_corrupt_shard, pipelines, tmp_path):
    """The damaged record used to end its shard (records 5..9 never trained, their places refilled by repeats of
    others). Now only record 5 is lost: every other record once per epoch (but the remainder), resume exact."""
    config = Config(model_dir="unused", data_dir=ids_with_a_corrupt_shard, global_batch_size=pipelines,
                    skip_corrupt_records=True, shuffle_buffer=100, data_cache_dir=str(tmp_path / "cache"))
    info = catalog.prepare(config)
    epoch = 19 // pipelines
    epochs = [collections.Counter() for _ in range(3)]
    for pid in range(pipelines):
        full = _labels(config, info, 0, 3 * epoch, pipelines, pid)
        for e in range(3):
            epochs[e].update(full[e * epoch:(e + 1) * epoch])
        assert _labels(config, info, 7, 2 * epoch, pipelines, pid) == full[7:7 + 2 * epoch]
    for seen in epochs:
        assert max(seen.values()) == 1 and 5 not in seen and len(seen) == 19 - 19 % pipelines, seen


def test_cache_resume_skips_only_inside_its_epoch(digits):
    """--cache used to reach step N by pushing every record consumed before it through the shuffle again
    (about a second per million records: minutes at epoch 100,000 of digits, or at epoch 90 of ImageNet); a
    resumed run now starts at its epoch, in the uninterrupted run's order."""
    import time

    config, info = digits(global_batch_size=2, cache=True)
    epoch_100k = 100_000 * 1438 // 2
    started = time.perf_counter()
    at_epoch_start = _labels(config, info, epoch_100k, 40)
    three_steps_later = _labels(config, info, epoch_100k + 3, 34)
    assert time.perf_counter() - started < 20
    assert three_steps_later == at_epoch_start[6:]


def _eval_images(config, info):
    steps = pipeline.eval_steps(config, info, 1, 1)
    batches = pipeline.eval_dataset_fn(config, info, steps)(_ctx()).as_numpy_iterator()
    return np.concatenate([x[w > 0] for x, _, w in batches])


def test_default_range_eval_images_are_bit_identical_to_earlier_runs(digits):
    config, info = digits(eval_batch_size=128)
    before = np.asarray(builtin.load_builtin("digits")["splits"]["val"][0], np.float32) / np.float32(127.5) - 1
    after = _eval_images(config, info)
    assert collections.Counter(map(_key, after)) == collections.Counter(map(_key, before.astype(np.float32)))


@settings(max_examples=4, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.floats(-300, 300, width=32), st.floats(-300, 300, width=32))
def test_images_reach_the_model_spanning_exactly_the_input_range(digits, a, b):
    """Digits hold pixels 0 and 255: eval images span [MIN, MAX] exactly, and so do augmented train batches."""
    low, high = min(a, b), max(a, b)
    overrides = dict(eval_batch_size=128, global_batch_size=128, augment="cifar", input_range=(low, high))
    try:
        Config(model_dir="unused", dataset="digits", **overrides).check_values()
    except ConfigError as e:  # an empty, subnormal or too narrow range never reaches the pipeline: the run stops
        assert e.flag == "input_range", e
        return
    config, info = digits(**overrides)
    images = _eval_images(config, info)
    assert images.min() == np.float32(low) and images.max() == np.float32(high)
    train = np.concatenate([x for x, _ in pipeline.train_dataset_fn(input_config(config), info, 0)(_ctx()).take(2)])
    assert train.min() == np.float32(low) and train.max() == np.float32(high)


def test_synthetic_data_is_drawn_in_the_input_range():
    config = Config(model_dir="unused", dataset="synthetic", global_batch_size=16, input_range=(0.0, 255.0))
    images, _ = next(iter(pipeline.train_dataset_fn(input_config(config), catalog.prepare(config), 0)(_ctx())))
    assert 0 <= float(tf.reduce_min(images)) and 1 < float(tf.reduce_max(images)) <= 255
