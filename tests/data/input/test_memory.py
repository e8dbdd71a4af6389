"""data/input/memory.py: a pipeline's train images held decoded in memory feed the batches the record pipeline
feeds, bit for bit (every augmentation that starts from the decoded image, resized images, several pipelines, a
resumed run), and are held only where that holds and the memory is allowed."""
import logging

import numpy as np
import pytest
import tensorflow as tf

from tfgpu.data.input import memory, pipeline, records
from tfgpu.tasks.multilabel import MultiLabelExamples
from tfgpu.tasks.registry import input_config


def _batches(config, info, start_step, pipelines, pipeline_id, count):
    ctx = tf.distribute.InputContext(pipelines, pipeline_id, pipelines)
    ds = pipeline.train_dataset_fn(input_config(config), info, start_step)(ctx)
    return list(ds.take(count).as_numpy_iterator())


# flip and unresized cifar are slow: "cifar" is pad_crop_flip, which the (cifar, 12) case runs with a resize
@pytest.mark.parametrize("augment,image_size", [("none", 0), pytest.param("flip", 0, marks=pytest.mark.slow),
                                                pytest.param("cifar", 0, marks=pytest.mark.slow), ("cifar", 12)])
def test_held_batches_are_the_record_pipelines_bit_for_bit(digits, monkeypatch, augment, image_size):
    """Over an epoch boundary (22 steps of 64 an epoch on one pipeline), from a resumed step, on 2 pipelines."""
    config, info = digits(global_batch_size=64, augment=augment, image_size=image_size, shuffle_buffer=300)
    built = []
    real = memory.holds
    monkeypatch.setattr(memory, "holds", lambda *a, **k: built.append(real(*a, **k)) or built[-1])
    for pipelines, pipeline_id, start in ((1, 0, 0), (2, 1, 7)):
        held = _batches(config, info, start, pipelines, pipeline_id, 30)
        with monkeypatch.context() as m:
            m.setattr(memory, "AUTO_BYTES", 0)
            read = _batches(config, info, start, pipelines, pipeline_id, 30)
        assert len(held) == len(read) == 30
        for (x_held, y_held), (x_read, y_read) in zip(held, read):
            assert x_held.shape == (64 // pipelines, image_size or 8, image_size or 8, 1)
            np.testing.assert_array_equal(x_held, x_read)
            np.testing.assert_array_equal(y_held, y_read)
    assert built == [True, False, True, False]  # held, then read, for each topology


def test_held_only_where_the_batches_stay_the_same_and_the_memory_is_allowed(digits, monkeypatch, caplog):
    config, info = digits(global_batch_size=64)
    order = pipeline.share_order(input_config(config), info, 1, 0)
    examples = records.Examples(input_config(config), info)
    with caplog.at_level(logging.INFO, logger="tfgpu"):
        assert memory.holds(input_config(config), examples, [order], 0)
    assert "input pipeline 0 holds its 1438 train images decoded in memory (0.1 MiB, at most 256 MiB)" in caplog.text
    assert memory.decoded_bytes(examples, [order]) == 1438 * 8 * 8 * 1
    # imagenet decodes only each record's crop window: no decoded image to hold
    imagenet, _ = digits(global_batch_size=64, augment="imagenet", image_size=8)
    assert not memory.holds(input_config(imagenet), examples, [order], 0)
    # a task's own label() parses each record itself (multi-label)
    assert not memory.holds(input_config(config), MultiLabelExamples(input_config(config), info), [order], 0)
    # larger than AUTO_BYTES: held with --cache only
    monkeypatch.setattr(memory, "AUTO_BYTES", 1000)
    assert not memory.holds(input_config(config), examples, [order], 0)
    cached, _ = digits(global_batch_size=64, cache=True)
    assert memory.holds(input_config(cached), examples, [order], 0)
