"""tfgpu.bench.case: the strategy a Keras fit baseline runs under (built on a CPU here; on a GPU the same code
places the OneDeviceStrategy on GPU:0)."""
import dataclasses

import tensorflow as tf

from tfgpu import config_sources
from tfgpu.bench import case


def _config():
    return config_sources.resolve({"model": "small_cnn", "dataset": "synthetic", "image_size": 8, "model_dir": "unused",
                               "distribution_strategy": "one_device", "cpu_logical_devices": 0})


def test_keras_one_device_strategy_gives_fit_a_one_device_strategy_on_its_device():
    placement = case.baseline_placement(_config(), "keras_fit_spe", one_device_strategy=True)
    assert isinstance(placement.strategy, tf.distribute.OneDeviceStrategy)
    assert placement.kind == "one_device" and placement.num_replicas == 1
    gpus = tf.config.list_logical_devices("GPU")
    assert placement.devices == ((gpus or tf.config.list_logical_devices("CPU"))[0].name,)
    assert case.input_to_device(placement, on_gpu=True) == "prefetched by the strategy's distributed dataset"


def test_without_the_option_fit_runs_as_users_write_it():
    assert case.baseline_placement(_config(), "keras_fit", one_device_strategy=False) is None
    assert case.input_to_device(None, on_gpu=True) == "copied to the GPU inside each step (no strategy)"
    assert case.input_to_device(None, on_gpu=False) == "host memory (CPU device)"
    # keras_fit_strategy takes tfgpu's own strategy whatever the option says.
    own = dataclasses.replace(_config(), distribution_strategy="one_device")
    assert case.baseline_placement(own, "keras_fit_strategy", one_device_strategy=False).kind == "one_device"


def test_one_device_takes_tfgpu_and_fit_off_split_cpus_and_extra_gpus():
    split = dataclasses.replace(_config(), distribution_strategy="mirrored", cpu_logical_devices=2)
    one = case.one_device(split)
    assert (one.distribution_strategy, one.cpu_logical_devices) == ("one_device", 0)
    # Only the first GPU stays visible where there are GPUs; a CPU host keeps --num_gpus as given (no error).
    assert one.num_gpus == (1 if tf.config.list_physical_devices("GPU") else split.num_gpus)


def test_tfgpu_input_to_device_follows_the_iterator_the_loop_reads():
    from types import SimpleNamespace

    cpu, gpu = "/job:localhost/replica:0/task:0/device:CPU:0", "/job:localhost/replica:0/task:0/device:GPU:0"
    one_cpu = SimpleNamespace(devices=(cpu,), num_replicas=1, num_workers=1)
    one_gpu = SimpleNamespace(devices=(gpu,), num_replicas=1, num_workers=1)
    assert case.tfgpu_input_to_device(one_cpu) == "host memory (CPU device; the dataset's own iterator)"
    assert case.tfgpu_input_to_device(one_gpu) == "prefetched by the strategy's distributed dataset"


def test_the_cpu_peak_is_a_matmul_probe_in_the_policy_dtype():
    from tfgpu.bench.case import cpu_matmul_peak_tflops

    tflops, label = cpu_matmul_peak_tflops("mixed_bfloat16", size=256, seconds=0.1)
    assert tflops > 0.001 and label.startswith("CPU bfloat16 matmul probe (256x256")
