"""Networks chosen by name: see ``registry``."""
from tfgpu.models.registry import create_model, get_spec, list_models, register_model

__all__ = ["create_model", "get_spec", "list_models", "register_model"]
