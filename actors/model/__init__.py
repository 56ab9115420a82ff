"""Model providers for the agent runtime (one ``generate`` call per agent step).

``make_provider(name, **options)`` builds one of ``mock`` (the default, a deterministic directive
grammar), ``scripted`` (canned answers for tests), ``replay`` (recorded answers for ``rerun``) and
``openai`` (any OpenAI-compatible streaming endpoint).

Named models (``[models.NAME]`` in config.toml, ``serve --model-*``) and the provider each session
uses are in :mod:`.registry` (``ModelRegistry``, ``load_model_configs``).
"""

from sessionloop.actors.model.base import (
    PROVIDER_NAMES,
    DeltaCallback,
    ModelError,
    ModelRequest,
    ModelResponse,
    Provider,
    ignore_delta,
)
from sessionloop.actors.model.mock import MockProvider
from sessionloop.actors.model.openai import OpenAIProvider
from sessionloop.actors.model.registry import (
    ModelConfig,
    ModelConfigError,
    ModelFlags,
    ModelRegistry,
    load_model_configs,
    make_provider,
)
from sessionloop.actors.model.replay import ReplayDivergence, ReplayProvider
from sessionloop.actors.model.scripted import ScriptedProvider

__all__ = [
    "PROVIDER_NAMES",
    "DeltaCallback",
    "MockProvider",
    "ModelConfig",
    "ModelConfigError",
    "ModelError",
    "ModelFlags",
    "ModelRegistry",
    "ModelRequest",
    "ModelResponse",
    "OpenAIProvider",
    "Provider",
    "ReplayDivergence",
    "ReplayProvider",
    "ScriptedProvider",
    "ignore_delta",
    "load_model_configs",
    "make_provider",
]
