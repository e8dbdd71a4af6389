"""Durations (tfgpu.durations): steps, epochs or examples through one helper, the older flags keep their meaning."""
import dataclasses
import math

import hypothesis
import pytest
from hypothesis import given, strategies as st

from tfgpu import config_sources, durations
from tfgpu.config import Config, ConfigError
from tfgpu.durations import EPOCHS, EXAMPLES, STEPS, Duration

BASE = {"model_dir": "unused", "dataset": "digits"}


@pytest.mark.parametrize("text,expected", [("500", Duration(500, STEPS)), ("500steps", Duration(500, STEPS)),
                                           ("2ep", Duration(2, EPOCHS)), ("0.5 epochs", Duration(0.5, EPOCHS)),
                                           ("50000ex", Duration(50000, EXAMPLES)), (" 3EP ", Duration(3, EPOCHS))])
def test_each_form_parses(text, expected):
    assert durations.parse(text, "warmup") == expected


@pytest.mark.parametrize("text", ["2days", "ep", "-3", "1e3", "2.5", "2,5ep"])
def test_anything_else_is_one_line_naming_the_flag(text):
    with pytest.raises(ConfigError) as error:
        durations.parse(text, "eval_every")
    assert str(error.value).startswith("--eval_every: ") and "\n" not in str(error.value)


@given(epochs=st.floats(0.01, 50), steps_per_epoch=st.floats(0.5, 5000))
def test_epochs_give_the_steps_the_older_flags_gave(epochs, steps_per_epoch):
    """--train=Nep rounds up as --epochs did; --warmup=Nep rounds to nearest as --warmup_epochs did."""
    length = durations.parse(f"{epochs!r}ep", "train")
    assert durations.to_steps(length, steps_per_epoch, 64, round_up=True) == max(1, math.ceil(epochs * steps_per_epoch))
    warmup = durations.of(Config(**BASE, warmup_epochs=epochs), "warmup")
    assert durations.to_steps(warmup, steps_per_epoch, 64) == max(1, int(round(epochs * steps_per_epoch)))


@given(steps=st.integers(1, 10**6), examples_per_step=st.integers(1, 4096))
def test_examples_are_steps_of_examples_per_step(steps, examples_per_step):
    assert durations.to_steps(Duration(steps * examples_per_step, EXAMPLES), 10.0, examples_per_step) == steps
    assert durations.to_steps(durations.parse(str(steps), "train"), 10.0, examples_per_step) == steps


def test_a_few_examples_are_one_step_not_the_end_only():
    assert durations.to_steps(durations.parse("10ex", "eval_every"), 10.0, 128) == 1
    assert durations.to_steps(Duration(0, EXAMPLES), 10.0, 128) == 0


def test_an_empty_flag_falls_back_to_its_older_flags_in_order():
    config = Config(**BASE)
    assert durations.of(config, "train") == Duration(1.0, EPOCHS)  # --epochs' default
    assert durations.of(dataclasses.replace(config, train_steps=7, epochs=3.0), "train") == Duration(7, STEPS)
    assert durations.of(config, "checkpoint_every") == Duration(1000, STEPS)
    assert durations.of(config, "eval_every") == Duration(0, STEPS)
    assert durations.points(dataclasses.replace(config, lr_decay_epochs=(3.0,)), "lr_decay_at") == (
        Duration(3.0, EPOCHS),)


@pytest.mark.parametrize("flags,message", [
    ({"eval_every": "2ep", "eval_every_steps": 100}, "--eval_every: and --eval_every_steps both say the same thing"),
    ({"train": "0ep"}, "--train: must be positive, got '0ep'"),
    ({"lr_decay_at": "30ep,soon"}, "--lr_decay_at: 'soon' is not a duration"),
    ({"warmup": "1.5"}, "--warmup: '1.5': steps are whole numbers"),
])
def test_resolving_flags_checks_durations_in_one_line(flags, message):
    """Checked with the other values, before TensorFlow is imported (config_sources.resolve, references=False)."""
    with pytest.raises(ConfigError) as error:
        config_sources.resolve({**BASE, **flags}, references=False)
    assert str(error.value).startswith(message) and "\n" not in str(error.value)


def test_a_duration_flag_alone_resolves():
    config = config_sources.resolve({**BASE, "eval_every": "2ep", "warmup": "500ex"}, references=False)
    assert (config.eval_every, config.warmup) == ("2ep", "500ex")


# -- a length in epochs across global batch changes (issue 37) --------------------------------------------------------
@hypothesis.settings(max_examples=300, deadline=None)
@hypothesis.given(records=st.integers(50, 5000), epochs=st.sampled_from([0.5, 1.0, 1.5, 2.0, 3.0]),
                  segments=st.lists(st.tuples(st.integers(1, 60), st.integers(1, 256)), min_size=1, max_size=4),
                  unit=st.sampled_from([durations.EPOCHS, durations.EXAMPLES]))
@hypothesis.example(records=4096, epochs=3.0, segments=[(1, 163), (1, 5)], unit=durations.EPOCHS)  # float noise
def test_a_length_in_epochs_trains_that_many_records_whatever_batches_earlier_segments_had(records, epochs,
                                                                                           segments, unit):
    """Segments of (steps, global batch), each resumed with --allow_config_change=global_batch_size: the run's
    --train=Nep (or Nex) ends at the first step whose records reach N epochs; it was the new batch's steps for the
    whole run (1ep after 24 -> 48 at step 10 trained 960 of 1,200 records)."""
    from tfgpu.data.index import position

    step = fed = 0
    for steps, batch in segments[:-1]:
        step, fed = step + steps, fed + steps * batch
    batch = segments[-1][1]
    # The checkpoint's data position (one pipeline) gives back the records fed, whatever batches fed them.
    recorded = position.Position(fed // records, (position.Stage(1, fed % records),))
    resumed = (step, position.records_fed(recorded, records))
    assert resumed[1] == fed
    wanted = epochs * records  # records: a length in examples is given as that many
    amount = epochs if unit == durations.EPOCHS else wanted
    total = durations.train_steps(durations.Duration(amount, unit), records / batch, batch, resumed)
    trained = fed + (total - step) * batch
    if fed >= wanted:
        assert total == max(1, step)  # already trained: no step more
    else:
        assert trained >= wanted - 1e-6 and trained - batch < wanted - 1e-6
        assert durations.epochs_at(total, records / batch, batch, resumed) == pytest.approx(trained / records)


@hypothesis.settings(max_examples=200, deadline=None)
@hypothesis.given(records=st.integers(50, 5000), workers=st.integers(1, 4), per_worker=st.integers(1, 64),
                  step=st.integers(1, 400), epochs=st.sampled_from([0.5, 1.0, 2.0, 3.0]))
def test_without_a_batch_change_a_resume_counts_exactly_as_an_uninterrupted_run(records, workers, per_worker, step,
                                                                                epochs):
    """The data position's records fed, on any number of workers (an epoch leaves records % workers out), give the
    uninterrupted run's --train steps and epochs: resuming must not move the end by a step."""
    from tfgpu.data.index import position

    batch = workers * per_worker
    hypothesis.assume(records // workers >= per_worker)
    topology = position.Topology(workers, 1, batch, 1)
    fed = position.records_fed(position.from_step(step, topology, records), records)
    assert fed == step * batch
    length = durations.Duration(epochs, durations.EPOCHS)
    uninterrupted = durations.train_steps(length, records / batch, batch)
    assert durations.train_steps(length, records / batch, batch, (step, fed)) == max(uninterrupted, step)
    assert durations.epochs_at(step, records / batch, batch, (step, fed)) == pytest.approx(step * batch / records)


def test_a_point_or_an_interval_in_epochs_falls_where_the_epochs_records_end_after_a_batch_change():
    """The issue's shape: 1,200 records, 10 steps of 24 (240 records), resumed at a global batch of 48 (25 steps
    an epoch). An epoch ends at step 10 + (1200 - 240) / 48 = 30 and the second at 55: where --warmup=1ep ends and
    --eval_every=1ep evaluates. The new batch's steps counted from step 0 put them at 25 and 50 (960 and 2,160
    records)."""
    resumed, per_epoch = (10, 240), 1200 / 48
    assert durations.step_at(Duration(1, EPOCHS), per_epoch, 48, resumed) == 30
    assert durations.step_at(Duration(2400, EXAMPLES), per_epoch, 48, resumed) == 55
    assert durations.every(Duration(1, EPOCHS), 80, per_epoch, 48, resumed) == {30, 55}
    # A point behind the resumed step falls at the earlier segments' batch: 0.1 epoch (120 records) at step 5.
    assert durations.step_at(Duration(0.1, EPOCHS), per_epoch, 48, resumed) == 5
    assert durations.every(Duration(0.1, EPOCHS), 13, per_epoch, 48, resumed) == {5, 10, 12}  # 12.5 to nearest
    # Steps are steps; an interval shorter than one step is every step.
    assert durations.every(Duration(20, STEPS), 80, per_epoch, 48, resumed) == {20, 40, 60}
    assert durations.every(Duration(10, EXAMPLES), 5, per_epoch, 48, resumed) == {1, 2, 3, 4}
    assert durations.every(Duration(0, STEPS), 80, per_epoch, 48, resumed) == set()


@hypothesis.settings(max_examples=300, deadline=None)
@hypothesis.given(records=st.integers(50, 5000), every=st.sampled_from([0.25, 0.5, 1.0, 2.0]),
                  segments=st.lists(st.tuples(st.integers(1, 60), st.integers(1, 256)), min_size=1, max_size=4),
                  unit=st.sampled_from([EPOCHS, EXAMPLES]))
def test_an_interval_in_epochs_falls_at_each_multiple_of_its_records_whatever_batches_came_before(records, every,
                                                                                                  segments, unit):
    """Segments of (steps, global batch), each resumed with --allow_config_change=global_batch_size: ahead of the
    resumed step, --eval_every=Nep (or Nex) evaluates at the step nearest each multiple of N epochs of records,
    once each, whatever batches the earlier segments had."""
    step = fed = 0
    for steps, batch in segments[:-1]:
        step, fed = step + steps, fed + steps * batch
    batch = segments[-1][1]
    per_epoch, interval = records / batch, every * records
    amount = every if unit == EPOCHS else interval
    total = step + 3 * math.ceil(records / batch) + 1
    hypothesis.assume(interval > batch)  # shorter: every step
    ahead = sorted(s for s in durations.every(Duration(amount, unit), total, per_epoch, batch,
                                              (step, fed) if step else None) if s > step)

    def trained(at):  # records trained by step ``at`` of this segment
        return fed + (at - step) * batch

    multiples = [round(trained(s) / interval) for s in ahead]
    assert all(abs(trained(s) - k * interval) <= batch / 2 + 1e-6 for s, k in zip(ahead, multiples))
    assert multiples == list(range(multiples[0], multiples[0] + len(multiples))) if multiples else True
    due = [k for k in range(1, int(trained(total) / interval) + 2)
           if trained(step) + batch / 2 < k * interval < trained(total) - batch / 2 - 1e-6]
    assert set(due) <= set(multiples)


def test_without_a_batch_change_points_and_intervals_are_the_uninterrupted_runs():
    """1,438 records at 64 (22.47 steps an epoch), resumed at step 40 after 2,560 records: the same steps."""
    per_epoch, resumed = 1438 / 64, (40, 40 * 64)
    for duration in (Duration(1, EPOCHS), Duration(0.5, EPOCHS), Duration(3000, EXAMPLES)):
        assert durations.step_at(duration, per_epoch, 64, resumed) == durations.step_at(duration, per_epoch, 64)
        assert durations.every(duration, 200, per_epoch, 64, resumed) == durations.every(duration, 200, per_epoch, 64)
    assert durations.every(Duration(1, EPOCHS), 90, per_epoch, 64) == {22, 45, 67}  # each epoch's end, to nearest
    assert durations.every(Duration(1, EPOCHS), 90, per_epoch, 64, round_up=True) == {23, 45, 68}


@pytest.mark.parametrize("text,seconds", [("5min", 300.0), ("90s", 90.0), ("1.5h", 5400.0), ("20 sec", 20.0)])
def test_checkpoint_every_takes_a_time_in_seconds(text, seconds):
    duration = durations.parse(text, "checkpoint_every")
    assert durations.seconds(duration) == seconds
    assert durations.seconds(durations.parse("500", "checkpoint_every")) == 0.0
    with pytest.raises(ValueError, match="is a time"):
        durations.to_steps(duration, 10.0, 64)


@pytest.mark.parametrize("flag", ["train", "warmup", "eval_every", "lr_decay_at"])
def test_only_checkpoint_every_takes_a_time(flag):
    with pytest.raises(ConfigError) as error:
        durations.check(Config(**BASE, **{flag: "5min"}))
    assert str(error.value).startswith(f"--{flag}: '5min' is a time; only --checkpoint_every takes one")
    with pytest.raises(ConfigError, match="a time must be positive"):
        durations.parse("0min", "checkpoint_every")
