"""tfgpu.models.names: the registered model names known before TensorFlow is imported are the registry's."""
from tfgpu.models import names, registry


def test_the_static_list_is_exactly_what_the_families_register():
    from tfgpu.models.registration import _MODELS

    registry.list_models()  # imports every family
    builtin = {name for name, spec in _MODELS.items() if spec.builder.__module__.startswith("tfgpu.models.")}
    assert set(names.REGISTERED) == builtin, "add the new model's name to tfgpu/models/names.py"
    assert set(names.known()) >= set(_MODELS)  # and a name this process registered (a test's, tfgpu.fit's)
