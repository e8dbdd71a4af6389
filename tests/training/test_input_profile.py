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


def test_a_bad_record_met_while_profiling_is_the_same_one_line_as_in_training(tmp_path):
    """--profile_input reads the input before the first loop: a label outside the classes found there names the
    shard, the record and the label (it was a raw InvalidArgumentError)."""
    import dataclasses

    import pytest

    from tests.data.schema.test_shards import config, example, write_dataset
    from tfgpu.config import ConfigError
    from tfgpu.training import experiment

    directory, paths = write_dataset(tmp_path / "d", [[example(label) for label in range(10, 20)]], 10)
    run = dataclasses.replace(config(directory, tmp_path / "cache", model_dir=str(tmp_path / "run")),
                              model="small_cnn", eval_split="none", profile_input=True, train_steps=4,
                              steps_per_loop=2, tensorboard=False, verbose=0)
    with pytest.raises(ConfigError) as error:
        experiment.run(run)
    assert f"{paths[0]}: record " in str(error.value) and "outside [0, 10)" in str(error.value)
