"""The run's configuration, a leaf that imports nothing else of tfgpu: ``options`` declares every shared option
(``Config``, ``TaskOptions``, ``ConfigError``, ``coerce_to``), ``sections`` the slices subsystems receive
(``RuntimeConfig`` ... ``TrainerConfig``). Callers import the names from here: ``from tfgpu.config import Config``."""
from tfgpu.config.options import (PRECISIONS, STRATEGIES, Config, ConfigError, TaskOptions, coerce_to, field_type,
                                  fields, option)
from tfgpu.config.sections import (SECTIONS, DatasetConfig, InputConfig, OptimizationConfig, PrecisionConfig,
                                   RuntimeConfig, Section, TrainerConfig)

# A traceback names the error where users import it from (``tfgpu.config.ConfigError``), not the module that holds it.
ConfigError.__module__ = __name__

__all__ = ["PRECISIONS", "STRATEGIES", "Config", "ConfigError", "TaskOptions", "coerce_to", "field_type", "fields",
           "option", "SECTIONS", "DatasetConfig", "InputConfig", "OptimizationConfig", "PrecisionConfig",
           "RuntimeConfig", "Section", "TrainerConfig"]
