"""tfgpu.tasks.gan.options: the GAN's own options section, set as flat flags and recorded as flat config.yaml keys,
checked before TensorFlow is imported."""
import dataclasses
import pathlib

import hypothesis
import hypothesis.strategies as st
import pytest

from tfgpu import cli, config_sources
from tfgpu.config import ConfigError
from tfgpu.tasks.gan.options import GAN_LOSSES, GanOptions
from tfgpu.runtime import run_dir

FIXTURES = pathlib.Path(__file__).resolve().parents[2] / "fixtures"
GAN = {"task": "gan", "model": "dcgan", "dataset": "digits", "model_dir": "/runs/gan"}


def test_flat_gan_flags_fill_the_section_and_config_holds_no_gan_field():
    parser = cli.ArgumentParser("python -m tfgpu.train")
    parser.add_config_flags()
    namespace = parser.parse_args([f"--{name}={value}" for name, value in GAN.items()] +
                                  ["--n_critic=5", "--gan_loss=hinge", "--conditional", "--g_learning_rate=1e-4"])
    config = cli.resolve(namespace, references=False)
    assert GanOptions.of(config) == GanOptions(n_critic=5, gan_loss="hinge", conditional=True, g_learning_rate=1e-4)
    assert not any(hasattr(config, f.name) for f in dataclasses.fields(GanOptions))
    help_text = parser.format_help()
    assert "tfgpu.gan flags" in help_text and "--n_critic INT" in help_text and "--[no]conditional[=BOOL]" in help_text


@pytest.mark.parametrize("values, flag, message", [
    ({"n_critic": 0}, "n_critic", "must be positive, got 0"),
    ({"latent_dim": -8}, "latent_dim", "must be positive, got -8"),
    ({"fid_num_samples": 0}, "fid_num_samples", "must be positive, got 0"),
    ({"gradient_penalty": -10.0}, "gradient_penalty", "must be >= 0, got -10.0"),
    ({"r1_gamma": -1.0}, "r1_gamma", "must be >= 0, got -1.0"),
    ({"ema_decay": -0.5}, "ema_decay", "must be >= 0, got -0.5"),
    ({"gan_loss": "lsgan"}, "gan_loss", "'lsgan' is not one of non_saturating, minimax, wasserstein, hinge"),
    ({"input_range": "0,1"}, "input_range", "GANs always use -1,1 (the generator ends in tanh)"),
])
def test_a_bad_gan_value_is_one_line_naming_its_flag(values, flag, message):
    with pytest.raises(ConfigError) as error:
        config_sources.resolve({**GAN, **values}, references=False)
    assert error.value.flag == flag and str(error.value).startswith(f"--{flag}: {message}")
    assert "\n" not in str(error.value)


@hypothesis.settings(max_examples=40, deadline=None)
@hypothesis.given(options=st.builds(
    GanOptions, latent_dim=st.integers(1, 512), conditional=st.booleans(), gan_loss=st.sampled_from(GAN_LOSSES),
    gradient_penalty=st.floats(0, 100), r1_gamma=st.floats(0, 100), n_critic=st.integers(1, 10),
    g_learning_rate=st.floats(1e-6, 1.0), d_learning_rate=st.floats(1e-6, 1.0), adam_beta1=st.floats(0, 0.99),
    ema_decay=st.floats(0, 0.9999), diffaugment=st.sampled_from(["", "color", "translation,cutout"]),
    fid_num_samples=st.integers(1, 10_000)))
def test_any_gan_section_replays_from_its_flat_config_yaml(options, tmp_path_factory):
    """config.yaml keeps every option flat (a GAN key at the top level, as before sections), and reading it back
    gives the same section."""
    config = config_sources.build(**GAN, **{f.name: getattr(options, f.name) for f in dataclasses.fields(options)})
    path = tmp_path_factory.mktemp("run") / run_dir.CONFIG_FILE
    config_sources.save_yaml(config.check_values(), str(path))
    assert config_sources.load_yaml(str(path))["n_critic"] == options.n_critic
    assert config_sources.resolve({}, str(path), references=False) == config


def test_a_config_yaml_an_earlier_gan_run_wrote_loads_unchanged():
    """Written by tfgpu before the GAN had a section: every option a flat key."""
    path = FIXTURES / "gan_config_before_task_sections.yaml"
    config = config_sources.resolve({}, str(path), references=False)
    assert GanOptions.of(config) == GanOptions(latent_dim=16, gan_loss="hinge", n_critic=2, r1_gamma=1.0,
                                               diffaugment="color,translation", ema_decay=0.99, fid_num_samples=500)
    assert (config.model, config.global_batch_size) == ("sngan", 16)


def test_a_config_without_a_section_reads_the_defaults_and_a_wrong_section_is_refused():
    from tfgpu.config import Config, TaskOptions

    assert GanOptions.of(Config(task="gan")) == GanOptions()

    @dataclasses.dataclass(frozen=True)
    class OtherOptions(TaskOptions):
        task = "other"

    with pytest.raises(ConfigError, match="^--task: this run is --task=gan but holds the options of --task=other$"):
        Config(task="gan", model_dir="d", dataset="digits", task_options=OtherOptions()).check_values()
