"""The names tfgpu's model families register, known without importing them (and with them TensorFlow): a mistyped
--model is then one line in well under a second (``config_sources.check_names``). tests/models/test_names.py checks
this list against the registry, so a new model's name is added here too."""
import sys

REGISTERED = ("convnext_tiny", "dcgan", "efficientnet_b0", "mobilenet_v2", "resnet101", "resnet110", "resnet152",
              "resnet18", "resnet20", "resnet32", "resnet34", "resnet44", "resnet50", "resnet56", "small_cnn", "sngan",
              "wgan_gp")


def known() -> tuple:
    """The registered names: tfgpu's, and any this process registered already (tfgpu.fit's model functions, a
    script's own ``@register_model``)."""
    registration = sys.modules.get("tfgpu.models.registration")
    return tuple(sorted(set(REGISTERED) | set(getattr(registration, "_MODELS", {}))))
