"""The entrypoint: flag sources and precedence, and bad input stopping the run with a clear error."""
import json
import os
import re

import numpy as np
import pytest
import yaml

from tests.conftest import read_history
from tfgpu import train
from tfgpu.training import experiment
from tfgpu.config import ConfigError
from tfgpu.data.schema import tfrecord
from tfgpu.runtime import run_dir

DIGITS = ["--dataset=digits", "--model=small_cnn"]


def test_command_line_wins_over_flagfile_wherever_it_appears(tmp_path):
    flagfile = tmp_path / "job.flags"
    flagfile.write_text("# comment\n--global_batch_size=32\n--model=resnet20\n--dataset=digits\n")
    config = train.parse(["--global_batch_size=16", f"--flagfile={flagfile}", f"--model_dir={tmp_path}"])
    assert config.global_batch_size == 16
    assert config.model == "resnet20"


def test_nested_flagfile_is_found_next_to_the_including_file(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "base.flags").write_text("--dataset=digits\n--steps_per_loop=7\n")
    (tmp_path / "sub" / "job.flags").write_text("--flagfile=base.flags\n--steps_per_loop=9\n")
    config = train.parse([f"--flagfile={tmp_path / 'sub' / 'job.flags'}", f"--model_dir={tmp_path}"])
    assert config.steps_per_loop == 9  # the including file's later line wins
    assert config.dataset == "digits"


def test_yaml_config_is_lowest_precedence(tmp_path):
    (tmp_path / "c.yaml").write_text(yaml.safe_dump({"global_batch_size": 8, "seed": 3, "dataset": "digits"}))
    (tmp_path / "f.flags").write_text("--seed=5\n")
    config = train.parse([f"--config={tmp_path / 'c.yaml'}", f"--flagfile={tmp_path / 'f.flags'}",
                          f"--model_dir={tmp_path}"])
    assert (config.global_batch_size, config.seed) == (8, 5)


def test_lists_and_booleans_parse(tmp_path):
    config = train.parse(DIGITS + ["--lr_decay_epochs=30,60", "--nodeterministic", "--jit_compile",
                                   f"--model_dir={tmp_path}"])
    assert config.lr_decay_epochs == (30.0, 60.0)
    assert config.jit_compile and not config.deterministic


def test_helpfull_groups_flags_by_module():
    text = train.help_text()
    for group in ("tfgpu.distribute", "tfgpu.precision", "tfgpu.data", "tfgpu.optimizer"):
        assert group in text
    assert "--global_batch_size" in text and "Examples per optimizer step" in text


@pytest.mark.parametrize("args, flag", [
    (["--model=resnet9000"], "--model"),
    (["--global_batch_size=-4"], "--global_batch_size"),
    (["--precision=float8"], "--precision"),
    (["--flagfile=/nonexistent/job.flags"], "--flagfile"),
    (["--learning_rat=0.1"], "learning_rat"),
    (["--global_batch_size=abc"], "--global_batch_size"),
])
def test_bad_flags_fail_fast_naming_the_flag(args, flag, tmp_path, capsys):
    assert train.main(DIGITS + [f"--model_dir={tmp_path}"] + args) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and flag in err[0], err


def test_unwritable_model_dir_is_refused(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    assert train.main(DIGITS + [f"--model_dir={blocker}/run"]) == 1
    err = capsys.readouterr().err
    assert "--model_dir" in err and "not writable" in err


def test_batch_not_divisible_by_replicas_exits_nonzero(run_train, tmp_path):
    proc = run_train(*DIGITS, "--global_batch_size=33", "--cpu_logical_devices=2",
                 "--distribution_strategy=mirrored", f"--model_dir={tmp_path}", check=False, timeout=120)
    assert proc.returncode == 1
    assert "error: --global_batch_size: 33 is not divisible by the 2 replicas" in proc.output
    assert not os.path.exists(tmp_path / run_dir.CHECKPOINTS_DIR)


# Slow: (26 s loaded, subprocesses); --config=<model_dir>/config.yaml replaying a run stays in-process in
# tests/runtime/test_precision.py.
@pytest.mark.slow
def test_effective_config_is_written_and_replays(run_train, tmp_path):
    model_dir = tmp_path / "run"
    run_train(*DIGITS, "--train_steps=3", "--steps_per_loop=3", "--global_batch_size=32", "--eval_steps=1",
          f"--model_dir={model_dir}", timeout=180)
    saved = yaml.safe_load((model_dir / run_dir.CONFIG_FILE).read_text())
    assert saved["train_steps"] == 3 and saved["model"] == "small_cnn"
    again = train.parse([f"--config={run_dir.config_yaml(model_dir)}"])
    assert again.to_dict() == saved


def test_the_startup_record_gives_tensorflow_s_import_its_own_phase(run_train, tmp_path):
    """A process of its own (TensorFlow not yet imported): the seconds TensorFlow's import takes are its phase of
    the startup record, not part of the command line's ``imports``. TF_CPP_MIN_LOG_LEVEL unset, as users have
    it: TensorFlow's native start-up lines (oneDNN, CPU features, CUDA's cuInit failure on a host without a GPU
    driver) are held back, so the run's first line is tfgpu's."""
    proc = run_train(*DIGITS, "--train_steps=1", "--steps_per_loop=1", "--eval_split=none", "--global_batch_size=16",
                     f"--model_dir={tmp_path}", env={"TF_CPP_MIN_LOG_LEVEL": None})
    [startup] = read_history(tmp_path, "startup")
    assert startup["tensorflow_import_s"] > 1.0 > startup["imports_s"], startup
    assert not re.findall(r"^[IWE]\d{4} .*$", proc.output, re.M), proc.output[:2000]
    final = [line for line in proc.output.splitlines() if line.startswith("final: step=1 ")]
    assert len(final) == 1 and "format_version" not in final[0], proc.output[-2000:]


# -- every file a run reads: malformed means one line naming the file or flag, exit 1, no traceback -------------

@pytest.mark.parametrize("content, message", [
    (b"--seed=3\nglobal_batch_size=32\n", "line 2: 'global_batch_size=32' is not a --flag=value line"),
    (b"--seed=\xff\n", "is not a UTF-8 text file"),
])
def test_malformed_flagfile_is_one_line_naming_the_file(tmp_path, capsys, content, message):
    flagfile = tmp_path / "job.flags"
    flagfile.write_bytes(content)
    assert train.main(DIGITS + [f"--model_dir={tmp_path}/run", f"--flagfile={flagfile}"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: --flagfile: {flagfile}") and message in err[0], err
    assert not os.path.exists(tmp_path / "run")


def test_flagfile_without_a_value_names_the_flag(tmp_path, capsys):
    assert train.main(DIGITS + [f"--model_dir={tmp_path}", "--flagfile"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: --flagfile"), err


TWO_WORKERS = json.dumps({"cluster": {"worker": ["localhost:2222", "localhost:2223"]},
                          "task": {"type": "worker", "index": 0}})


@pytest.mark.parametrize("tf_config, args, message", [
    (TWO_WORKERS, ["--distribution_strategy=mirrored"],
     "error: --distribution_strategy: mirrored trains this process on its own, but TF_CONFIG describes 2 workers"),
    (TWO_WORKERS, ["--distribution_strategy=one_device"],
     "error: --distribution_strategy: one_device trains this process on its own, but TF_CONFIG describes 2 workers"),
    ('{"cluster": {"worker": ["a:1", "b:1"]}, "task": {"type": "worker", "index": 2}', [],
     "error: --cluster: TF_CONFIG is not valid JSON"),
    (json.dumps({"cluster": {"worker": ["a:1", "a:1"]}, "task": {"type": "worker", "index": 0}}), [],
     "error: --cluster: TF_CONFIG gives address a:1 to both worker 0 and worker 1"),
])
def test_misconfigured_cluster_stops_before_model_dir_or_tensorflow(tmp_path, capsys, monkeypatch, tf_config, args,
                                                                    message):
    monkeypatch.setenv("TF_CONFIG", tf_config)
    assert train.main(DIGITS + [f"--model_dir={tmp_path}/run"] + args) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(message), err
    assert not os.path.exists(tmp_path / "run")  # nothing written: N would-be chiefs never share a model_dir


def _tiny_dataset(directory):
    rng = np.random.default_rng(0)
    images, labels = rng.integers(0, 256, (8, 8, 8, 3), dtype=np.uint8), rng.integers(0, 2, 8)
    splits = {"train": tfrecord.write_arrays(str(directory), "train", images, labels, num_shards=2,
                                             image_format="png")}
    tfrecord.write_manifest(str(directory), {"name": "tiny", "classes": ["a", "b"], "splits": splits,
                                             "compression": "none",
                                             "image_shape": {"height": 8, "width": 8, "channels": 3}})
    return splits


@pytest.mark.parametrize("edit, message", [
    (lambda m: "{not json", "is unreadable or not JSON"),
    (lambda m: [m], "expected a JSON object, got list"),
    (lambda m: {k: v for k, v in m.items() if k != "splits"}, "'splits' must map each split name to its shards"),
    (lambda m: {**m, "splits": {"train": {"num_examples": 8, "shards": [{"num_examples": 4}]}}},
     "split 'train' needs 'num_examples' and 'shards'"),
    (lambda m: {**m, "image_shape": {"height": 8}}, "'image_shape' needs integer 'channels'"),
    (lambda m: {**m, "classes": "ab"}, "'classes' must be a list"),
])
def test_malformed_dataset_json_is_one_line_naming_it(tmp_path, edit, message):
    from tfgpu.config import Config
    from tfgpu.data import catalog

    _tiny_dataset(tmp_path)
    path = tmp_path / tfrecord.MANIFEST
    edited = edit(json.loads(path.read_text()))
    path.write_text(edited if isinstance(edited, str) else json.dumps(edited))
    with pytest.raises(ConfigError) as e:
        catalog.prepare(Config(model_dir=str(tmp_path / "run"), data_dir=str(tmp_path), eval_split="none"))
    assert str(e.value).startswith(f"--data_dir: {path}") and message in str(e.value), str(e.value)
    assert "\n" not in str(e.value)


def test_an_image_that_does_not_decode_is_found_by_shard_and_record(tmp_path):
    import tensorflow as tf

    from tfgpu.config import Config
    from tfgpu.data import catalog

    splits = _tiny_dataset(tmp_path)
    info = catalog.prepare(Config(model_dir=str(tmp_path / "run"), data_dir=str(tmp_path), eval_split="none"))
    assert experiment.find_undecodable_image(info) is None
    shard = str(tmp_path / splits["train"]["shards"][1]["file"])
    records = list(tf.data.TFRecordDataset(shard).as_numpy_iterator())
    example = tf.train.Example.FromString(records[2])
    example.features.feature[tfrecord.ENCODED].bytes_list.value[0] = b"not an image"
    records[2] = example.SerializeToString()
    with tf.io.TFRecordWriter(shard) as writer:
        for record in records:
            writer.write(record)
    found = experiment.find_undecodable_image(info)
    assert found[:2] == (shard, 2) and "Unknown image file format" in found[2] and "\n" not in found[2]


def test_malformed_config_exits_1_without_a_traceback(tmp_path, capsys):
    (tmp_path / "bad.yaml").write_text("model: small_cnn\n  seed: 3\n")
    assert train.main([f"--config={tmp_path / 'bad.yaml'}", f"--model_dir={tmp_path / 'run'}"]) == 1
    assert capsys.readouterr().err.strip().splitlines() == [
        f"error: --config: {tmp_path / 'bad.yaml'} is not valid YAML: mapping values are not allowed here at line 2, "
        "column 7"]


@pytest.mark.slow
def test_undecodable_image_in_a_run_exits_1_naming_the_record(run_train, tmp_path):
    import tensorflow as tf

    data = tmp_path / "data"
    splits = _tiny_dataset(data)
    shard = str(data / splits["train"]["shards"][0]["file"])
    records = list(tf.data.TFRecordDataset(shard).as_numpy_iterator())
    example = tf.train.Example.FromString(records[1])
    example.features.feature[tfrecord.ENCODED].bytes_list.value[0] = b"garbage"
    records[1] = example.SerializeToString()
    with tf.io.TFRecordWriter(shard) as writer:
        for record in records:
            writer.write(record)
    args = (f"--data_dir={data}", "--model=small_cnn", "--global_batch_size=4", "--train_steps=2", "--steps_per_loop=2",
            "--eval_split=none", f"--model_dir={tmp_path / 'run'}")
    # The manifest's sha256 no longer matches: the shard is refused before it is read, naming it.
    proc = run_train(*args, check=False, timeout=300)
    assert proc.returncode == 1 and "Traceback" not in proc.output, proc.output[-3000:]
    assert f"{shard}" in proc.output and "the shard changed since conversion" in proc.output, proc.output[-3000:]
    # A manifest without checksums (as another tool may write one): the record is named when it fails to decode.
    manifest = json.loads((data / "dataset.json").read_text())
    for entry in manifest["splits"].values():
        for shard_entry in entry["shards"]:
            shard_entry.pop("sha256", None)
    (data / "dataset.json").write_text(json.dumps(manifest))
    proc = run_train(*args, check=False, timeout=300)
    assert proc.returncode == 1 and "Traceback" not in proc.output, proc.output[-3000:]
    assert f"error: --data_dir: {shard}: record 1 holds an image that does not decode" in proc.output


FAKE_TENSORFLOW = "raise ImportError('tensorflow was imported')\n"


@pytest.mark.parametrize("argv, error", [
    (["--recipe=quickstart", "--epochz=3"], "error: --epochz: unknown flag for python -m tfgpu.train (did you mean "
                                            "--epochs?)"),
    (["--recipe=quickstart", "--epochs=-3"], "error: --epochs: must be positive when --train_steps is 0, got -3.0"),
    (["--flagfile=missing.flags"], "error: --flagfile: file 'missing.flags' does not exist"),
    (["--recipe=quickstart", "--precision=fp8"], "error: --precision: 'fp8' is not one of"),
    (["--recipe=quickstart", "--eval_every=2days"], "error: --eval_every: '2days' is not a duration"),
    (["--recipe=quickstart_gan", "--n_critic=0"], "error: --n_critic: must be positive, got 0"),
    (["--recipe=quickstart", "--n_critic=2"], "error: --n_critic: is for --task=gan; this run is "
                                              "--task=classification"),
    # What the values name (issue 37: these came 12-17 s in, after TensorFlow's import).
    (["--dataset=digits", "--model=resnt20"], "error: --model: unknown model 'resnt20'; known models: convnext_tiny,"),
    (["--recipe=quickstart_gan", "--generator=dcgn"], "error: --generator: unknown model 'dcgn'; known models: "),
    (["--dataset=digits", "--model=/nonexistent/net.py:build"], "error: --model: file '/nonexistent/net.py' does "
                                                                "not exist"),
    (["--data_dir=/nonexistent/data"], "error: --data_dir: '/nonexistent/data' does not exist"),
    (["--dataset=cifar11"], "error: --dataset: unknown dataset 'cifar11'; use one of digits, mnist5k, synthetic, "
                            "tfds:NAME, or --data_dir"),
    (["--dataset=digits", "--target=val_acc:0.9"], "error: --target: 'val_acc' is not an eval metric of this task; "
                                                   "it evaluates val_loss, val_accuracy, val_top5_accuracy"),
    (["--recipe=quickstart_gan", "--target=val_accuracy:0.9"], "error: --target: 'val_accuracy' is not an eval "
                                                               "metric of this task; it evaluates fid, kid"),
])
def test_a_bad_flag_or_value_is_one_line_before_tensorflow_is_imported(tmp_path, argv, error):
    """From an empty directory, with a `tensorflow` that fails on import first on the path: the error must be the
    flag's, so no TensorFlow (seconds of start-up and its C++ lines) comes before it."""
    import subprocess
    import sys

    from tests.conftest import REPO

    fake = tmp_path / "fake"
    (fake / "tensorflow").mkdir(parents=True)
    (fake / "tensorflow" / "__init__.py").write_text(FAKE_TENSORFLOW)
    (tmp_path / "empty").mkdir()
    proc = subprocess.run([sys.executable, "-m", "tfgpu.train", f"--model_dir={tmp_path / 'run'}", *argv],
                          cwd=tmp_path / "empty", env={**os.environ, "PYTHONPATH": f"{fake}{os.pathsep}{REPO}"},
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=60)
    assert proc.returncode == 1 and proc.stdout.strip().startswith(error), proc.stdout
    assert len(proc.stdout.strip().splitlines()) == 1, proc.stdout


# Slow (a process of its own, twice): the same stop runs in-process by default
# (tests/training/test_trainer.py::test_ctrl_c_mid_loop_saves_the_step_in_flight_exits_130_and_the_resumed_run_is_exact).
@pytest.mark.slow
def test_ctrl_c_to_the_command_saves_exits_130_in_one_line_and_the_rerun_records_each_step_once(run_train,
                                                                                                data_cache, tmp_path):
    """python -m tfgpu.train given a real SIGINT (what Ctrl-C sends) inside its second loop of 200 steps: a checkpoint
    at the step in flight, one "stopped:" line, no traceback, exit 130; the rerun finishes with one record per step."""
    import signal
    import sys

    from tests.conftest import preempted

    args = ["--dataset=digits", "--model=small_cnn", "--global_batch_size=32", "--train_steps=1000",
            "--steps_per_loop=200", "--eval_split=none", "--checkpoint_every_steps=0", "--verbose=2"]
    model_dir = tmp_path / "run"
    proc = preempted([sys.executable, "-m", "tfgpu.train", *args, f"--model_dir={model_dir}"], model_dir,
                     train_lines=1, env={"TFGPU_DATA_CACHE": data_cache}, sig=signal.SIGINT)
    stopped = [line for line in proc.stdout.splitlines() if line.startswith("stopped:")]
    assert proc.returncode == 130 and len(stopped) == 1 and "Traceback" not in proc.stdout, proc.stdout[-3000:]
    step = read_history(model_dir)[-1]["step"]
    assert stopped[0].startswith(f"stopped: interrupted by SIGINT (Ctrl-C): checkpoint saved at step {step} (")
    assert os.path.exists(run_dir.checkpoint(model_dir, step) + ".index") and 200 <= step < 1000
    rerun = run_train(*args, f"--model_dir={model_dir}")
    assert f"resuming at step {step}" in rerun.output and "final: step=1000" in rerun.output
    steps = [r["step"] for r in map(json.loads, open(model_dir / "history.jsonl")) if r["kind"] == "train"]
    assert steps == sorted(set(steps)) and steps[-1] == 1000
