"""Seed 004 可选项 with a field that declares ``dependsOn``: a server started in this process (the
real transport on 127.0.0.1, the real service) with an option source contributed the way a
plugin would (``SettingsService.declare``/``declare_options``): its rows carry
``dynamicOptions``/``dependsOn``, and ``GET /api/models/<source>?dependency=…`` hands the
dependency to the source."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest
from websockets.asyncio.client import connect

from sessionloop.actors.settings.fields import SettingField
from sessionloop.cli.serve import Server
from tests.e2e.conftest import TOKEN, initialized

pytestmark = pytest.mark.e2e

#: reasoning levels by model: what an ``llm-thinking`` style source answers for the model chosen
LEVELS = {"mock/mock": ["off"], "mock/mock-large": ["off", "low", "high"]}


def test_a_field_that_depends_on_the_model_gets_options_for_the_dependency_it_sends(tmp_path):
    asked: list[Any] = []

    def thinking(dependency: str | None) -> list[dict[str, Any]]:
        asked.append(dependency)
        return [{"id": level, "label": level} for level in LEVELS.get(dependency or "", [])]

    async def go() -> tuple[Any, ...]:
        server = Server(str(tmp_path / "data"), port=0, token=TOKEN, durability="nosync")
        try:
            port = await server.start()
            settings = server.host.settings
            settings.declare([SettingField("llm", "thinking", "string", "Thinking", dynamic_options="llm-thinking",
                                           depends_on="model", prominence="common", order=9)])
            settings.declare_options("llm-thinking", thinking)
            async with connect(f"ws://127.0.0.1:{port}/session",
                               additional_headers={"Authorization": f"Bearer {TOKEN}"}) as ws:
                c = await initialized(ws)
                sid = (await c.result("session/create", {}))["session"]["id"]
                rows = {(r["plugin"], r["key"]): r for r in (await c.result("session/config/get",
                                                                             {"sessionId": sid}))["items"]}
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}",
                                         headers={"Authorization": f"Bearer {TOKEN}"}) as http:
                # the client sends the model row's effective value, or its actual when unset
                dependency = rows[("llm", "model")]["actual"]["value"]
                small = await http.get("/api/models/llm-thinking", params={"dependency": dependency})
                large = await http.get("/api/models/llm-thinking", params={"dependency": "mock/mock-large"})
                bare = await http.get("/api/models/llm-thinking")
            return rows, small, large, bare
        finally:
            await server.stop()

    rows, small, large, bare = asyncio.run(go())
    field = rows[("llm", "thinking")]["field"]
    assert (field["dynamicOptions"], field["dependsOn"]) == ("llm-thinking", "model")
    assert small.json() == {"service": "llm-thinking", "options": [{"id": "off", "label": "off"}]}
    assert [o["id"] for o in large.json()["options"]] == ["off", "low", "high"]
    assert bare.status_code == 200 and bare.json()["options"] == []
    assert asked == ["mock/mock", "mock/mock-large", None]


def test_a_source_that_fails_is_answered_500_and_the_server_goes_on(tmp_path):
    def broken(dependency: str | None) -> list[dict[str, Any]]:
        raise RuntimeError("the plugin's source is broken")

    async def go() -> tuple[int, int]:
        server = Server(str(tmp_path / "data"), port=0, token=TOKEN, durability="nosync")
        try:
            port = await server.start()
            server.host.settings.declare_options("broken", broken)
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}",
                                         headers={"Authorization": f"Bearer {TOKEN}"}) as http:
                failed = await http.get("/api/models/broken")
                models = await http.get("/api/models/llm")
            return failed.status_code, models.status_code
        finally:
            await server.stop()

    assert asyncio.run(go()) == (500, 200)


def test_a_reload_puts_the_new_models_in_the_option_list_and_a_bad_file_keeps_the_old_ones(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    config = data / "config.toml"
    config.write_text('[models.default]\nprovider = "mock"\nmodel = "alpha"\n')

    async def go() -> tuple[Any, ...]:
        server = Server(str(data), port=0, token=TOKEN, durability="nosync")
        try:
            port = await server.start()
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}",
                                         headers={"Authorization": f"Bearer {TOKEN}"}) as http:
                before = (await http.get("/api/models/llm")).json()
                config.write_text('[models.default]\nprovider = "mock"\nmodel = "alpha"\n\n'
                                  '[models.other]\nprovider = "mock"\nmodel = "beta"\n')
                ok = server.reload_models()
                grown = (await http.get("/api/models/llm")).json()
                config.write_text('[models.default]\nprovider = "nope"\n')
                problem = server.reload_models()
                kept = (await http.get("/api/models/llm")).json()
            return before, ok, grown, problem, kept
        finally:
            await server.stop()

    before, ok, grown, problem, kept = asyncio.run(go())
    assert [o["id"] for o in before["options"]] == ["default/alpha"]
    assert ok == "models reloaded: default, other (default default/alpha)"
    assert [o["id"] for o in grown["options"]] == ["default/alpha", "other/beta"]
    assert problem.startswith("models refused: ") and "[models.default]: unknown provider 'nope'" in problem
    assert problem.endswith("the models read before stay in force")
    assert kept == grown
