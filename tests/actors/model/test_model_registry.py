"""Named models (actors.model.registry): config.toml ``[models.NAME]`` and the one-model flags,
validated at load with one line naming the model; which provider a session's ``llm/model``
setting picks; the option list of the model field; reloads."""

from __future__ import annotations

import os
import tomllib
from typing import Any

import pytest

from sessionloop.actors import events as E
from sessionloop.actors.model import MockProvider, OpenAIProvider
from sessionloop.actors.model.registry import (
    ModelConfig,
    ModelConfigError,
    ModelFlags,
    ModelRegistry,
    load_model_configs,
)
from tests.actors.gateway_harness import MemoryClient

ENV = {"FAST_KEY": "sk-fast-secret-value"}


def write(tmp_path: Any, text: str) -> str:
    path = os.path.join(str(tmp_path), "config.toml")
    with open(path, "w") as f:
        f.write(text)
    return path


def load(
    tmp_path: Any, text: str, flags: ModelFlags | None = None, env: dict[str, str] | None = None
) -> list[ModelConfig]:
    return load_model_configs(write(tmp_path, text), flags, ENV if env is None else env)


def refusal(tmp_path: Any, text: str, **kw: Any) -> str:
    with pytest.raises(ModelConfigError) as e:
        load(tmp_path, text, **kw)
    message = str(e.value)
    assert "\n" not in message
    return message


TWO = """
name = "my server"

[models.default]
provider = "openai"
base_url = "http://127.0.0.1:9/v1/"
model = "model-a"

[models.fast]
provider = "openai"
base_url = "https://llm.example/v1"
model = "model-b"
api_key_env = "FAST_KEY"
vision = true
max_concurrency = 4
rpm = 60
tpm = 100000

[plugins.llm]
model = "fast"
"""


# --- loading ---------------------------------------------------------------------------------------


def test_models_are_read_by_name_in_file_order_with_their_limits_and_no_key(tmp_path):
    default, fast = load(tmp_path, TWO)
    assert (default.name, default.provider, default.model, default.base_url, default.api_key_env) == (
        "default", "openai", "model-a", "http://127.0.0.1:9/v1", None)
    assert (fast.name, fast.model, fast.api_key_env, fast.vision) == ("fast", "model-b", "FAST_KEY", True)
    assert (fast.limits.max_concurrency, fast.limits.rpm, fast.limits.tpm) == (4, 60, 100000)
    assert "sk-fast-secret-value" not in repr(fast)


def test_no_config_file_and_no_flags_is_no_configured_model(tmp_path):
    assert load_model_configs(str(tmp_path / "config.toml"), None, {}) == []


@pytest.mark.parametrize("table, names", [
    ('provider = "opneai"\nmodel = "m"', ["[models.bad]", "unknown provider 'opneai'", "openai, mock"]),
    ('provider = "openai"\nmodel = "m"\napi_key_env = "UNSET_KEY_VAR"',
     ["[models.bad]", "api_key_env UNSET_KEY_VAR is not set"]),
    ('provider = "openai"\nmodel = "m"\nbase_url = "htp://host/v1"', ["[models.bad]", "base_url 'htp://host/v1'",
                                                                      "http:// or https://"]),
    ('provider = "openai"\nmodel = "m"\nbase_url = "http:///v1"', ["[models.bad]", "has no host"]),
    ('provider = "openai"\nmodel = "m"\nbase_url = "http://host:99999/v1"', ["[models.bad]", "malformed"]),
    ('provider = "openai"\nmodel = "m"\nbase_url = "https://user:pw@host/v1"', ["must not carry credentials"]),
    ('provider = "openai"\nmodel = "m"\nbase_url = "https://host/v1 x"', ["not a URL"]),
    ('provider = "openai"\nmodel = "m"\napi_key = "sk-123"', ["[models.bad]", "api_key", "never written in the file",
                                                             "api_key_env"]),
    ('provider = "openai"\nmodel = "m"\napi_key_env = "sk-live-123"', ["api_key_env", "not the key"]),
    ('provider = "openai"\nmodel = "m"\ntemprature = 1', ["unknown key 'temprature'"]),
    ('provider = "openai"', ["[models.bad]", "model", "missing"]),
    ('provider = "openai"\nmodel = "m"\nrpm = 0', ["rpm", "whole number"]),
    ('provider = "mock"\nbase_url = "http://h/v1"', ["the mock provider", "base_url"]),
])
def test_a_model_that_cannot_be_used_is_refused_with_one_line_naming_it_and_the_problem(tmp_path, table, names):
    message = refusal(tmp_path, f"[models.ok]\nprovider = \"mock\"\n\n[models.bad]\n{table}\n")
    for name in names:
        assert name in message, message
    assert "sk-" not in message  # a key written by mistake is not echoed


def test_a_model_name_with_a_slash_is_refused(tmp_path):
    assert "no '/'" in refusal(tmp_path, '[models."a/b"]\nprovider = "mock"\n')


def test_a_config_file_that_is_not_toml_is_refused_naming_the_file(tmp_path):
    message = refusal(tmp_path, "[models.default\nprovider = 1\n")
    assert "config.toml: not valid TOML" in message


def test_the_flags_describe_the_default_model_over_its_table(tmp_path):
    flags = ModelFlags(model="model-z", api_key_env="FAST_KEY")
    default, fast = load(tmp_path, TWO, flags)
    assert (default.name, default.model, default.base_url, default.api_key_env) == (
        "default", "model-z", "http://127.0.0.1:9/v1", "FAST_KEY")
    assert "--model-* flags" in default.source and fast.model == "model-b"


def test_the_flags_alone_make_an_openai_model_named_default(tmp_path):
    [only] = load(tmp_path, "", ModelFlags(base_url="http://127.0.0.1:1/v1", model="m"))
    assert (only.name, only.provider, only.model, only.source) == ("default", "openai", "m", "--model-* flags")


def test_a_flag_with_an_unset_key_variable_is_refused_naming_the_flags(tmp_path):
    message = refusal(tmp_path, "", flags=ModelFlags(model="m", api_key_env="NOPE_KEY"))
    assert "--model-* flags" in message and "NOPE_KEY is not set" in message


# --- references --------------------------------------------------------------------------------------


def registry(tmp_path: Any, text: str = TWO) -> ModelRegistry:
    return ModelRegistry(load(tmp_path, text))


def test_a_reference_is_a_name_or_an_entry_id_and_an_unknown_one_is_the_default(tmp_path):
    r = registry(tmp_path)
    assert r.resolve(None).entry_id == "default/model-a"
    assert r.resolve("fast").entry_id == "fast/model-b"
    assert r.resolve("fast/model-b").entry_id == "fast/model-b"
    assert r.resolve("model-b").entry_id == "fast/model-b"  # a bare model id of earlier releases
    assert r.resolve("fast/model-x").entry_id == "fast/model-b"  # a configured endpoint serves its own id
    assert r.resolve("gone/model-q").entry_id == "default/model-a"


def test_the_model_field_accepts_configured_models_only_and_lists_them(tmp_path):
    r = registry(tmp_path)
    assert r.check("fast") is None and r.check("fast/model-b") is None
    assert r.check("fast/gpt-4o") == ("model fast serves model-b, not 'gpt-4o' (configured: default/model-a, "
                                      "fast/model-b)")
    assert r.check("mock/mock") == "no configured model 'mock/mock' (configured: default/model-a, fast/model-b)"


def test_the_built_in_mock_takes_any_model_id_so_stored_values_of_earlier_releases_keep_working():
    r = ModelRegistry.for_host([], "mock", {})
    assert r.check("mock/mock-large") is None
    assert r.resolve("mock/mock-large").model_id == "mock-large"
    assert r.resolve("mock-large").entry_id == "mock/mock-large"  # a created session's bare model id
    assert r.options() == [{"id": "mock/mock", "name": "mock", "label": "mock", "provider": "mock",
                            "model": "mock", "vision": False, "default": True}]


def test_the_option_list_has_every_model_the_default_marked_and_no_url_or_key(tmp_path):
    options = registry(tmp_path).options()
    assert [(o["id"], o["label"], o["default"], o["vision"]) for o in options] == [
        ("default/model-a", "default (model-a)", True, False), ("fast/model-b", "fast (model-b)", False, True)]
    assert "127.0.0.1" not in repr(options) and "FAST_KEY" not in repr(options)


def test_the_startup_description_names_providers_models_urls_and_key_variables_never_keys(tmp_path):
    lines = registry(tmp_path).describe()
    text = "\n".join(lines)
    assert "model fast: provider openai, model id model-b, base URL https://llm.example/v1, key from $FAST_KEY" in text
    assert "max_concurrency 4" in text and lines[-1] == "default model: default/model-a"
    assert "sk-fast-secret-value" not in text


def test_configured_openai_models_get_their_key_from_the_environment_variable(tmp_path, monkeypatch):
    monkeypatch.setenv("FAST_KEY", "sk-from-env")
    r = ModelRegistry(load_model_configs(write(tmp_path, TWO)))
    fast, default = r.provider("fast"), r.provider(None)
    assert isinstance(fast, OpenAIProvider) and (fast.base_url, fast.model, fast.api_key) == (
        "https://llm.example/v1", "model-b", "sk-from-env")
    assert isinstance(default, OpenAIProvider) and not default.api_key  # no api_key_env: no key is sent


def test_a_reload_keeps_the_providers_of_unchanged_models_and_refuses_a_bad_one(tmp_path):
    r = registry(tmp_path)
    fast = r.provider("fast")
    r.replace(load(tmp_path, TWO.replace('model = "model-a"', 'model = "model-c"')))
    assert r.provider("fast") is fast and r.resolve(None).model_id == "model-c"
    with pytest.raises(ModelConfigError):
        r.replace([])
    assert r.resolve(None).model_id == "model-c"


# --- sessions pick their model --------------------------------------------------------------------------


MOCKS = """
[models.default]
provider = "mock"
model = "alpha"

[models.other]
provider = "mock"
model = "beta"
"""


@pytest.fixture
def two_mocks(open_host, tmp_path):
    host = open_host(permission_mode="acceptCalls", models=load(tmp_path, MOCKS))
    svc = host.protocol()
    yield host, MemoryClient(svc)
    svc.close()


def model_of_last_call(host: Any, sid: str) -> str:
    return [r.event for r in host.session(sid).events() if isinstance(r.event, E.LlmCompleted)][-1].model


def test_a_session_runs_on_the_default_model_until_its_setting_names_another(two_mocks):
    host, c = two_mocks
    sid = c.result("session/create", {})["session"]["id"]
    assert host.session(sid).run("hi").output_text == "echo: hi"
    assert model_of_last_call(host, sid) == "alpha"
    reply = c.call("session/config/update", {"sessionId": sid, "plugin": "llm", "key": "model", "value": "other"})
    assert "result" in reply, reply
    host.session(sid).run("again")
    assert model_of_last_call(host, sid) == "beta"
    assert host.rt.provider_for(host.session(sid).snapshot()) is host.rt.models.provider("other")


def test_a_model_that_is_not_configured_is_refused_by_the_setting_naming_the_configured_ones(two_mocks):
    _, c = two_mocks
    sid = c.result("session/create", {})["session"]["id"]
    reply = c.call("session/config/update", {"sessionId": sid, "plugin": "llm", "key": "model", "value": "gpt-4o"})
    assert reply["error"]["code"] == -32602
    assert reply["error"]["message"] == ("params.value: llm/model: no configured model 'gpt-4o' (configured: "
                                         "default/alpha, other/beta)")


def test_the_model_row_carries_its_option_source_and_the_model_in_use_as_an_entry_id(two_mocks):
    _, c = two_mocks
    sid = c.result("session/create", {})["session"]["id"]
    row = next(r for r in c.result("session/config/get", {"sessionId": sid})["items"]
               if (r["plugin"], r["key"]) == ("llm", "model"))
    assert row["field"]["type"] == "llm-ref" and row["field"]["dynamicOptions"] == "llm"
    assert row["actual"] == {"value": "default/alpha", "label": "Follow the service preference (now: alpha)"}


def test_a_global_model_setting_in_config_toml_moves_every_session(open_host, data_dir):
    os.makedirs(data_dir)
    path = write(data_dir, MOCKS + '\n[plugins.llm]\nmodel = "other"\n')
    host = open_host(permission_mode="acceptCalls", models=load_model_configs(path, None, {}))
    svc = host.protocol()
    try:
        s = host.create()
        s.run("hi")
        assert model_of_last_call(host, s.id) == "beta"
    finally:
        svc.close()


def test_reloading_the_models_moves_sessions_at_their_next_call(two_mocks, tmp_path):
    host, _ = two_mocks
    s = host.create()
    s.run("hi")
    host.rt.reload_models(load(tmp_path, MOCKS.replace('"alpha"', '"gamma"')))
    s.run("again")
    assert model_of_last_call(host, s.id) == "gamma"
    host.rt.reload_models([])  # nothing configured any more: the built-in mock
    s.run("third")
    assert model_of_last_call(host, s.id) == "mock"
    assert isinstance(host.rt.models.provider(None), MockProvider)


def test_a_settings_write_to_config_toml_keeps_its_model_tables_and_other_keys(open_host, data_dir):
    os.makedirs(data_dir)
    path = write(data_dir, 'name = "my server"\n' + TWO.replace('name = "my server"\n', ""))
    before = load_model_configs(path, None, ENV)
    host = open_host(permission_mode="acceptCalls", models=before)
    svc = host.protocol()
    try:
        c = MemoryClient(svc)
        for key, value in (("maxSteps", 7), ("systemPrompt", "Be brief.")):
            reply = c.call("session/config/layer/update", {"layer": {"scope": "global"}, "plugin": "agent",
                                                           "key": key, "value": value})
            assert "unsaved" not in reply["result"], reply
        reply = c.call("session/config/layer/update", {"layer": {"scope": "global"}, "plugin": "llm",
                                                       "key": "model", "value": "default/model-a"})
        assert "unsaved" not in reply["result"], reply
    finally:
        svc.close()
    with open(path, "rb") as f:
        doc = tomllib.load(f)
    assert doc["name"] == "my server" and doc["plugins"]["agent"] == {"maxSteps": 7, "systemPrompt": "Be brief."}
    assert doc["plugins"]["llm"] == {"model": "default/model-a"}
    assert load_model_configs(path, None, ENV) == before  # the [models.*] tables came through the rewrite
