"""tfgpu.config: a YAML config (--config) that is malformed stops the run with one line naming the file."""

import pytest
import yaml

from tfgpu import config as config_lib
from tfgpu import config_sources
from tfgpu.config import ConfigError
from tfgpu.runtime import run_dir

BASE = {"dataset": "digits", "model": "small_cnn", "model_dir": "/tmp/unused"}


def _resolve_yaml(tmp_path, text: str, name="run.yaml"):
    path = tmp_path / name
    path.write_text(text) if isinstance(text, str) else path.write_bytes(text)
    return config_sources.resolve({}, str(path)), str(path)


@pytest.mark.parametrize("text, message", [
    ("seed: [1,\n", "is not valid YAML: expected the node content, but found '<stream end>' at line 2, column 1"),
    ("model: small_cnn\n  seed: 3\n", "is not valid YAML: mapping values are not allowed here at line 2"),
    ("- seed: 3\n", "must hold a mapping of option: value, got list"),
    ("just a sentence\n", "must hold a mapping of option: value, got str"),
    ("1: 2\n", "option names must be strings, got 1"),
    ("learning_rat: 0.1\n", "learning_rat: unknown option"),
    ("seed: abc\n", "seed: expected int, got 'abc'"),
    ("seed: 1.5\n", "seed: expected int, got 1.5"),
    ("jit_compile: maybe\n", "jit_compile: expected bool, got 'maybe'"),
    ("lr_decay_epochs: [30, x]\n", "lr_decay_epochs: expected tuple, got [30, 'x']"),
    ("model: [resnet20]\n", "model: expected str, got ['resnet20']"),  # str() would have made it "['resnet20']"
    ("data_service:\n", "data_service: expected str, got None"),  # ... and this "None"
    (b"seed: \xff\xfe\n", "is not a UTF-8 text file"),
])
def test_malformed_yaml_config_is_one_line_naming_the_file(tmp_path, text, message):
    with pytest.raises(ConfigError) as e:
        _resolve_yaml(tmp_path, text)
    path = str(tmp_path / "run.yaml")
    assert e.value.flag == "config"
    assert str(e.value).startswith(f"--config: {path}"), str(e.value)
    assert message in str(e.value) and "\n" not in str(e.value), str(e.value)


def test_unreadable_or_missing_yaml_config(tmp_path):
    with pytest.raises(ConfigError, match=f"^--config: cannot read {tmp_path}: Is a directory$"):
        config_sources.resolve({}, str(tmp_path))
    with pytest.raises(ConfigError, match="^--config: file '/no/such.yaml' does not exist$"):
        config_sources.resolve({}, "/no/such.yaml")


def test_well_formed_yaml_still_loads_and_command_line_wins(tmp_path):
    text = yaml.safe_dump({**BASE, "seed": 3, "base_learning_rate": "1e-4", "lr_decay_epochs": [30, 60],
                           "jit_compile": True})
    path = tmp_path / "ok.yaml"
    path.write_text(text)
    config = config_sources.resolve({"seed": 5}, str(path))
    assert (config.seed, config.base_learning_rate, config.lr_decay_epochs, config.jit_compile) == (
        5, 1e-4, (30.0, 60.0), True)
    empty = tmp_path / "empty.yaml"
    empty.write_text("# nothing set\n")
    assert config_sources.load_yaml(str(empty)) == {}


def test_a_saved_config_replays(tmp_path):
    config = config_sources.resolve(BASE)
    path = run_dir.config_yaml(tmp_path)
    config_sources.save_yaml(config, path)
    assert config_sources.resolve({}, path) == config


def test_options_are_filed_and_described_for_the_tasks_that_read_them():
    """--help tells which task reads an option: the GAN has its own Adam pair and no XLA, and the stop after
    non-finite steps guards every task's loop (it was filed under the GAN's options)."""
    by_name = {f.name: f.metadata for f in config_lib.fields()}
    assert by_name["max_nonfinite_steps"]["group"] == "experiment"
    assert "The GAN task does not compile with XLA" in by_name["jit_compile"]["help"]
    for name, meta in by_name.items():
        if meta["group"] == "optimizer" and name != "grad_clip_norm":
            assert meta["help"].startswith("Classification"), name
    assert "GAN" in by_name["grad_clip_norm"]["help"]


def test_a_gan_refuses_an_input_range_other_than_its_tanh_range():
    with pytest.raises(ConfigError, match=r"^--input_range: GANs always use -1,1 \(the generator ends in tanh\)"):
        config_sources.build(model_dir="d", dataset="digits", task="gan", input_range=(0.0, 1.0)).check_values()
    config_sources.build(model_dir="d", dataset="digits", task="gan", input_range=(-1.0, 1.0)).check_values()
    config_sources.build(model_dir="d", dataset="digits", input_range=(0.0, 1.0)).check_values()


def test_an_input_range_float32_cannot_hold_is_refused_naming_the_flag():
    import pytest

    from tfgpu.config import Config, ConfigError

    for bad in ((0.0, 3.2e-40), (1.0, 1.0 + 1e-9), (1e-39, 1.0)):
        with pytest.raises(ConfigError, match="--input_range: .*too narrow for float32"):
            Config(model_dir="unused", dataset="digits", input_range=bad).check_values()
    Config(model_dir="unused", dataset="digits", input_range=(0.0, 1e-3)).check_values()


def test_a_config_error_crosses_a_process_as_the_same_line():
    """Exceptions reach a parent pickled (multiprocessing): the error, and tfgpu.fit's, arrive naming the same flag."""
    import pickle

    from tfgpu.training.fit.arguments import FitError

    for error in (ConfigError("data_dir", "no such directory"), FitError("epochs", "must be positive")):
        back = pickle.loads(pickle.dumps(error))
        assert (type(back), str(back), back.flag, back.reason) == (type(error), str(error), error.flag, error.reason)
