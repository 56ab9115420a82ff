"""The command-line flags that describe the model ``default`` (``serve``, ``doctor``): the one-model
flags and the mock clock's."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

from sessionloop.actors.model.mock import (
    DEFAULT_SIGMA,
    JITTERS,
    MAX_LATENCY_MS,
    MAX_SEED,
    MAX_SIGMA,
    MAX_TOKENS_PER_S,
    TOKEN_CHARS,
)
from sessionloop.actors.model.registry import CONFIG_PROVIDERS, ModelFlags


def model_flag_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """The one-model flags (``serve``, ``doctor``): they describe the model ``default``, over
    ``[models.default]`` of config.toml when it has one."""
    options = [
        click.option("--model-provider", type=click.Choice(list(CONFIG_PROVIDERS)), default=None,
                     help="Provider of the model 'default': openai (any OpenAI-compatible endpoint: vLLM, Ollama, "
                          "LiteLLM, OpenRouter, the OpenAI API) or mock. Default with any other --model-* flag: "
                          "openai."),
        click.option("--base-url", default=None, metavar="URL",
                     help="Base URL of the endpoint, e.g. http://127.0.0.1:8000/v1 (default: https://api.openai.com/v1)."),
        click.option("--model-name", default=None, metavar="ID", help="Model id the endpoint is asked for."),
        click.option("--api-key-env", default=None, metavar="VAR",
                     help="Name of the environment variable that holds the API key (never the key itself)."),
    ]
    for option in reversed(options):
        command = option(command)
    return command


def mock_clock_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """``serve``'s mock clock flags: like the --model-* flags they describe the model ``default``
    (given alone, a mock); the same keys in a mock's ``[models.NAME]`` table (actors/model/mock.py)."""
    options = [
        click.option("--mock-latency-ms", type=click.FloatRange(0, MAX_LATENCY_MS), default=None, metavar="MS",
                     help="Mock model 'default': delay before the first token (the median with a jitter) "
                          "[default: 0]."),
        click.option("--mock-latency-jitter", type=click.Choice(list(JITTERS)), default=None,
                     help="Mock model 'default': how the delay varies: none, lognormal (median --mock-latency-ms, "
                          "spread --mock-latency-sigma) or uniform (0 to twice it) [default: none]."),
        click.option("--mock-latency-sigma", type=click.FloatRange(0, MAX_SIGMA), default=None,
                     help=f"Mock model 'default': sigma of the lognormal jitter [default: {DEFAULT_SIGMA}]."),
        click.option("--mock-stream-tokens-per-s", type=click.FloatRange(0, MAX_TOKENS_PER_S), default=None,
                     metavar="N", help=f"Mock model 'default': stream answers at N tokens/s (a token is {TOKEN_CHARS} "
                                       "characters; 0: as fast as they come) [default: 0]."),
        click.option("--mock-seed", type=click.IntRange(0, MAX_SEED), default=None,
                     help="Mock model 'default': seed of the jitter's random generator (repeatable runs)."),
    ]
    for option in reversed(options):
        command = option(command)
    return command


def flags_from(model_provider: str | None, base_url: str | None, model_name: str | None,
               api_key_env: str | None, **clock: Any) -> ModelFlags | None:
    """The one-model flags, ``clock``: the mock clock flags (``latency_ms=...``, None: not given)."""
    flags = ModelFlags(provider=model_provider, base_url=base_url, model=model_name, api_key_env=api_key_env,
                       **clock)
    return flags if flags.table() else None


__all__ = ["flags_from", "mock_clock_options", "model_flag_options"]
