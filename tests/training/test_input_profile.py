"""--profile_input's measurement leaves training unchanged, and its verdict is written by the chief only."""
import json

import tensorflow as tf

from tfgpu.training import input_profile, loop


def test_measuring_the_step_restores_every_variable(tmp_path):
    strategy = tf.distribute.get_strategy()
    weight = tf.Variable(1.0)
    resets = []

    def step_fn(batch):
        weight.assign_add(tf.reduce_sum(batch[0]))
        return {"loss": tf.reduce_sum(batch[0])}

    train_loop = loop.build_loop(strategy, step_fn, loop.accumulators(strategy, ("loss",)))  # the trainer's kind

    def dataset_fn(ctx):
        return tf.data.Dataset.from_tensors(([1.0, 2.0], [0, 1])).repeat()

    rates = input_profile.measure(strategy, lambda fn: iter(strategy.distribute_datasets_from_function(fn)),
                                  dataset_fn, train_loop, {"weight": weight}, 2, 2,
                                  lambda: resets.append(1), batches=4)
    assert float(weight.numpy()) == 1.0  # the timed steps changed it; the snapshot put it back
    assert rates["input_examples_per_sec"] > 0 and rates["compute_examples_per_sec"] > 0 and resets


def test_the_wait_share_compares_the_real_rate_with_the_step_alone(tmp_path):
    profile = {"input_examples_per_sec": 50.0, "compute_examples_per_sec": 200.0}
    result = input_profile.finish(dict(profile), 100.0, str(tmp_path), chief=True)
    assert result["input_wait_fraction"] == 0.5 and "input-bound" in result["verdict"]
    assert json.loads((tmp_path / "input_profile.json").read_text())["input_wait_fraction"] == 0.5
    input_profile.finish(dict(profile), 100.0, str(tmp_path / "worker"), chief=False)
    assert not (tmp_path / "worker").exists()
