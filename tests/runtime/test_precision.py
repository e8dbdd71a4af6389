"""Mixed precision and XLA: runs train, logits stay float32, the float16 loss scale adapts and never reaches 0,
the guard has no scale outside float16, XLA compiles.

Training runs in this process (``train_here``) but where XLA_FLAGS or logical CPU devices must be set before
TensorFlow starts."""
import copy
import json
import os

import hypothesis
import hypothesis.strategies as st
import numpy as np
import pytest
import yaml

from tests.conftest import REPO, read_history
from tfgpu.config import Config
from tfgpu.runtime import host, precision, run_dir

SMALL = ["--dataset=digits", "--model=small_cnn", "--global_batch_size=32", "--eval_split=none", "--verbose=2",
         "--base_learning_rate=0.8", "--lr_schedule=constant"]


# bfloat16 (15 s loaded) with -m slow; float16, the one with loss scaling, runs by default.
@pytest.mark.parametrize("precision", ["mixed_float16", pytest.param("mixed_bfloat16", marks=pytest.mark.slow)])
def test_mixed_precision_trains_with_float32_logits(precision, train_here, tmp_path):
    train_here(*SMALL, f"--precision={precision}", "--train_steps=40", "--steps_per_loop=10",
               f"--model_dir={tmp_path}")
    losses = [r["loss"] for r in read_history(tmp_path)]
    assert losses[-1] < 0.7 * losses[0], losses
    import keras

    # The export is a float32 model whatever the training precision (rebuilt under float32 with the weights).
    for name in ("model.keras", "model.bare.keras"):
        model = keras.saving.load_model(tmp_path / "export" / name)
        assert {layer.compute_dtype for layer in model._flatten_layers()} == {"float32"}, name
        import numpy as np

        logits = model(np.zeros((2, 8, 8, 1), np.float32))
        assert str(logits.dtype) in ("float32", "<dtype: 'float32'>")


@pytest.fixture
def float16_task(tmp_path, data_cache):
    """The classification task under mixed_float16 (small_cnn, batch 16) and a function running n steps."""
    import keras
    import tensorflow as tf

    from tfgpu.training import experiment
    from tfgpu.config import Config

    config = Config(model_dir=str(tmp_path), dataset="digits", data_cache_dir=data_cache, model="small_cnn",
                    global_batch_size=16, train_steps=10, eval_split="none", tensorboard=False, verbose=0,
                    lr_schedule="constant", precision="mixed_float16", initial_loss_scale=2.0 ** 24,
                    loss_scale_growth_steps=5)
    built = experiment.setup(config)
    built.trainer.restore()
    task, strategy = built.task, built.placement.strategy
    labels = tf.constant(np.arange(16) % 10)

    @tf.function
    def run(images, n):
        skipped = tf.constant(0.0)
        for _ in tf.range(n):
            skipped += strategy.run(task.train_step, args=((images, labels),))["nonfinite_steps"]
        return skipped

    yield task, lambda images, n=1: float(run(tf.constant(images, tf.float32), tf.constant(n)))
    keras.backend.clear_session(free_memory=False)
    keras.mixed_precision.set_global_policy("float32")


def test_float16_loss_scale_backs_off_grows_and_never_reaches_zero(float16_task):
    """A scale of 2^24 overflows float16 gradients: it halves on each skipped step, then doubles every
    --loss_scale_growth_steps finite steps. 200 poisoned steps take it down to 1, not to 0 (where Keras' own
    halving ends, after which gradients read 0/0), and change no weight; the next finite step trains."""
    task, run = float16_task
    images = np.random.default_rng(0).normal(size=(16, 8, 8, 1))
    scales, skipped = [], 0.0
    for _ in range(30):
        skipped += run(images)
        scales.append(float(precision.current_loss_scale(task.optimizer)))
    low = scales.index(min(scales))
    assert skipped >= 1 and min(scales) < 2.0 ** 24 and max(scales[low:]) > min(scales), scales
    weights = [v.numpy().copy() for v in task.model.variables]
    assert run(np.full((16, 8, 8, 1), np.nan), 200) == 200.0
    assert float(precision.current_loss_scale(task.optimizer)) == 1.0
    for var, value in zip(task.model.variables, weights):
        np.testing.assert_array_equal(var.numpy(), value, err_msg=var.path)
    assert run(images) == 0.0
    assert all(np.isfinite(v.numpy()).all() for v in task.model.variables)


@pytest.mark.parametrize("policy", ["float32", "mixed_bfloat16"])
def test_without_float16_the_guard_has_no_scale_whatever_was_skipped(policy):
    """Outside float16 the guard neither scales the loss nor divides gradients, and its scale reads exactly 1
    after 300 skipped steps; updates equal the bare optimizer's."""
    import keras
    import tensorflow as tf

    from tfgpu.config import Config

    guarded, bare = tf.Variable([1.0, 2.0]), tf.Variable([1.0, 2.0])
    optimizer = precision.wrap_optimizer(keras.optimizers.SGD(0.1, momentum=0.9),
                                         Config(model_dir="unused", dataset="digits", precision=policy))
    reference = keras.optimizers.SGD(0.1, momentum=0.9)

    @tf.function
    def steps(n, bad):
        for _ in tf.range(n):
            loss = precision.scale_loss(optimizer, tf.where(bad, np.nan, 3.0))
            precision.apply_if_finite(optimizer, loss, [tf.fill([2], loss)], [guarded])

    steps(tf.constant(300), tf.constant(True))
    assert float(precision.current_loss_scale(optimizer)) == 1.0 and int(optimizer.iterations.numpy()) == 0
    steps(tf.constant(2), tf.constant(False))
    for _ in range(2):
        reference.apply([tf.constant([3.0, 3.0])], [bare])
    np.testing.assert_array_equal(guarded.numpy(), bare.numpy())


def test_jit_compile_takes_effect(run_train, tmp_path):
    """With --jit_compile XLA really compiles the replica step (it dumps the HLO modules it builds)."""
    dump = tmp_path / "xla"
    run_train(*SMALL, "--jit_compile", "--train_steps=2", "--steps_per_loop=2", f"--model_dir={tmp_path / 'run'}",
              env={"XLA_FLAGS": f"--xla_dump_to={dump}"})
    modules = [f for f in os.listdir(dump) if "gradients" in f and f.endswith(".txt")]
    assert modules, sorted(os.listdir(dump))[:20]


# Slow: a warning (35 s loaded); XLA taking effect stays in test_jit_compile_takes_effect.
@pytest.mark.slow
def test_jit_compile_is_turned_off_with_a_warning_on_logical_cpus(run_train, tmp_path):
    proc = run_train(*SMALL, "--jit_compile", "--cpu_logical_devices=2", "--train_steps=2", "--steps_per_loop=2",
                     f"--model_dir={tmp_path}")
    assert "--jit_compile is off for this run" in proc.output


# -- --precision=auto: the rule on recorded hosts (tests/fixtures/devices/*.json) and in a run ------------------------
def _host(name):
    with open(os.path.join(REPO, "tests", "fixtures", "devices", f"{name}.json")) as f:
        return json.load(f)


def _gpu(name, compute_capability):
    return {"name": name, "compute_capability": compute_capability}


@pytest.mark.parametrize("recorded, expected, named", [
    ("cpu_only_amx_bf16", "mixed_bfloat16", "this CPU has amx_bf16"),
    # AVX512_BF16 without AMX: bfloat16 ran at 0.73-0.81x of float32 there (docs/benchmarks.md)
    ("cpu_only_avx512_bf16_no_amx", "float32", "this CPU has avx512_bf16 but no AMX: bfloat16 ran at 0.73-0.81x"),
    ("cpu_only_avx2", "float32", "no AVX512_BF16/AMX"),
    ("a100x8_two_numa_nodes", "mixed_bfloat16", "NVIDIA A100-SXM4-80GB, Ampere, compute capability 8.0"),
    ("v100x4_cloud_no_numa", "mixed_float16", "Tesla V100-SXM2-16GB, Volta"),
    ("t4_single_small_disk", "mixed_float16", "Tesla T4, Turing, compute capability 7.5"),
])
def test_auto_on_recorded_hosts(recorded, expected, named):
    facts = _host(recorded)
    chosen, why = precision.resolve_auto(facts["cpu"]["flags"], facts["gpus"])
    assert chosen == expected and named in why, why


@pytest.mark.parametrize("gpus, expected", [
    ([_gpu("NVIDIA H100 80GB HBM3", "9.0")], "mixed_bfloat16"),
    ([_gpu("NVIDIA L4", "8.9"), _gpu("NVIDIA B200", "10.0")], "mixed_bfloat16"),
    ([_gpu("Tesla P100-PCIE-16GB", "6.0")], "float32"),
    ([_gpu("NVIDIA A100-SXM4-40GB", "8.0"), _gpu("Tesla V100-SXM2-16GB", "7.0")], "mixed_float16"),
    ([_gpu("NVIDIA H100 80GB HBM3", "9.0"), _gpu("Tesla P100-PCIE-16GB", "6.0")], "float32"),
])
def test_auto_on_gpus_follows_the_oldest_gpu_whatever_the_cpu(gpus, expected):
    amx = _host("cpu_only_amx_bf16")["cpu"]["flags"]
    chosen, why = precision.resolve_auto(amx, gpus)
    oldest = min(gpus, key=lambda g: tuple(map(int, g["compute_capability"].split("."))))
    assert chosen == expected and oldest["name"] in why, why


@hypothesis.settings(max_examples=40, deadline=None)
@hypothesis.given(st.lists(st.sampled_from(["6.0", "6.1", "7.0", "7.5", "8.0", "8.6", "8.9", "9.0", "10.0"]),
                           min_size=1, max_size=8),
                  st.fixed_dictionaries({f: st.booleans() for f in host.CPU_FLAGS}))
def test_auto_is_the_choice_for_the_oldest_gpu_alone(capabilities, cpu_flags):
    """Every replica runs one policy: any set of GPUs gets what its oldest GPU would get alone, and the CPU's
    flags play no part once there is a GPU."""
    gpus = [_gpu(f"gpu{i}", cc) for i, cc in enumerate(capabilities)]
    oldest = min(gpus, key=lambda g: tuple(map(int, g["compute_capability"].split("."))))
    chosen, _ = precision.resolve_auto(cpu_flags, gpus)
    assert chosen == precision.resolve_auto({}, [oldest])[0]
    major = int(oldest["compute_capability"].split(".")[0])
    assert chosen == ("mixed_bfloat16" if major >= 8 else "mixed_float16" if major == 7 else "float32")


def test_auto_is_no_policy_until_resolved():
    config = Config(model_dir="/tmp/x", precision="auto")
    for use in (lambda: config.compute_dtype, lambda: precision.set_policy("auto"),
                lambda: precision.wrap_optimizer(None, config)):
        with pytest.raises(ValueError, match="auto"):
            use()


def test_setup_resolves_auto_before_anything_reads_it(tmp_path, data_cache, monkeypatch, caplog):
    """experiment.setup turns auto into this host's policy once: the task, the trainer, the Keras policy and
    config.yaml all see the policy, and the choice is logged with its reason; --config=<that config.yaml>
    parses to the same policy."""
    import keras

    from tfgpu import train
    from tfgpu.training import experiment

    monkeypatch.setattr(host, "cpu_facts", lambda: copy.deepcopy(_host("cpu_only_amx_bf16")["cpu"]))
    config = Config(model_dir=str(tmp_path), dataset="digits", data_cache_dir=data_cache, model="small_cnn",
                    global_batch_size=16, train_steps=1, eval_split="none", tensorboard=False, verbose=0,
                    precision="auto")
    try:
        with caplog.at_level("INFO", logger="tfgpu"):
            built = experiment.setup(config)
        assert {built.config.precision, built.task.config.precision,
                keras.mixed_precision.global_policy().name} == {"mixed_bfloat16"}
        built.trainer.train()  # config.yaml is written once the run starts (a refused resume writes nothing)
    finally:
        keras.mixed_precision.set_global_policy("float32")
        keras.backend.clear_session(free_memory=False)
    assert [r.getMessage() for r in caplog.records if "precision" in r.getMessage()] == [
        "precision: --precision=auto chose mixed_bfloat16 (this CPU has amx_bf16, so oneDNN computes bfloat16 "
        "matrix work in its AMX tiles)"]
    with open(tmp_path / run_dir.CONFIG_FILE) as f:
        assert yaml.safe_load(f)["precision"] == "mixed_bfloat16"
    repeated = train.parse([f"--config={tmp_path / 'config.yaml'}", f"--model_dir={tmp_path / 'again'}"])
    assert repeated.precision == "mixed_bfloat16"


@pytest.mark.slow
def test_auto_run_records_the_resolved_precision_and_its_config_repeats_it(train_here, tmp_path, monkeypatch):
    """The run logs its choice with the reason; config.yaml and metrics.json hold the policy, not "auto", so
    --config=<model_dir>/config.yaml repeats the run in that policy even on a host that would choose another."""
    tiny = ["--dataset=digits", "--model=small_cnn", "--global_batch_size=32", "--eval_split=none",
            "--train_steps=2", "--steps_per_loop=1", "--tensorboard=false"]
    monkeypatch.setattr(host, "cpu_facts", lambda: copy.deepcopy(_host("cpu_only_amx_bf16")["cpu"]))
    first = tmp_path / "first"
    out = train_here(*tiny, "--precision=auto", f"--model_dir={first}").output
    assert "--precision=auto chose mixed_bfloat16 (this CPU has amx_bf16" in out, out[-2000:]
    with open(first / run_dir.CONFIG_FILE) as f:
        assert yaml.safe_load(f)["precision"] == "mixed_bfloat16"
    with open(first / "metrics.json") as f:
        assert json.load(f)["precision"] == "mixed_bfloat16"

    monkeypatch.setattr(host, "cpu_facts", lambda: copy.deepcopy(_host("cpu_only_avx2")["cpu"]))
    again = tmp_path / "again"
    out = train_here(f"--config={first / 'config.yaml'}", f"--model_dir={again}").output
    assert "--precision=auto" not in out
    with open(again / "metrics.json") as f:
        assert json.load(f)["precision"] == "mixed_bfloat16"


def test_a_bad_precision_is_one_line_naming_the_flag(train_here, tmp_path):
    result = train_here("--dataset=digits", "--precision=fp8", f"--model_dir={tmp_path}", check=False)
    assert result.returncode == 1
    assert result.output.strip().splitlines() == [
        "error: --precision: 'fp8' is not one of float32, mixed_float16, mixed_bfloat16, auto"], result.output


def test_the_run_gpus_are_its_placements_gpus_as_tensorflow_describes_them(monkeypatch):
    """Logical GPU i is visible GPU i; TensorFlow's details give name and (major, minor); a CPU placement has none."""
    import types

    import tensorflow as tf

    visible = [types.SimpleNamespace(name=f"/physical_device:GPU:{i}") for i in range(2)]
    details = {"/physical_device:GPU:0": {"device_name": "Tesla V100-SXM2-16GB", "compute_capability": (7, 0)},
               "/physical_device:GPU:1": {"device_name": "NVIDIA H100 80GB HBM3", "compute_capability": (9, 0)}}
    monkeypatch.setattr(tf.config, "get_visible_devices", lambda kind: visible if kind == "GPU" else [])
    monkeypatch.setattr(tf.config.experimental, "get_device_details", lambda device: details[device.name])
    one_device = types.SimpleNamespace(devices=("/job:localhost/replica:0/task:0/device:GPU:1",))
    assert precision.run_gpus(one_device) == [{"name": "NVIDIA H100 80GB HBM3", "compute_capability": "9.0"}]
    mirrored = types.SimpleNamespace(devices=("/job:worker/replica:0/task:0/device:GPU:0",
                                              "/job:worker/replica:0/task:0/device:GPU:1"))
    assert precision.resolve_auto({}, precision.run_gpus(mirrored))[0] == "mixed_float16"
    assert precision.run_gpus(types.SimpleNamespace(devices=("/job:localhost/replica:0/task:0/device:CPU:0",))) == []


@pytest.mark.parametrize("choices, job", [(["mixed_bfloat16"], "mixed_bfloat16"),
                                          (["mixed_bfloat16", "mixed_float16"], "mixed_float16"),
                                          (["mixed_float16", "float32", "mixed_bfloat16"], "float32")])
def test_a_job_runs_the_policy_of_its_least_capable_worker(choices, job):
    assert precision.least_capable(choices) == job


_WORKER_WITH_CPU_FLAGS = """import json, sys
from tfgpu.runtime import host
host.cpu_facts = lambda: {"model": "recorded", "flags": json.loads(sys.argv[1])}
from tfgpu import train
sys.exit(train.main(sys.argv[2:]))
"""


@pytest.mark.slow
def test_workers_on_different_cpus_agree_on_one_policy(tmp_path, data_cache):
    """Two workers whose own devices would choose differently (one CPU has AMX, one has not) both train in
    float32, the policy both can run, and each says why in one line."""
    import subprocess
    import sys

    import portpicker

    cluster = {"worker": [f"localhost:{portpicker.pick_unused_port()}" for _ in range(2)]}
    args = ["--dataset=digits", "--model=small_cnn", "--global_batch_size=32", "--train_steps=2",
            "--steps_per_loop=1", "--eval_split=none", "--tensorboard=false", "--precision=auto",
            "--collective_timeout_s=60", f"--model_dir={tmp_path}"]
    procs = []
    for index, recorded in enumerate(("cpu_only_amx_bf16", "cpu_only_avx2")):
        env = {**os.environ, "TFGPU_DATA_CACHE": data_cache, "TF_CPP_MIN_LOG_LEVEL": "2",
               "TF_CONFIG": json.dumps({"cluster": cluster, "task": {"type": "worker", "index": index}})}
        procs.append(subprocess.Popen(
            [sys.executable, "-c", _WORKER_WITH_CPU_FLAGS, json.dumps(_host(recorded)["cpu"]["flags"]), *args],
            cwd=REPO, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT))
    try:
        outputs = [proc.communicate(timeout=240)[0] for proc in procs]
    finally:
        for proc in procs:
            proc.kill()
    assert all(proc.returncode == 0 for proc in procs), outputs[0][-3000:] + outputs[1][-3000:]
    assert "precision: --precision=auto chose float32, which every worker can run (this worker alone would run " \
           "mixed_bfloat16: this CPU has amx_bf16" in outputs[0], outputs[0][-3000:]
    assert "precision: --precision=auto chose float32 (this CPU has no AVX512_BF16/AMX" in outputs[1]
    with open(tmp_path / run_dir.CONFIG_FILE) as f:
        assert yaml.safe_load(f)["precision"] == "float32"
    with open(tmp_path / "metrics.json") as f:
        assert json.load(f)["precision"] == "float32"


# -- steps skipped because the float16 all-reduce overflowed (issue 37) ----------------------------------------------
def test_the_nonfinite_advice_names_a_float16_all_reduce_and_the_dtypes_that_fix_it():
    import keras

    def guarded(dtype):
        return precision.GuardedOptimizer(keras.optimizers.SGD(0.1), initial_scale=1.0, dynamic=False,
                                          allreduce_dtype=dtype)

    advice = precision.nonfinite_advice([guarded("float16")], num_replicas=2)
    assert "summed in float16 (--allreduce_dtype=float16)" in advice
    assert "--allreduce_dtype=bfloat16" in advice and "--allreduce_dtype=float32" in advice
    # One replica sums nothing, and bfloat16/float32 on the wire have float32's range: the usual advice.
    for optimizers, replicas in (([guarded("float16")], 1), ([guarded("bfloat16")], 2), ([guarded("float32")], 2),
                                 ([keras.optimizers.SGD(0.1)], 2)):
        assert precision.nonfinite_advice(optimizers, replicas) == precision.GENERAL_NONFINITE_ADVICE


HUGE_GRADIENTS = '''
import keras


def build(input_shape, num_classes):
    """Inputs scaled by 1e7: float32 loss and gradients stay finite, their float16 sum over replicas does not."""
    inputs = keras.Input(input_shape)
    x = keras.layers.Flatten()(keras.layers.Rescaling(1e7)(inputs))
    return keras.Model(inputs, keras.layers.Dense(num_classes)(x))
'''


@pytest.mark.slow  # two logical CPU devices: a process of its own (about 20 s on 2 loaded cores)
def test_a_float16_all_reduce_overflow_in_a_float32_run_names_the_all_reduce(run_train, tmp_path):
    builder = tmp_path / "huge.py"
    builder.write_text(HUGE_GRADIENTS)
    proc = run_train("--dataset=digits", f"--model={builder}:build", "--global_batch_size=32", "--eval_split=none",
                     "--precision=float32", "--cpu_logical_devices=2", "--distribution_strategy=mirrored",
                     "--allreduce_dtype=float16", "--base_learning_rate=0.001", "--train_steps=8",
                     "--steps_per_loop=4", "--max_nonfinite_steps=4", f"--model_dir={tmp_path / 'run'}", check=False)
    assert proc.returncode == 2, proc.output[-3000:]
    assert "summed in float16 (--allreduce_dtype=float16)" in proc.output, proc.output[-3000:]
    assert "--allreduce_dtype=bfloat16" in proc.output


def test_clip_by_global_norm_measures_the_unscaled_gradient():
    import tensorflow as tf

    grads = [tf.constant([3.0, 0.0]) * 8, tf.constant([[4.0]]) * 8]  # norm 5, loss scale 8
    clipped, norm = precision.clip_by_global_norm(grads, 1.0, tf.constant(8.0), num_replicas=1)
    assert float(norm) == pytest.approx(5.0)
    assert float(tf.linalg.global_norm(clipped)) / 8 == pytest.approx(1.0)
