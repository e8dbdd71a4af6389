"""training/fit/arguments: a bad argument is one line naming it, before any work; compile()'s arguments are sent to
compile(); an unknown one gets a did-you-mean."""
import pytest

from tfgpu.config import ConfigError
from tfgpu.training.fit import arguments

KERAS_DEFAULTS = dict(batch_size=None, epochs=1, validation_split=0.0, shuffle=True, initial_epoch=0,
                      steps_per_epoch=None, validation_steps=None, validation_batch_size=None, validation_freq=1)


@pytest.mark.parametrize("name, value", [("epochs", 0), ("epochs", 1.5), ("validation_freq", 0), ("initial_epoch", -1),
                                         ("batch_size", 0), ("steps_per_epoch", True), ("validation_split", 1.0),
                                         ("shuffle", "batch")])
def test_a_bad_keras_argument_names_itself(name, value):
    with pytest.raises(ConfigError) as error:
        arguments.check_keras_arguments({**KERAS_DEFAULTS, name: value})
    assert error.value.flag == name and str(error.value).startswith(f"tfgpu.fit: {name}: ")


def test_options_are_checked_and_compile_arguments_sent_to_compile():
    assert arguments.loop_options({}) == arguments.LoopOptions()
    options = arguments.loop_options({"model_dir": "/tmp/x", "checkpoint_every": "2min", "seed": 3,
                                      "steps_per_loop": 10})
    assert (options.model_dir, options.checkpoint_every_s, options.seed, options.steps_per_loop) == \
        ("/tmp/x", 120.0, 3, 10)
    with pytest.raises(ConfigError, match=r"tfgpu.fit: loss: is compile\(\)'s"):
        arguments.loop_options({"loss": "mse"})
    with pytest.raises(ConfigError, match=r"tfgpu.fit: modl_dir: unknown argument \(did you mean model_dir"):
        arguments.loop_options({"modl_dir": "x"})
    for name, value in (("checkpoint_every", "5 steps"), ("checkpoint_every", -1), ("seed", 1.5),
                        ("steps_per_loop", 0), ("model_dir", "")):
        with pytest.raises(ConfigError) as error:
            arguments.loop_options({name: value})
        assert error.value.flag == name


def test_runs_without_model_dir_get_new_directories_and_a_job_one_name_for_every_worker(tmp_path):
    first = arguments.new_run_dir(root=str(tmp_path))
    assert first != arguments.new_run_dir(root=str(tmp_path))
    spec = '{"worker": ["a:1", "b:2"]}'
    count = arguments._CALLS[0]
    name = arguments.new_run_dir(spec, root=str(tmp_path))
    arguments._CALLS[0] = count  # another worker of the same job, at its same call
    assert arguments.new_run_dir(spec, root=str(tmp_path)) == name
