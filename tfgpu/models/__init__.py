"""Networks chosen by name: see ``registry``. Importing the package (e.g. for ``tfgpu.models.user``'s path
helpers while flags are checked) loads Keras only when a registry name below is first used."""
__all__ = ["create_model", "get_spec", "list_models", "model_options", "register_model"]


def __getattr__(name):
    if name in __all__:
        from tfgpu.models import registry

        return getattr(registry, name)
    raise AttributeError(f"module 'tfgpu.models' has no attribute {name!r}")
