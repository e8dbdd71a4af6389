"""tfgpu.fit's arguments as Keras means them (pure logic): validation_split's cut, epochs in steps with every record
trained once per epoch over any number of workers, names with a did-you-mean, messages in a Python caller's words."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tfgpu.config import ConfigError
from tfgpu.data import pipeline
from tfgpu.training import fit_arguments


@settings(max_examples=150, deadline=None)
@given(n=st.integers(2, 600), batch=st.integers(1, 64), workers=st.integers(1, 4),
       split=st.sampled_from([0.0, 0.1, 0.2, 0.25, 0.33, 0.5]), shards=st.integers(1, 5), epochs=st.integers(1, 4))
def test_validation_is_the_last_fraction_and_every_example_trains_once_per_epoch(n, batch, workers, split, shards,
                                                                                  epochs):
    """Keras' cut (floor(n * (1 - split)), the tail validates); the train split written in shards as
    data.from_dataset does, shared by data.pipeline.train_share over the workers: the shares are disjoint, hold
    every record, give every worker the same records per epoch (all but fewer than `workers` of them), and the step
    each Keras epoch ends at is the one whose batch holds that epoch's last record."""
    if split:
        try:
            at = fit_arguments.split_at(n, split)
        except ConfigError as e:
            assert e.flag == "validation_split" and int(np.floor(n * (1 - split))) in (0, n)
            return
        assert at == int(np.floor(n * (1 - split))) and 0 < at < n
        train, val = list(range(at)), list(range(at, n))
        assert len(val) == n - at and val[-1] == n - 1  # the last fraction, before any shuffling
    else:
        train = list(range(n))
    shards = min(shards, len(train))
    bounds = np.linspace(0, len(train), shards + 1).astype(int)
    files = [(f"train-{i}", int(bounds[i + 1] - bounds[i])) for i in range(shards)]
    seen, sizes = [], set()
    for pipeline_id in range(workers):
        segments, epoch_size = pipeline.train_share(files, workers, pipeline_id)
        sizes.add(epoch_size)
        for file_index, first, count in segments:
            seen.extend(int(bounds[file_index]) + first + r for r in range(count))
    assert sorted(seen) == train  # disjoint shares holding every record
    per_epoch = fit_arguments.records_per_epoch(len(train), workers)
    assert sizes == {len(train) // workers} and len(train) - per_epoch < workers
    if per_epoch == 0:
        return
    ends = fit_arguments.epoch_ends(len(train), batch, workers, epochs)
    assert len(ends) == epochs
    for k, end in enumerate(ends):
        assert (end - 1) * batch < (k + 1) * per_epoch <= end * batch


def test_epochs_follow_steps_per_epoch_and_initial_epoch():
    assert fit_arguments.epoch_ends(100, 10, 1, 3) == (10, 20, 30)
    assert fit_arguments.epoch_ends(100, 32, 1, 2) == (4, 7)  # 3.125 steps an epoch: the batch carries on
    assert fit_arguments.epoch_ends(100, 32, 1, 5, initial_epoch=3) == (4, 7)
    assert fit_arguments.epoch_ends(100, 32, 2, 3, steps_per_epoch=5) == (5, 10, 15)
    with pytest.raises(ConfigError, match="greater than initial_epoch=3"):
        fit_arguments.epoch_ends(100, 32, 1, 3, initial_epoch=3)
    assert [fit_arguments.validates(e, 2) for e in range(4)] == [False, True, False, True]


def test_a_split_leaving_no_example_on_a_side_is_refused_in_keras_words():
    with pytest.raises(ConfigError) as e:
        fit_arguments.split_at(3, 0.9)
    assert e.value.flag == "validation_split" and "Training data contains 3 samples" in str(e.value)


@pytest.mark.parametrize("name, suggested", [
    ("batchsize", "batch_size"), ("validation_date", "validation_data"), ("weight_decy", "weight_decay"),
    ("epoch", "epochs"), ("call_backs", "callbacks"),
])
def test_an_unknown_argument_gets_a_did_you_mean_over_keras_and_tfgpu_names(name, suggested):
    from tfgpu import config_sources

    with pytest.raises(ConfigError) as e:
        fit_arguments.check_names([name], config_sources.options())
    assert e.value.flag == name and "unknown argument (did you mean" in str(e.value) and suggested in str(e.value)
    fit_arguments.check_names(["global_batch_size", "eval_data", "model_dir"], config_sources.options())


def test_messages_speak_python_arguments_not_flags():
    words = fit_arguments.in_keras_words
    assert words("set --input_range=0,255") == "set input_range=(0, 255)"
    assert words("pass --global_batch_size=64 (it is kept)") == "pass batch_size=64 (it is kept)"
    assert words("or --allow_config_change=global_batch_size to") == "or allow_config_change=global_batch_size to"
    assert words("with --freeze") == "with freeze"


def test_calls_without_model_dir_get_new_directories_that_workers_agree_on(tmp_path):
    a = fit_arguments.new_run_dir(root=str(tmp_path))
    b = fit_arguments.new_run_dir(root=str(tmp_path))
    assert a != b and a.startswith(str(tmp_path))
    spec = '{"worker": ["localhost:1", "localhost:2"]}'
    first = fit_arguments.new_run_dir(spec, root="r")
    assert first.startswith("r/job-") and fit_arguments.new_run_dir(spec, root="r") != first
