"""The model zoo recipes in configs/ parse with absl and resolve to a valid Config."""
import pathlib

import pytest
from absl import flags

from tfgpu import config_sources

_CONFIGS = pathlib.Path(__file__).resolve().parents[2] / "configs"
_RECIPES = ["imagenet_resnet50.flags", "cifar10_resnet56.flags", "cifar10_resnet20_bf16_cpu.flags",
            "cifar10_wgan_gp.flags", "mnist5k.flags"]


def _flags_in(path) -> dict:
    argv = flags.FlagValues().read_flags_from_files(["prog", f"--flagfile={path}"])[1:]
    values = {}
    for arg in argv:
        name, sep, value = arg[2:].partition("=")
        assert arg.startswith("--") and sep, f"{path.name}: {arg!r} is not --name=value"
        assert "#" not in value, f"{path.name}: absl has no inline comments: {arg!r}"
        assert name not in values, f"{path.name}: --{name} set twice"
        values[name] = value
    return values


@pytest.mark.parametrize("recipe", _RECIPES)
def test_recipe_resolves_to_a_valid_config(recipe, tmp_path):
    values = _flags_in(_CONFIGS / recipe)
    resolved = config_sources.resolve({**values, "model_dir": str(tmp_path)})
    assert resolved.model == values["model"]
    assert "model_dir" not in values  # every run names its own directory


@pytest.mark.parametrize("recipe", _RECIPES)
def test_recipe_header_says_how_to_run_it_and_what_to_expect(recipe):
    header = (_CONFIGS / recipe).read_text().split("\n\n")[0]
    assert all(line.startswith("#") for line in header.splitlines())
    for word in ("# Run", f"tfgpu-train --flagfile=configs/{recipe}", "Hardware:", "Expected:"):
        assert word in header, f"{recipe}: header lacks {word!r}"


def test_imagenet_recipe_keeps_the_reference_hyperparameters():
    resolved = config_sources.resolve({**_flags_in(_CONFIGS / "imagenet_resnet50.flags"), "model_dir": "/tmp/x"})
    assert (resolved.global_batch_size, resolved.base_learning_rate, resolved.epochs) == (1024, 0.1, 90)
    assert (resolved.precision, resolved.jit_compile, resolved.image_size) == ("auto", True, 224)


@pytest.mark.parametrize("recipe, precision", [
    ("quickstart.flags", "auto"), ("mnist5k.flags", "auto"), ("imagenet_resnet50.flags", "auto"),
    ("cifar10_resnet56.flags", "auto"),
    ("cifar10_resnet20_bf16_cpu.flags", "mixed_bfloat16"),  # its name promises bfloat16
    ("cifar10_wgan_gp.flags", "mixed_float16"), ("quickstart_gan.flags", "float32"),  # GANs: auto not tried
])
def test_recipes_pick_the_precision_by_hardware_unless_they_need_one(recipe, precision):
    assert _flags_in(_CONFIGS / recipe)["precision"] == precision


def test_mnist5k_recipe_is_the_quickstarts_with_xla_and_its_own_data_sizes():
    """The race recipe may differ from the quickstart only where the data differs, and in XLA (measured)."""
    quickstart, mnist5k = _flags_in(_CONFIGS / "quickstart.flags"), _flags_in(_CONFIGS / "mnist5k.flags")
    sized = {"dataset", "steps_per_loop", "eval_every_steps", "checkpoint_every_steps"}
    assert {k for k in quickstart.keys() | mnist5k.keys() if quickstart.get(k) != mnist5k.get(k)} == sized | {
        "jit_compile"}
    assert mnist5k["jit_compile"] == "true" and mnist5k["dataset"] == "mnist5k"


def test_wgan_gp_recipe_keeps_the_papers_algorithm_1_defaults():
    """Gulrajani et al. 2017, Algorithm 1: lambda 10, n_critic 5, Adam(1e-4, beta_1=0, beta_2=0.9)."""
    resolved = config_sources.resolve({**_flags_in(_CONFIGS / "cifar10_wgan_gp.flags"), "model_dir": "/tmp/x"})
    assert (resolved.task, resolved.model, resolved.gan_loss) == ("gan", "wgan_gp", "wasserstein")
    assert (resolved.gradient_penalty, resolved.n_critic, resolved.global_batch_size) == (10.0, 5, 64)
    assert (resolved.g_learning_rate, resolved.d_learning_rate) == (1e-4, 1e-4)
    assert (resolved.adam_beta1, resolved.adam_beta2) == (0.0, 0.9)
