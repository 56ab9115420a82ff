"""Named model configurations: ``[models.NAME]`` in ``<data>/config.toml`` and ``serve``'s
one-model flags, validated at load, and the providers sessions talk to (issue "Real models in
production", Configuration).

Configuration
-------------
::

    [models.default]                       # the default model (else the first one written)
    provider = "openai"                    # any OpenAI-compatible endpoint, or "mock"
    base_url = "http://127.0.0.1:8000/v1"  # vLLM, Ollama, LiteLLM, OpenRouter, the OpenAI API ...
    model = "Qwen/Qwen2.5-7B-Instruct"     # the model id the endpoint is asked for
    api_key_env = "VLLM_KEY"               # the NAME of the variable holding the key, never the key
    vision = false                         # whether it takes images
    max_concurrency = 8                    # limits for the provider (placeholders: optional)
    rpm = 600
    tpm = 1000000

    [models.slow]                          # a mock that spends the time of a real model
    provider = "mock"
    latency_ms = 800                       # before the first token (the median with a jitter)
    latency_jitter = "lognormal"           # none | lognormal | uniform
    latency_sigma = 0.5                    # the lognormal's spread
    stream_tokens_per_s = 50               # 0: no pacing; a token is 4 characters
    seed = 1                               # the jitter's random generator: repeatable runs

``serve --model-provider/--base-url/--model-name/--api-key-env`` and the mock's clock flags
``serve --mock-latency-ms/--mock-latency-jitter/--mock-latency-sigma/--mock-stream-tokens-per-s/
--mock-seed`` describe the model ``default`` (over its table, if config.toml has one; given alone,
the clock flags make it a mock). Nothing configured: the built-in model of the host's
options (``HostOptions.model``, the mock by default) under its provider's name.

:func:`load_model_configs` reads and validates; every problem is one line naming the model and
what is wrong (an unknown provider, an unset key variable, a malformed URL, a key written in the
file, an unknown key), raised as :class:`ModelConfigError`. It is a plain function of the file,
the flags and the environment, so a reload (SIGHUP) calls it again and hands the result to
:meth:`ModelRegistry.replace`.

Model references
----------------
A session names its model with the ``llm/model`` setting. The value is an entry id
``<name>/<model id>`` (as the option list writes a model: ``<provider instance id>/<model id>``;
here a configured name is the provider instance), or the bare configured ``<name>``. Stored values
of earlier releases (``mock/mock-large``: the built-in mock, model id ``mock-large``) keep working:
the built-in model and mock models take any model id; a configured OpenAI-compatible model serves
its own model id only, so nobody can point a session at another (costlier) model on the same
endpoint. :meth:`ModelRegistry.resolve` is total (an unknown reference is the default model);
:meth:`ModelRegistry.check` says why a value is not a usable model (settings refuse it).
"""

from __future__ import annotations

import logging
import os
import re
import tomllib
import urllib.parse
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import msgspec

from sessionloop.actors.model.base import PROVIDER_NAMES, ModelError, Provider
from sessionloop.actors.model.limits import ModelLimits
from sessionloop.actors.model.mock import CLOCK_OPTIONS, MockClock, MockProvider
from sessionloop.actors.model.openai import OpenAIProvider, openai_provider
from sessionloop.actors.model.replay import ReplayProvider
from sessionloop.actors.model.scripted import ScriptedProvider
from sessionloop.eventstore.errors import SessionloopError

log = logging.getLogger("sessionloop.models")

#: providers a ``[models.NAME]`` table may name
CONFIG_PROVIDERS: tuple[str, ...] = ("openai", "mock")
DEFAULT_BASE_URL = "https://api.openai.com/v1"  # actors.model.openai's, not imported: see build_provider
DEFAULT_NAME = "default"
NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")  # no "/": it separates name and model id
ENV_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")
MAX_MODEL_ID = 256
MAX_URL = 2048
MAX_LIMIT = 10**12
LIMIT_KEYS = ("max_concurrency", "rpm", "tpm")
KNOWN_KEYS = ("provider", "base_url", "model", "api_key_env", "vision", *LIMIT_KEYS, *CLOCK_OPTIONS)
#: keys that would hold a secret: refused, with the way to do it instead
SECRET_KEYS = ("api_key", "key", "token", "secret", "password", "authorization")
FLAGS_SOURCE = "--model-* flags"


class ModelConfigError(SessionloopError):
    """A model configuration cannot be used; the message is one line naming the model."""

    code = "model-config"


class ModelConfig(msgspec.Struct, frozen=True, kw_only=True):
    """One named model. ``api_key_env`` is the variable's name; the key is read from the
    environment when the provider is made and is never stored here."""

    name: str
    provider: str
    model: str
    base_url: str | None = None
    api_key_env: str | None = None
    vision: bool = False
    limits: ModelLimits = ModelLimits()
    source: str = "config.toml"
    #: the built-in model of the host's options (``HostOptions.model``): no table, any model id
    builtin: bool = False
    #: how a mock spends time (latency, pacing); None for other providers
    clock: MockClock | None = None

    @property
    def entry_id(self) -> str:
        return f"{self.name}/{self.model}"

    @property
    def any_model_id(self) -> bool:
        """Whether a session may ask this model for another model id (``name/<id>``)."""
        return self.builtin or self.provider == "mock"

    def describe(self) -> str:
        """One log line: provider, model id, base URL and the key's variable (never the key)."""
        parts = [f"model {self.name}: provider {self.provider}, model id {self.model}"]
        if self.base_url:
            parts.append(f"base URL {self.base_url}")
        if self.provider != "mock" and not self.builtin:
            parts.append(f"key from ${self.api_key_env}" if self.api_key_env else "no key")
        if self.vision:
            parts.append("vision")
        if self.clock is not None and self.clock.waits:
            parts.append(self.clock.describe())
        limits = [f"{k} {getattr(self.limits, k)}" for k in LIMIT_KEYS if getattr(self.limits, k) is not None]
        parts.extend(limits)
        return ", ".join(parts) + f" ({self.source})"


class ModelFlags(msgspec.Struct, frozen=True, kw_only=True):
    """``serve``'s one-model flags (None: not given)."""

    provider: str | None = None
    base_url: str | None = None
    model: str | None = None
    api_key_env: str | None = None
    #: the mock's clock (``--mock-*``): keys of :data:`~actors.model.mock.CLOCK_OPTIONS`
    latency_ms: float | None = None
    latency_jitter: str | None = None
    latency_sigma: float | None = None
    stream_tokens_per_s: float | None = None
    seed: int | None = None

    def table(self) -> dict[str, Any]:
        return {k: v for k, v in msgspec.structs.asdict(self).items() if v is not None}


# --- loading ----------------------------------------------------------------------------------------


def read_document(path: str) -> dict[str, Any]:
    """The TOML document at ``path`` ({} when there is none); ModelConfigError when it cannot be
    read or is not TOML."""
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except FileNotFoundError:
        return {}
    except tomllib.TOMLDecodeError as e:
        raise ModelConfigError(f"{path}: not valid TOML: {e}") from e
    except OSError as e:
        raise ModelConfigError(f"{path}: cannot be read: {e.strerror or e}") from e


def model_tables(doc: Mapping[str, Any], flags: ModelFlags | None, path: str) -> dict[str, tuple[Any, str]]:
    """``{name: (table, source)}`` in the document's order; the flags over ``[models.default]``."""
    models = doc.get("models", {})
    if not isinstance(models, dict):
        raise ModelConfigError(f"{path}: models must be a table of [models.NAME] tables")
    out: dict[str, tuple[Any, str]] = {name: (table, path) for name, table in models.items()}
    given = flags.table() if flags is not None else {}
    if given:
        base = out.get(DEFAULT_NAME, ({}, path))[0]
        merged = {**base, **given} if isinstance(base, dict) else given
        if "provider" not in merged:  # the clock flags alone describe a mock
            merged["provider"] = "mock" if all(k in CLOCK_OPTIONS for k in given) else "openai"
        source = FLAGS_SOURCE if DEFAULT_NAME not in out else f"{path} with {FLAGS_SOURCE}"
        out[DEFAULT_NAME] = (merged, source)
    return out


def parse_model(name: str, table: Any, env: Mapping[str, str], source: str) -> ModelConfig:
    """Validate one model table; raises ModelConfigError (one line naming the model)."""

    def fail(problem: str) -> ModelConfigError:
        return ModelConfigError(f"{source} [models.{name}]: {problem}")

    if not NAME_RE.fullmatch(name):
        raise fail("a model name is 1-64 letters, digits, '_', '.' or '-' (no '/'), starting with a letter "
                   "or digit")
    if not isinstance(table, dict):
        raise fail("must be a table (provider, base_url, model, api_key_env ...)")
    for key in table:
        if key.lower() in SECRET_KEYS:
            raise fail(f"{key}: a key is never written in the file; put it in an environment variable and name "
                       "that variable with api_key_env")
        if key not in KNOWN_KEYS:
            raise fail(f"unknown key {key!r} (known: {', '.join(KNOWN_KEYS)})")
    provider = table.get("provider")
    if not isinstance(provider, str) or provider not in CONFIG_PROVIDERS:
        raise fail(f"unknown provider {provider!r} (known: {', '.join(CONFIG_PROVIDERS)}; vLLM, Ollama, LiteLLM, "
                   "OpenRouter and the OpenAI API are all provider \"openai\" with their base_url)")
    model = table.get("model", "mock" if provider == "mock" else None)
    if not isinstance(model, str) or not model.strip() or len(model) > MAX_MODEL_ID or _has_control(model):
        raise fail(f"model: the model id the endpoint is asked for (1-{MAX_MODEL_ID} characters) is "
                   f"{'missing' if model is None else 'not valid'}")
    vision = table.get("vision", False)
    if not isinstance(vision, bool):
        raise fail("vision: expected true or false")
    limits = {}
    for key in LIMIT_KEYS:
        value = table.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_LIMIT):
            raise fail(f"{key}: expected a whole number from 1 to {MAX_LIMIT}")
        if value is not None:
            limits[key] = value  # an absent one keeps the provider's default (actors.model.limits)
    if provider == "mock":
        for key in ("base_url", "api_key_env"):
            if key in table:
                raise fail(f"{key}: the mock provider is built in and takes no {key}")
        try:
            clock = MockClock(**{k: table[k] for k in CLOCK_OPTIONS if k in table})
        except ModelError as e:
            raise fail(str(e)) from None
        return ModelConfig(name=name, provider=provider, model=model, vision=vision,
                           limits=ModelLimits(**limits), source=source, clock=clock)
    for key in CLOCK_OPTIONS:
        if key in table:
            raise fail(f"{key}: only the mock provider takes it (it sets the mock's clock)")
    base_url = table.get("base_url", DEFAULT_BASE_URL)
    problem = url_problem(base_url)
    if problem is not None:
        raise fail(f"base_url {base_url!r} {problem}")
    key_env = table.get("api_key_env")
    if key_env is not None:
        if not isinstance(key_env, str) or not ENV_RE.fullmatch(key_env):
            raise fail("api_key_env: the name of an environment variable (like OPENAI_API_KEY), not the key")
        if not env.get(key_env):
            raise fail(f"api_key_env {key_env} is not set in the environment (export it, or remove api_key_env "
                       "for an endpoint that needs no key)")
    return ModelConfig(name=name, provider=provider, model=model, base_url=str(base_url).rstrip("/"),
                       api_key_env=key_env, vision=vision, limits=ModelLimits(**limits), source=source)


def url_problem(url: Any) -> str | None:
    """Why ``url`` is not a usable base URL (a plain http(s) URL with a host), or None."""
    if not isinstance(url, str) or not url:
        return "is not a URL"
    if len(url) > MAX_URL or _has_control(url) or any(c.isspace() for c in url):
        return "is not a URL (spaces, control characters, or too long)"
    try:
        parts = urllib.parse.urlsplit(url)
        parts.port  # noqa: B018 -- raises ValueError for a port that is not a number in range
    except ValueError as e:
        return f"is malformed ({e})"
    if parts.scheme not in ("http", "https"):
        return "must start with http:// or https://"
    if not parts.hostname:
        return "has no host"
    if parts.username is not None or parts.password is not None:
        return "must not carry credentials (user:password@); name the key's variable in api_key_env"
    if parts.query or parts.fragment:
        return "must have no query or fragment (like https://api.openai.com/v1)"
    return None


def _has_control(text: str) -> bool:
    return any(ord(c) < 0x20 or ord(c) == 0x7F for c in text)


def check_model_configs(path: str, flags: ModelFlags | None = None,
                        env: Mapping[str, str] | None = None) -> list[tuple[str, ModelConfig | ModelConfigError]]:
    """Every configured model by name, or the reason it cannot be used, in order (``sessionloop
    doctor`` reports them all). Raises ModelConfigError for a document that cannot be read."""
    environ = os.environ if env is None else env
    out: list[tuple[str, ModelConfig | ModelConfigError]] = []
    for name, (table, source) in model_tables(read_document(path), flags, path).items():
        try:
            out.append((name, parse_model(name, table, environ, source)))
        except ModelConfigError as e:
            out.append((name, e))
    return out


def load_model_configs(path: str, flags: ModelFlags | None = None,
                       env: Mapping[str, str] | None = None) -> list[ModelConfig]:
    """The models of ``path`` (``[models.NAME]``) and ``flags``, validated; [] when none is
    configured. Raises ModelConfigError naming the first model that cannot be used."""
    configs: list[ModelConfig] = []
    for _, found in check_model_configs(path, flags, env):
        if isinstance(found, ModelConfigError):
            raise found
        configs.append(found)
    return configs


# --- providers ----------------------------------------------------------------------------------------


def build_provider(cfg: ModelConfig, env: Mapping[str, str] | None = None) -> Provider:
    """The provider of one configured model (the key read from the environment now)."""
    if cfg.provider == "mock":
        clock = cfg.clock or MockClock()
        return MockProvider(model=cfg.model, latency_ms=clock.latency_ms, latency_jitter=clock.latency_jitter,
                            latency_sigma=clock.latency_sigma, stream_tokens_per_s=clock.stream_tokens_per_s,
                            seed=clock.seed)
    if cfg.provider == "openai":
        environ = os.environ if env is None else env
        key = environ.get(cfg.api_key_env, "") if cfg.api_key_env else ""
        return openai_provider(base_url=cfg.base_url or DEFAULT_BASE_URL, model=cfg.model, api_key=key,
                               vision=cfg.vision, limits=cfg.limits, label=cfg.name)
    raise ModelConfigError(f"{cfg.source} [models.{cfg.name}]: unknown provider {cfg.provider!r}")


def builtin_model(provider_name: str, options: Mapping[str, Any]) -> tuple[ModelConfig, Provider]:
    """The host's built-in model (nothing configured): ``make_provider(name, **options)`` under the
    provider's name. Raises ModelError for an unknown provider or bad options."""
    provider = make_provider(provider_name, **options)
    if provider_name == "openai" and not getattr(provider, "api_key", None) and \
            getattr(provider, "base_url", None) == DEFAULT_BASE_URL:
        # the OpenAI API answers every call without a key 401: refuse now, not every turn later
        raise ModelError(f"openai: no API key for {DEFAULT_BASE_URL}: set OPENAI_API_KEY (or OPENAI_BASE_URL "
                         "for a server that needs no key), or configure [models.NAME] with api_key_env "
                         "in config.toml")
    model = getattr(provider, "model", None) or provider_name
    return ModelConfig(name=provider_name, provider=provider_name, model=str(model), builtin=True,
                       source="built in"), provider


class Resolved(msgspec.Struct, frozen=True):
    """What a model reference stands for: the configured model and the model id to ask for."""

    config: ModelConfig
    model_id: str

    @property
    def entry_id(self) -> str:
        return f"{self.config.name}/{self.model_id}"


class _Snapshot:
    """An immutable view of the registry: readers take one and need no lock."""

    __slots__ = ("configs", "default", "providers")

    def __init__(self, configs: dict[str, ModelConfig], providers: dict[str, Provider]) -> None:
        self.configs = configs
        self.providers = providers
        self.default = configs[DEFAULT_NAME] if DEFAULT_NAME in configs else next(iter(configs.values()))


class ModelRegistry:
    """The models sessions may use and their providers (made once, at load or reload).

    Thread-safe: every read takes the current snapshot; :meth:`replace` swaps it whole."""

    def __init__(self, configs: Sequence[ModelConfig], providers: Mapping[str, Provider] | None = None,
                 build: Callable[[ModelConfig], Provider] = build_provider) -> None:
        if not configs:
            raise ValueError("a model registry needs at least one model")
        self._build = build
        self._snap = self._snapshot(configs, dict(providers or {}), None)

    @classmethod
    def for_host(cls, models: Sequence[ModelConfig], provider_name: str,
                 provider_options: Mapping[str, Any]) -> ModelRegistry:
        """The configured ``models``, else the built-in model of the host's options."""
        if models:
            return cls(models)
        cfg, provider = builtin_model(provider_name, provider_options)
        return cls([cfg], {cfg.name: provider})

    def _snapshot(self, configs: Sequence[ModelConfig], ready: dict[str, Provider],
                  old: _Snapshot | None) -> _Snapshot:
        by_name: dict[str, ModelConfig] = {}
        for cfg in configs:
            if cfg.name in by_name:
                raise ModelConfigError(f"model {cfg.name} is configured twice")
            by_name[cfg.name] = cfg
        providers: dict[str, Provider] = {}
        for name, cfg in by_name.items():
            if name in ready:
                providers[name] = ready[name]
            elif old is not None and old.configs.get(name) == cfg:
                providers[name] = old.providers[name]  # unchanged: keep its connections
            else:
                try:
                    providers[name] = self._build(cfg)
                except ModelError as e:
                    raise ModelConfigError(f"{cfg.source} [models.{name}]: {e}") from e
        return _Snapshot(by_name, providers)

    def replace(self, configs: Sequence[ModelConfig], providers: Mapping[str, Provider] | None = None) -> None:
        """Use ``configs`` from now on (a reload; ``providers``: ones already made); a model whose
        configuration did not change keeps its provider. Raises ModelConfigError and keeps the
        old models if one fails."""
        if not configs:
            raise ModelConfigError("a reload needs at least one model")
        self._snap = self._snapshot(configs, dict(providers or {}), self._snap)

    # --- reading ----------------------------------------------------------------------------

    @property
    def default(self) -> ModelConfig:
        return self._snap.default

    def configs(self) -> list[ModelConfig]:
        return list(self._snap.configs.values())

    def providers(self) -> list[Provider]:
        """Every model's provider (``/metrics`` reads their call counters)."""
        return list(self._snap.providers.values())

    def single(self) -> Provider | None:
        """The provider when there is only one model (every reference resolves to it)."""
        snap = self._snap
        return snap.providers[snap.default.name] if len(snap.providers) == 1 else None

    def resolve(self, ref: str | None) -> Resolved:
        """What ``ref`` (``name``, ``name/model id``, a bare model id, or None) stands for; an
        unknown reference is the default model (values that are not usable are refused earlier,
        by :meth:`check`; created sessions of earlier releases carry bare model ids)."""
        return _resolve(self._snap, ref)

    def provider(self, ref: str | None) -> Provider:
        """The provider of the model ``ref`` stands for."""
        snap = self._snap
        return snap.providers[_resolve(snap, ref).config.name]

    def check(self, ref: Any) -> str | None:
        """Why ``ref`` is not a configured model (a sentence listing the configured ones), or None."""
        snap = self._snap
        if not isinstance(ref, str) or not ref.strip():
            return "expected a model id"
        if ref in snap.configs:
            return None
        name, slash, model_id = ref.partition("/")
        cfg = snap.configs.get(name) if slash else None
        if cfg is not None and model_id and (cfg.any_model_id or model_id == cfg.model):
            return None
        known = ", ".join(c.entry_id for c in snap.configs.values())
        if cfg is not None:
            return f"model {name} serves {cfg.model}, not {model_id!r} (configured: {known})"
        return f"no configured model {ref!r} (configured: {known})"

    def options(self) -> list[dict[str, Any]]:
        """The option list of the ``llm`` source (``GET /api/models/llm``): one entry per model in
        configuration order, the default marked; base URLs and keys are not in it."""
        snap = self._snap
        return [{"id": cfg.entry_id, "name": cfg.name, "label": _label(cfg), "provider": cfg.provider,
                 "model": cfg.model, "vision": cfg.vision, "default": cfg is snap.default}
                for cfg in snap.configs.values()]

    def describe(self) -> list[str]:
        """The startup log lines: one per model, then which is the default. Never a key."""
        snap = self._snap
        lines = [cfg.describe() for cfg in snap.configs.values()]
        lines.append(f"default model: {snap.default.entry_id}")
        return lines


def _resolve(snap: _Snapshot, ref: str | None) -> Resolved:
    default = snap.default
    if not ref:
        return Resolved(default, default.model)
    cfg = snap.configs.get(ref)
    if cfg is not None:
        return Resolved(cfg, cfg.model)
    name, slash, model_id = ref.partition("/")
    if slash:
        cfg = snap.configs.get(name)
        if cfg is None:
            return Resolved(default, default.model)
        return Resolved(cfg, model_id if cfg.any_model_id and model_id else cfg.model)
    for cfg in snap.configs.values():
        if cfg.model == ref:
            return Resolved(cfg, cfg.model)
    return Resolved(default, ref if default.any_model_id else default.model)


def _label(cfg: ModelConfig) -> str:
    return cfg.name if cfg.name == cfg.model else f"{cfg.name} ({cfg.model})"

# --- the factory --------------------------------------------------------------------------------


def make_provider(name: str, **options: Any) -> Provider:
    """Build the provider called ``name`` with its keyword ``options``.

    ``mock`` takes ``latency_ms``, ``latency_jitter``, ``latency_sigma``, ``stream_tokens_per_s``,
    ``seed`` (its clock: ``actors/model/mock.py``) and ``model``; ``scripted`` takes ``responses``; ``replay`` takes
    ``recorded`` (``LlmCompleted`` events); ``openai`` takes ``model``, ``base_url``,
    ``api_key``, ``timeout``, ``limits`` (:class:`~actors.model.limits.ModelLimits`), ``retry``
    (:class:`~actors.model.limits.RetryPolicy`) and ``vision``. Raises ModelError for an unknown
    name or bad options, so a misspelt ``--provider`` becomes one clear line.
    """
    factories: dict[str, Callable[..., Provider]] = {
        "mock": MockProvider, "scripted": ScriptedProvider, "replay": ReplayProvider, "openai": OpenAIProvider}
    factory = factories.get(name)
    if factory is None:
        raise ModelError(
            f"unknown model provider {name!r}; known: {', '.join(PROVIDER_NAMES)}", provider=name
        )
    try:
        return factory(**options)
    except TypeError as e:
        raise ModelError(f"bad options for model provider {name!r}: {e}", provider=name) from e




__all__ = [
    "CONFIG_PROVIDERS", "DEFAULT_NAME", "ModelConfig", "ModelConfigError", "ModelFlags", "ModelLimits",
    "ModelRegistry", "Resolved", "build_provider", "builtin_model", "check_model_configs", "load_model_configs",
    "parse_model", "read_document", "url_problem",
]
