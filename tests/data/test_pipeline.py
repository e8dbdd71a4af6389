"""The input pipeline: exact resume by step, full epochs, and eval that sees every example once."""
import collections
import hashlib

import numpy as np
import pytest
import tensorflow as tf

from tfgpu.config import Config, ConfigError
from tfgpu.data import pipeline


@pytest.fixture(scope="module")
def digits(tmp_path_factory):
    cache = str(tmp_path_factory.mktemp("cache"))

    def make(**overrides):
        config = Config(model_dir="unused", dataset="digits", data_cache_dir=cache, **overrides)
        return config, pipeline.prepare(config)

    return make


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
            full = list(pipeline.train_dataset_fn(config, info, 0)(ctx).take(30).as_numpy_iterator())
            resumed = list(pipeline.train_dataset_fn(config, info, 24)(ctx).take(6).as_numpy_iterator())
            for (xa, ya), (xb, yb) in zip(full[24:], resumed):  # crosses the epoch boundary at step ~22
                np.testing.assert_array_equal(xa, xb)
                np.testing.assert_array_equal(ya, yb)


@pytest.mark.parametrize("cache", [False, True])
def test_each_epoch_is_a_fresh_permutation_of_the_split(digits, cache):
    config, info = digits(global_batch_size=1, cache=cache)
    images = [x[0] for x, _ in pipeline.train_dataset_fn(config, info, 0)(_ctx()).take(2 * 1438).as_numpy_iterator()]
    first, second = [_key(x) for x in images[:1438]], [_key(x) for x in images[1438:]]
    assert collections.Counter(first) == collections.Counter(second)
    assert first != second


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
        pipeline.prepare(Config(model_dir="unused", data_dir=str(tmp_path)))


def test_a_glob_trains_on_the_matching_shards_only(digits):
    config, info = digits()
    glob_config = Config(model_dir="unused", data_dir=f"{info.directory}/train-00000-of-*.tfrecord")
    subset = pipeline.prepare(glob_config)
    assert len(subset.split_files["train"]) == 1
    assert subset.num_train_examples == subset.split_files["train"][0][1] < info.num_train_examples
    assert subset.classes == info.classes and subset.eval_split == "val"
    with pytest.raises(ConfigError, match="--data_dir: .* matches none"):
        pipeline.prepare(Config(model_dir="unused", data_dir=f"{info.directory}/nothing-*.tfrecord"))
