"""The training loop under each strategy: agreement across replicas, exact resume, preemption, lost peers,
skipped (non-finite) steps and the schedule, failing kernels, quickstart."""
import os
import re
import signal
import sys

import numpy as np
import pytest

from tests.conftest import checkpoint_weights, preempted, read_history, read_metrics
from tfgpu.runtime import run_dir

SMALL = ["--dataset=digits", "--model=resnet20", "--global_batch_size=64", "--eval_split=none", "--verbose=2"]


def _model_weights(model_dir):
    weights = checkpoint_weights(model_dir)
    assert any("kernel" in k or "_trainable_variables" in k for k in weights), sorted(weights)
    return weights


# Slow (23 s loaded; issue 54): tests/test_multi_worker.py::test_two_workers_through_the_launcher_match_mirrored_two_
# replicas trains the same small_cnn (8 steps, loops of 4, synchronized BatchNorm) on one device, 2 mirrored replicas
# and 2 workers by default, and holds all three to these tolerances.
@pytest.mark.slow
def test_mirrored_two_replicas_matches_one_device(run_train, train_here, tmp_path):
    """2 logical CPU replicas, 4 steps per loop, synchronized BN: same losses and weights as one device.

    Tolerance: 1e-4 on the per-loop mean loss; 1e-4 absolute plus 1e-4 relative on weights and BN statistics
    (float32 sums taken in another order). small_cnn, because a deeper net on 8x8 digits amplifies that
    reordering past any useful tolerance within a few steps on CPUs whose kernels split batches differently
    (ResNet-20 drifts 5e-2 relative in 8 steps with oneDNN limited to AVX2, or with oneDNN off).
    """
    common = SMALL + ["--model=small_cnn", "--train_steps=8", "--steps_per_loop=4", "--sync_batch_norm",
                      "--deterministic"]
    train_here(*common, "--distribution_strategy=one_device", f"--model_dir={tmp_path / 'one'}")  # the whole CPU
    mirrored = run_train(*common, "--cpu_logical_devices=2", "--distribution_strategy=mirrored",
                         f"--model_dir={tmp_path / 'two'}")
    assert "strategy=mirrored replicas=2" in mirrored.output
    one, two = read_history(tmp_path / "one"), read_history(tmp_path / "two")
    assert [r["step"] for r in one] == [r["step"] for r in two] == [4, 8]
    np.testing.assert_allclose([r["loss"] for r in two], [r["loss"] for r in one], atol=1e-4)
    assert one[-1]["loss"] < one[0]["loss"]
    w1, w2 = _model_weights(tmp_path / "one"), _model_weights(tmp_path / "two")
    assert w1.keys() == w2.keys() and len(w1) > 10
    for name in w1:
        np.testing.assert_allclose(w2[name], w1[name], rtol=1e-4, atol=1e-4, err_msg=name)


def test_continuing_a_finished_run_equals_one_long_run(train_here, tmp_path):
    """Train N steps, rerun with 2N: resumes at N and ends with the weights of an uninterrupted 2N run."""
    common = SMALL + ["--model=small_cnn", "--lr_schedule=constant", "--deterministic", "--steps_per_loop=3",
                      "--shuffle_buffer=64"]
    train_here(*common, "--train_steps=12", f"--model_dir={tmp_path / 'straight'}")
    train_here(*common, "--train_steps=6", f"--model_dir={tmp_path / 'split'}")
    second = train_here(*common, "--train_steps=12", f"--model_dir={tmp_path / 'split'}")
    assert "resuming at step 6" in second.output
    assert [r["step"] for r in read_history(tmp_path / "split")] == [3, 6, 9, 12]
    straight, split = _model_weights(tmp_path / "straight"), _model_weights(tmp_path / "split")
    for name in straight:
        np.testing.assert_array_equal(split[name], straight[name], err_msg=name)
    assert read_metrics(tmp_path / "split")["step"] == 12


def test_tensorboard_has_train_and_validation_runs_sharing_each_metric_s_tag(train_here, tmp_path):
    train_here("--dataset=digits", "--model=small_cnn", "--global_batch_size=64", "--train_steps=4",
               "--steps_per_loop=2", "--eval_every_steps=4", "--verbose=0", f"--model_dir={tmp_path}")
    assert sorted(os.listdir(tmp_path / "summaries")) == ["train", "validation"]
    tags = {run: summary_tags(tmp_path / "summaries" / run) for run in ("train", "validation")}
    assert {"loss", "accuracy"} <= tags["train"] & tags["validation"], tags
    assert {"learning_rate", "examples_per_sec"} <= tags["train"] and "top5_accuracy" in tags["validation"]
    assert not any(tag.startswith(("val_", "train/", "eval/")) for run in tags.values() for tag in run)


# Slow (66 s): exact resume stays in the default suite through test_continuing_a_finished_run_equals_one_long_run
# and the multi-worker --max_restarts run; SIGTERM -> save -> 143 through test_launch's SIGTERM test.
@pytest.mark.slow
def test_sigterm_saves_exits_143_and_resume_is_exact(run_train, data_cache, tmp_path):
    """Preemption: SIGTERM mid-run checkpoints at a loop boundary and exits 143; the rerun finishes with the
    weights of an uninterrupted run (cosine schedule, deterministic mode)."""
    common = SMALL + ["--train_steps=120", "--steps_per_loop=2", "--deterministic", "--checkpoint_every_steps=0"]
    run_train(*common, f"--model_dir={tmp_path / 'straight'}")
    model_dir = tmp_path / "preempted"
    proc = preempted([sys.executable, "-m", "tfgpu.train", *common, f"--model_dir={model_dir}"], model_dir,
                     train_lines=2, env={"TFGPU_DATA_CACHE": data_cache}, timeout=120)
    assert proc.returncode == 143, proc.stdout[-3000:]
    assert "preempted: checkpoint saved at step" in proc.stdout
    stopped_at = read_history(model_dir)[-1]["step"]
    assert 0 < stopped_at < 120
    resumed = run_train(*common, f"--model_dir={model_dir}")
    assert f"resuming at step {stopped_at}" in resumed.output
    straight, split = _model_weights(tmp_path / "straight"), _model_weights(model_dir)
    for name in straight:
        np.testing.assert_array_equal(split[name], straight[name], err_msg=name)


# Slow: the quickstart reduced, end to end (35 s loaded); training, evaluation, the report and the target run
# in-process in tests/metrics/test_target.py, an export that loads without tfgpu in tests/examples.
@pytest.mark.slow
def test_quickstart_reduced_trains_evaluates_and_exports(run_train, tmp_path):
    model_dir = tmp_path / "qs"
    proc = run_train("--flagfile=configs/quickstart.flags", "--epochs=4", "--eval_every_steps=45",
                     f"--model_dir={model_dir}")
    metrics = read_metrics(model_dir)
    for key in ("step", "train_loss", "val_loss", "val_accuracy", "examples_per_sec"):
        assert key in metrics
    assert metrics["step"] == 90 and metrics["val_accuracy"] > 0.8, metrics
    assert "final: step=90" in proc.stdout
    evals = read_history(model_dir, "eval")
    assert [e["step"] for e in evals] == [45, 90] and evals[-1]["val_examples"] == 359
    assert (model_dir / run_dir.CONFIG_FILE).exists() and (model_dir / "export" / "model.keras").exists()
    # TensorBoard as Keras users know it: train and validation runs, the same tag for the same metric.
    tags = {run: summary_tags(model_dir / "summaries" / run) for run in ("train", "validation")}
    assert {"loss", "accuracy"} <= tags["train"] & tags["validation"], tags
    assert {"learning_rate", "examples_per_sec"} <= tags["train"] and "top5_accuracy" in tags["validation"]


def summary_tags(summary_dir) -> set:
    """The scalar tags in a TensorBoard run directory's event files."""
    import tensorflow as tf

    tags = set()
    for events in summary_dir.glob("events.out.tfevents.*"):
        for record in tf.data.TFRecordDataset(str(events)):
            tags.update(v.tag for v in tf.compat.v1.Event.FromString(record.numpy()).summary.value)
    return tags


@pytest.mark.slow
def test_quickstart_reaches_097(run_train, tmp_path):
    run_train("--flagfile=configs/quickstart.flags", f"--model_dir={tmp_path}", timeout=600)
    assert read_metrics(tmp_path)["val_accuracy"] >= 0.97


# Slow: (36 s loaded); eval exactly once per example across pipelines and padding stays in
# tests/data/input/test_pipeline.py.
@pytest.mark.slow
def test_mirrored_multiloop_eval_covers_every_example_once(run_train, tmp_path):
    """Eval under 2 replicas with a batch that does not divide the split: padding is weighted out."""
    run_train("--dataset=digits", "--model=small_cnn", "--global_batch_size=64", "--eval_batch_size=50",
              "--train_steps=4", "--steps_per_loop=2", "--cpu_logical_devices=2", f"--model_dir={tmp_path}")
    assert read_history(tmp_path, "eval")[-1]["val_examples"] == 359


# Slow (19 s): a diagnostic; the input-bound verdict's rule is tested in-process in test_report.
@pytest.mark.slow
def test_profile_input_reports_wait_share_and_leaves_training_unchanged(run_train, tmp_path):
    common = SMALL + ["--model=small_cnn", "--train_steps=30", "--steps_per_loop=5", "--deterministic"]
    run_train(*common, f"--model_dir={tmp_path / 'plain'}")
    proc = run_train(*common, "--profile_input", "--profile_steps=10,15", f"--model_dir={tmp_path / 'profiled'}")
    profile = __import__("json").loads((tmp_path / "profiled" / "input_profile.json").read_text())
    assert 0.0 <= profile["input_wait_fraction"] <= 1.0 and profile["input_examples_per_sec"] > 0
    assert "input-bound" in profile["verdict"] and "input profile:" in proc.output
    assert list((tmp_path / "profiled" / "profile").rglob("*.xplane.pb"))
    plain, profiled = _model_weights(tmp_path / "plain"), _model_weights(tmp_path / "profiled")
    for name in plain:
        np.testing.assert_array_equal(profiled[name], plain[name], err_msg=name)


def test_a_peer_lost_outside_the_train_loop_is_reported_as_worker_lost(tmp_path, data_cache):
    """A worker killed while the survivor is between loops (the preemption vote, a checkpoint, an eval) must
    exit like one killed mid-loop: WorkerLost (exit 129, what --max_restarts acts on), naming the last
    finished step and the checkpoint to resume from; not a raw TensorFlow traceback (exit 1)."""
    import dataclasses

    import keras
    import tensorflow as tf

    from tfgpu.runtime import failures
    from tfgpu.training import experiment
    from tfgpu.config import Config

    config = Config(model_dir=str(tmp_path), dataset="digits", data_cache_dir=data_cache, model="small_cnn",
                    global_batch_size=64, train_steps=8, steps_per_loop=2, checkpoint_every_steps=2,
                    eval_split="none", tensorboard=False, verbose=0)
    built = experiment.setup(config)
    run = built.trainer
    run.placement = dataclasses.replace(run.placement, num_workers=2)  # what a survivor of two sees
    votes = []

    def vote_after_the_peer_died():
        votes.append(run.step.numpy())
        if len(votes) == 2:
            raise tf.errors.UnavailableError(None, None, "Collective ops is aborted by: task 1 stopped heartbeats")
        return False

    run.stopping.any_worker_preempted = vote_after_the_peer_died
    try:
        with pytest.raises(failures.WorkerLost, match=r"worker 0: a collective failed after step 4 .*aborted by.*"
                           r"Last checkpoint: .*" + re.escape(run_dir.CHECKPOINT_PREFIX) + r"2; rerun the same launch"):
            run.train()
    finally:
        keras.backend.clear_session(free_memory=False)


# -- skipped (non-finite) steps, in-process --------------------------------------------------------
def _trainer_skipping(tmp_path, data_cache, skip, **overrides):
    """An in-process classification trainer whose step ``s`` (0-based) trains on a NaN batch when ``skip(s)``."""
    import tensorflow as tf

    from tfgpu.training import experiment
    from tfgpu.config import Config

    values = dict(model_dir=str(tmp_path), dataset="digits", data_cache_dir=data_cache, model="small_cnn",
                  global_batch_size=16, train_steps=24, steps_per_loop=4, eval_split="none", tensorboard=False,
                  verbose=0, lr_schedule="constant")
    values.update(overrides)
    built = experiment.setup(Config(**values))
    run, task = built.trainer, built.task
    poisoned = tf.constant([bool(skip(s)) for s in range(64)])
    step = task.train_step

    def train_step(batch):
        images, labels = batch
        nan_if_skipped = tf.where(tf.gather(poisoned, run.step), np.float32("nan"), np.float32(1.0))
        return step((tf.cast(images, tf.float32) * nan_if_skipped, labels))

    task.train_step = train_step
    return run, task


def test_scattered_skips_do_not_stop_the_run(tmp_path, data_cache):
    """Runs of 2 skipped steps, each across a loop boundary, every 8 steps, never make 3 in a row: the run with
    --max_nonfinite_steps=3 finishes (it stopped with exit 2 when skips of consecutive loops were added up)."""
    import keras

    run, _ = _trainer_skipping(tmp_path, data_cache, lambda s: s % 8 in (3, 4), max_nonfinite_steps=3)
    try:
        final = run.train()
        assert final.step == 24
        assert final.target is None  # no --target: metrics.json gains nothing of it
    finally:
        keras.backend.clear_session(free_memory=False)
    assert [r["nonfinite_steps"] for r in read_history(tmp_path)] == [1, 1, 1, 1, 1, 1]


def test_consecutive_skips_across_a_loop_boundary_stop_the_run(tmp_path, data_cache, monkeypatch):
    import keras

    from tfgpu.runtime import failures

    feeds = _recorded_feeds(monkeypatch)
    run, _ = _trainer_skipping(tmp_path, data_cache, lambda s: 6 <= s < 9, max_nonfinite_steps=3)
    try:
        with pytest.raises(failures.NonFiniteError, match=r"^3 consecutive steps \(no finite step between them.*"
                           r"by step 12 \(--max_nonfinite_steps=3; scattered skips do not count"):
            run.train()
    finally:
        keras.backend.clear_session(free_memory=False)
    assert feeds[0].iterator is None  # a run that stops on an error lets go of its train input too


def test_the_schedule_follows_the_trainer_step_through_skips_and_a_resume(tmp_path, data_cache):
    """The learning rate at step s is schedule(s) whether or not earlier steps were skipped (they advance the
    trainer's step, not optimizer.iterations), and a resumed run continues on the same schedule."""
    import keras

    skip = lambda s: s < 3 or s == 5  # noqa: E731
    warmup = dict(warmup_steps=20, base_learning_rate=0.256)  # 0.016 * (s + 1) / 20 at step s
    expected = lambda s: 0.016 * (s + 1) / 20  # noqa: E731
    run, task = _trainer_skipping(tmp_path, data_cache, skip, train_steps=8, **warmup)
    try:
        assert run.train().step == 8
    finally:
        keras.backend.clear_session(free_memory=False)
    history = read_history(tmp_path)
    assert [r["step"] for r in history] == [4, 8]
    for record in history:  # the rate the next step uses
        assert record["learning_rate"] == pytest.approx(expected(record["step"]), rel=1e-6), record
    resumed, task = _trainer_skipping(tmp_path, data_cache, skip, train_steps=12, **warmup)
    try:
        assert resumed.restore() == 8
        assert int(task.optimizer.iterations.numpy()) == 4  # 8 steps, 4 of them skipped
        assert float(task.optimizer.learning_rate) == pytest.approx(expected(8), rel=1e-6)
    finally:
        keras.backend.clear_session(free_memory=False)


def test_setup_returns_a_trainer_built_whole_around_one_step_counter(tmp_path, data_cache):
    """The trainer is built by its constructor: the task built with the run's one step counter (the one the loop
    advances and checkpoints save), the loops, the checkpointer; ``restore`` only restores (before: it built them,
    and the trainer set ``task.global_step`` after the task was made)."""
    import keras

    from tfgpu.config import Config
    from tfgpu.training import experiment

    config = Config(model_dir=str(tmp_path), dataset="digits", data_cache_dir=data_cache, model="small_cnn",
                    global_batch_size=16, train_steps=2, eval_split="none", tensorboard=False, verbose=0)
    try:
        built = experiment.setup(config)
        run, task = built.trainer, built.task
        assert task.global_step is run.step is run.checkpointer.step and task.model.built
        parts = (run.checkpointer, run._train_loop, run.evaluation.loop, task.model, task.optimizer)
        assert run.restore() == 0
        assert all(now is before for now, before in zip(
            (run.checkpointer, run._train_loop, run.evaluation.loop, task.model, task.optimizer), parts))
    finally:
        keras.backend.clear_session(free_memory=False)


# -- a failing kernel is not a lost peer -------------------------------------------------------------
def test_a_kernel_error_fails_as_itself_not_as_a_lost_worker(tmp_path, data_cache, monkeypatch):
    """A cuDNN/XLA InternalError on one of two workers ends in KernelFailed (exit 3, not retried), naming the
    step, the error and the checkpoint, instead of WorkerLost (exit 129, which clusters retry forever)."""
    import dataclasses

    import keras
    import tensorflow as tf

    from tfgpu import train
    from tfgpu.runtime import failures
    from tfgpu.training import experiment
    from tfgpu.config import Config

    config = Config(model_dir=str(tmp_path), dataset="digits", data_cache_dir=data_cache, model="small_cnn",
                    global_batch_size=16, train_steps=4, eval_split="none", tensorboard=False, verbose=0)
    run = experiment.setup(config).trainer
    run.placement = dataclasses.replace(run.placement, num_workers=2)

    def restore(**kwargs):  # where a kernel fails does not matter: every collective of train() is handled alike
        raise tf.errors.InternalError(None, None, "cuDNN launch failure : input shape ([16,8,8,1])")

    run.restore = restore
    try:
        with pytest.raises(failures.KernelFailed, match=r"worker 0: a TensorFlow kernel failed after step 0 "
                           r"\(InternalError: cuDNN launch failure.*not a lost worker.*Last checkpoint: none"):
            run.train()
    finally:
        keras.backend.clear_session(free_memory=False)

    def fails(config, **kwargs):
        raise failures.KernelFailed("worker 0: a TensorFlow kernel failed")

    monkeypatch.setattr(experiment, "run", fails)
    assert train.main(["--dataset=digits", f"--model_dir={tmp_path}"]) == failures.KERNEL_FAILED == 3


def _recorded_feeds(monkeypatch) -> list:
    """Every feed.Feed the trainer makes from now on, in order (the train input's first)."""
    from tfgpu.runtime import feed as feed_lib

    feeds = []

    class Recorded(feed_lib.Feed):
        def __init__(self, iterator):
            super().__init__(iterator)
            feeds.append(self)

    monkeypatch.setattr(feed_lib, "Feed", Recorded)
    return feeds


def test_the_train_pipeline_is_released_before_the_final_evaluation(tmp_path, data_cache, monkeypatch):
    """The train input is let go of (its destruction handed to another thread, feed.Feed.release) before the final
    evaluation: destroyed on the trainer's thread it could keep the user waiting up to a minute for the outputs."""
    import keras

    from tfgpu.config import Config
    from tfgpu.training import experiment

    feeds = _recorded_feeds(monkeypatch)
    config = Config(model_dir=str(tmp_path), dataset="digits", data_cache_dir=data_cache, model="small_cnn",
                    global_batch_size=16, train_steps=4, steps_per_loop=2, tensorboard=False, verbose=0)
    run = experiment.setup(config).trainer
    train_input_alive = []
    evaluate = run.evaluate

    def noting(step, record=True):
        train_input_alive.append(feeds[0].iterator is not None)
        return evaluate(step, record)

    run.evaluate = noting
    try:
        assert run.train().step == 4
    finally:
        keras.backend.clear_session(free_memory=False)
    assert train_input_alive == [False]


def _recorded_position(model_dir, step):
    import json

    import tensorflow as tf

    reader = tf.train.load_checkpoint(run_dir.checkpoint(model_dir, step))
    return json.loads(reader.get_tensor("data_position/.ATTRIBUTES/py_state"))


def test_a_changed_global_batch_is_refused_unless_allowed_then_carries_the_position_in_records(train_here,
                                                                                                tmp_path):
    """2 steps of 32 records, then 2 of 64: refused in one line without --allow_config_change; allowed, the run
    goes on from record 64 of the epoch (not step 2's 128 at the new batch), so its checkpoint says 192."""
    common = SMALL + ["--model=small_cnn", "--steps_per_loop=2", f"--model_dir={tmp_path}"]
    train_here(*common, "--global_batch_size=32", "--train_steps=2")
    assert _recorded_position(tmp_path, 2)["records_consumed_in_epoch"] == 64
    refused = train_here(*common, "--global_batch_size=64", "--train_steps=4", check=False)
    errors = [line for line in refused.output.splitlines() if line.startswith("error:")]
    assert refused.returncode == 1 and len(errors) == 1 and "global_batch_size" in errors[0], refused.output[-2000:]
    assert "Traceback" not in refused.output
    reseeded = train_here(*common, "--global_batch_size=32", "--seed=9", "--train_steps=4", check=False)
    errors = [line for line in reseeded.output.splitlines() if line.startswith("error:")]
    assert reseeded.returncode == 1 and len(errors) == 1 and "seed" in errors[0], reseeded.output[-2000:]
    allowed = train_here(*common, "--global_batch_size=64", "--train_steps=4",
                         "--allow_config_change=global_batch_size")
    assert ("global batch changed on 1 worker x 1 replica (global batch 32 -> 64 by --allow_config_change, 64 per "
            "replica;" in allowed.output and "resuming epoch 1 at record 64 of 1,438" in allowed.output)
    record = _recorded_position(tmp_path, 4)
    assert (record["epoch"], record["records_consumed_in_epoch"], record["global_batch_size"]) == (0, 192, 64)


def test_training_into_a_directory_holding_another_tasks_checkpoint_is_one_line(train_here, tmp_path):
    """No config.yaml to compare with, only a checkpoint a GAN-like Keras program wrote: the run stops before
    training with one line naming the checkpoint and what it lacks (before: a traceback)."""
    import keras
    import tensorflow as tf

    generator = keras.Sequential([keras.Input((4,)), keras.layers.Dense(64)])
    root = tf.train.Checkpoint(step=tf.Variable(5, dtype=tf.int64), generator=generator,
                               g_optimizer=keras.optimizers.Adam())
    path = tf.train.CheckpointManager(root, run_dir.checkpoints(tmp_path), max_to_keep=1).save()
    result = train_here(*SMALL, "--model=small_cnn", "--train_steps=2", f"--model_dir={tmp_path}", check=False)
    errors = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert result.returncode == 1 and errors == [
        f"error: --model_dir: checkpoint {path} does not fit the model built here: it has no 'model', 'optimizer' "
        "(it holds g_optimizer, generator, save_counter, step); it was written by another model, task or dataset: "
        "train this model into a new --model_dir"], result.output
    assert "Traceback" not in result.output and not (tmp_path / "history.jsonl").exists()


def test_a_preemption_at_an_evaluation_step_leaves_that_evaluation_to_the_resumed_run(train_here, tmp_path,
                                                                                      monkeypatch):
    """SIGTERM during the loop that ends at evaluation step 2: the checkpoint is saved before that evaluation, so
    the resumed run runs it first; its history has the evaluations (steps and values) of an uninterrupted run
    (before: step 2's evaluation was lost)."""
    from tfgpu.metrics import history

    common = ["--dataset=digits", "--model=small_cnn", "--global_batch_size=64", "--train_steps=4",
              "--steps_per_loop=2", "--eval_every_steps=2", "--checkpoint_every_steps=0", "--deterministic",
              "--tensorboard=false", "--verbose=2"]
    train_here(*common, f"--model_dir={tmp_path / 'straight'}")
    write = history.History.write

    def preempted_at_step_2(self, kind, step, values):
        write(self, kind, step, values)
        if kind == "train" and step == 2:
            os.kill(os.getpid(), signal.SIGTERM)  # the trainer's handler: save at the end of this loop, exit 143

    monkeypatch.setattr(history.History, "write", preempted_at_step_2)
    preempted = train_here(*common, f"--model_dir={tmp_path / 'split'}", check=False)
    monkeypatch.undo()
    assert preempted.returncode == 143 and read_history(tmp_path / "split", "eval") == []
    stopped = [line for line in preempted.output.splitlines() if line.startswith("stopped:")]
    saved = run_dir.checkpoint(tmp_path / "split", 2)
    assert stopped == [f"stopped: preempted by SIGTERM: checkpoint saved at step 2 ({saved}); run the same command "
                       "again (or call tfgpu.fit again with the same model_dir) to resume from it"], preempted.output
    resumed = train_here(*common, f"--model_dir={tmp_path / 'split'}")
    straight, split = read_history(tmp_path / "straight", "eval"), read_history(tmp_path / "split", "eval")
    assert [e["step"] for e in split] == [e["step"] for e in straight] == [2, 4]
    for ours, theirs in zip(split, straight):
        for name in ("val_loss", "val_accuracy", "val_examples"):
            assert ours[name] == pytest.approx(theirs[name], rel=1e-6, abs=1e-7), (ours["step"], name)
    assert read_metrics(tmp_path / "split")["val_loss"] == pytest.approx(straight[-1]["val_loss"], rel=1e-6)
    assert "resuming at step 2" in resumed.output
    assert "owed_evaluation_s" in read_history(tmp_path / "split", "startup")[-1]
    assert "evaluating step 2 first: the run that saved its checkpoint stopped before evaluating it" in resumed.output


def test_checkpoint_every_a_time_saves_at_loop_ends_and_the_heartbeat_follows_the_loop(train_here, tmp_path,
                                                                                        monkeypatch):
    """--checkpoint_every=<time>: a save at each loop end once the interval has passed (here every loop), none
    before the end with an hour; the launcher's heartbeat file ends at the last step, phase done."""
    import json

    from tfgpu.runtime import heartbeat

    beat = tmp_path / "beat.json"
    monkeypatch.setenv(heartbeat.ENV, str(beat))
    common = SMALL + ["--model=small_cnn", "--train_steps=8", "--steps_per_loop=2", "--keep_checkpoints=10"]
    train_here(*common, "--checkpoint_every=0.001s", f"--model_dir={tmp_path / 'often'}")
    assert json.loads(beat.read_text())["phase"] == "done" and json.loads(beat.read_text())["step"] == 8
    train_here(*common, "--checkpoint_every=1h", f"--model_dir={tmp_path / 'hourly'}")

    def saved(run):
        state = (tmp_path / run / run_dir.CHECKPOINTS_DIR / run_dir.CHECKPOINT_STATE_FILE).read_text()
        pattern = r'all_model_checkpoint_paths: "' + re.escape(run_dir.CHECKPOINT_PREFIX) + r'(\d+)"'
        return [int(s) for s in re.findall(pattern, state)]

    assert saved("often") == [2, 4, 6, 8]
    assert saved("hourly") == [8]


# -- stopping inside a loop: Ctrl-C, SIGTERM ---------------------------------------------------------------------
def _signalled_during_step(monkeypatch, signum, at_step: int):
    """The classifier's step sends this process ``signum`` while step ``at_step`` (0-based) runs, from inside the
    compiled loop: the signal comes while the main thread is in TensorFlow, as a Ctrl-C mid-loop does."""
    import tensorflow as tf

    from tfgpu.tasks.classification import ClassificationTask

    step = ClassificationTask.train_step

    def send(now):
        if int(now) == at_step:
            os.kill(os.getpid(), signum)

    def train_step(self, batch):
        with tf.control_dependencies([tf.py_function(send, [self.global_step.value()], [])]):
            return step(self, batch)

    monkeypatch.setattr(ClassificationTask, "train_step", train_step)


def test_ctrl_c_mid_loop_saves_the_step_in_flight_exits_130_and_the_resumed_run_is_exact(train_here, tmp_path,
                                                                                         monkeypatch):
    """A Ctrl-C during step 8 of a loop of 40: the loop stops right after it (not 32 steps later), the checkpoint is
    that step's, one line says so (no traceback), exit 130; the rerun resumes there, records each step once, and
    ends with the weights of an uninterrupted run (the data position and step counter followed the steps run)."""
    common = SMALL + ["--model=small_cnn", "--train_steps=60", "--steps_per_loop=40", "--eval_every_steps=40",
                      "--eval_split=val", "--checkpoint_every_steps=0", "--deterministic", "--tensorboard=false"]
    train_here(*common, f"--model_dir={tmp_path / 'straight'}")
    _signalled_during_step(monkeypatch, signal.SIGINT, at_step=7)
    stopped = train_here(*common, f"--model_dir={tmp_path / 'split'}", check=False)
    monkeypatch.undo()
    lines = [line for line in stopped.output.splitlines() if line.startswith("stopped:")]
    assert stopped.returncode == 130 and len(lines) == 1 and "Traceback" not in stopped.output, stopped.output
    step = read_history(tmp_path / "split")[-1]["step"]
    # The step in flight, or a few more: the watcher thread wakes within milliseconds, a few steps of a small_cnn on a
    # loaded 2-core CPU (11 seen); a loop's end would be step 40.
    assert 8 <= step < 20, step
    assert lines[0].startswith(f"stopped: interrupted by SIGINT (Ctrl-C): checkpoint saved at step {step} (")
    assert os.path.basename(lines[0].split("(")[2].split(")")[0]) == f"{run_dir.CHECKPOINT_PREFIX}{step}"
    resumed = train_here(*common, f"--model_dir={tmp_path / 'split'}")
    assert f"resuming at step {step}" in resumed.output
    records = [(r["kind"], r["step"]) for r in map(__import__("json").loads,
                                                     open(tmp_path / "split" / "history.jsonl"))
               if r["kind"] in ("train", "eval")]
    assert len(records) == len(set(records)) and [s for k, s in records if k == "eval"] == [40, 60]
    straight, split = _model_weights(tmp_path / "straight"), _model_weights(tmp_path / "split")
    for name in straight:
        np.testing.assert_array_equal(split[name], straight[name], err_msg=name)
    assert read_metrics(tmp_path / "split")["val_loss"] == read_metrics(tmp_path / "straight")["val_loss"]


# Slow (two runs, 44 s on the loaded host): restarts.take_handed_record's rules are in the default suite
# (tests/runtime/test_restarts.py), the chief's write end to end in heal_trials --failure=host.
@pytest.mark.slow
def test_a_restart_record_handed_by_the_launcher_is_written_by_the_chief_with_the_step_it_restored(
        train_here, tmp_path, monkeypatch):
    """tfgpu.launch hands the record over (TFGPU_RESTART_RECORD) when it cannot write history.jsonl itself (a gs://
    --model_dir, or the chief on another host); the chief writes it once, with the step it resumed from."""
    from tfgpu.runtime import restarts

    common = SMALL + ["--model=small_cnn", "--steps_per_loop=2", "--verbose=0", f"--model_dir={tmp_path}"]
    train_here(*common, "--train_steps=4")
    record = {"restart": 1, "reason": "was lost with host 10.0.0.2-7", "worker": 1, "exit_code": 129,
              "workers_before": 3, "workers_after": 2, "last_step": 5, "steps_lost": None, "failed_at": 1.0}
    monkeypatch.setenv(restarts.RECORD_ENV, restarts.handoff(record))
    train_here(*common, "--train_steps=6")
    written, = read_history(tmp_path, "restart")
    assert written["step"] == 4 and written["steps_lost"] == 1 and written["reason"] == record["reason"]
    assert restarts.RECORD_ENV not in os.environ  # taken: an in-place re-exec does not write it again
