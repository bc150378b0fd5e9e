"""The one config tree: dataclasses (``schema``), loaded from YAML with dotted ``key=value`` overrides
(``loading``), checked before any work starts (``schema.check_fields`` for each field, ``checks`` for the rest).

The defaults *are* the built-in quickstart (tiny policies, two-agent Plan-Path on CPU), so ``atgrpo train``
with no config runs it. Errors name the key and the valid choices.
"""

from .checks import max_new_tokens_any, validate
from .loading import apply_override, load_config, load_resume_config, overrides_tree, read_yaml_file
from .ray_fit import RAY_MIN_FRACTION, local_ray_cpus, ray_cpu_shares
from .schema import (LOGGING_BACKENDS, AlgoConfig, Config, ConfigError, EnvConfig, EvalConfig, LoggingConfig,
                     LoRAConfig, ModelConfig, PolicyConfig, RayConfig, RolloutConfig, SystemConfig, TinyConfig,
                     TrainConfig, VLLMConfig, WarmStartConfig)

__all__ = ["AlgoConfig", "Config", "ConfigError", "EnvConfig", "EvalConfig", "LOGGING_BACKENDS", "LoggingConfig",
           "LoRAConfig", "ModelConfig", "PolicyConfig", "RAY_MIN_FRACTION", "RayConfig", "RolloutConfig",
           "SystemConfig", "TinyConfig", "TrainConfig", "VLLMConfig", "WarmStartConfig", "apply_override",
           "load_config", "load_resume_config", "local_ray_cpus", "max_new_tokens_any", "overrides_tree",
           "ray_cpu_shares", "read_yaml_file", "validate"]
