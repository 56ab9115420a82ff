"""``sessionloop schema``: the checked-in JSON Schema is what the server's types say today, and the
frames a real server sends validate against it."""

from __future__ import annotations

import asyncio
import json
import os

import jsonschema
import pytest
from click.testing import CliRunner
from websockets.asyncio.client import connect

from sessionloop.cli.main import main
from sessionloop.cli.schema_cmd import document, render
from sessionloop.protocol.handshake import SESSION_PROTOCOL_VERSION
from sessionloop.protocol.registry import METHODS, NOTIFICATIONS
from tests.conftest import REPO
from tests.e2e.conftest import APPS, ServerProcess

SCHEMA_FILE = os.path.join(REPO, "docs", "protocol.schema.json")


def test_the_checked_in_schema_is_up_to_date() -> None:
    with open(SCHEMA_FILE, encoding="utf-8") as f:
        stale = "docs/protocol.schema.json is stale: run sessionloop schema -o docs/protocol.schema.json"
        assert f.read() == render(), stale


def test_the_schema_names_every_method_and_notification_and_every_reference_resolves() -> None:
    doc = document()
    assert doc["protocolVersion"] == SESSION_PROTOCOL_VERSION
    assert set(doc["methods"]) == set(METHODS) and set(doc["notifications"]) == set(NOTIFICATIONS)
    refs = {ref.rsplit("/", 1)[1] for ref in _refs(doc)}
    assert refs and refs <= set(doc["$defs"])
    jsonschema.Draft202012Validator.check_schema(doc)


def _refs(value):
    if isinstance(value, dict):
        for key, item in value.items():
            if key == "$ref":
                yield item
            else:
                yield from _refs(item)
    elif isinstance(value, list):
        for item in value:
            yield from _refs(item)


def test_the_command_writes_the_schema_to_a_file_and_to_standard_output(tmp_path) -> None:
    out = tmp_path / "schema.json"
    written = CliRunner().invoke(main, ["schema", "-o", str(out)])
    printed = CliRunner().invoke(main, ["schema"])
    assert written.exit_code == 0 and printed.exit_code == 0, written.output + printed.output
    assert f"{len(METHODS)} methods" in written.output
    assert out.read_text() == printed.output == render()


def _validator(doc, ref):
    return jsonschema.Draft202012Validator({**ref, "$defs": doc["$defs"]})


@pytest.mark.e2e
def test_what_a_real_server_sends_validates_against_the_schema(tmp_path) -> None:
    doc = document()
    data = tmp_path / "data"
    os.makedirs(data)
    (data / "apps.toml").write_text(APPS)
    server = ServerProcess(str(data)).start()

    async def talk():
        frames = []
        async with connect(server.url, additional_headers={"Authorization": "Bearer bot-token-for-the-end-to-end-tests"}
                           ) as ws:
            async def call(i, method, params):
                request = {"jsonrpc": "2.0", "id": i, "method": method, "params": params}
                _validator(doc, doc["methods"][method]["params"]).validate(params)
                await ws.send(json.dumps(request))
                while True:
                    msg = json.loads(await asyncio.wait_for(ws.recv(), 10))
                    frames.append(msg)
                    if msg.get("id") == i:
                        return msg["result"]

            await call(1, "initialize", {"protocolVersion": SESSION_PROTOCOL_VERSION,
                                         "client": {"name": "schema-test", "version": "1"}})
            await call(2, "loop/watch", {})
            s = await call(3, "loop/create", {"containerId": "inbox", "title": "schema",
                                              "initialMessage": {"text": "hello", "idempotencyKey": "s-1"}})
            await call(4, "loop/waitForTurn", {"sessionId": s["sessionId"], "turnId": s["turnId"]})
            await call(5, "loop/send", {"sessionId": s["sessionId"], "text": "!tool list_files {}",
                                        "idempotencyKey": "s-2"})
            await call(6, "loop/listEvents", {"sessionId": s["sessionId"]})
            await call(7, "sessions/list", {})
        return frames

    try:
        frames = asyncio.run(talk())
    finally:
        server.stop()
    methods = {1: "initialize", 2: "loop/watch", 3: "loop/create", 4: "loop/waitForTurn", 5: "loop/send",
               6: "loop/listEvents", 7: "sessions/list"}
    results = [f for f in frames if "id" in f]
    pushes = [f for f in frames if "method" in f]
    assert len(results) == 7 and pushes
    for frame in results:
        _validator(doc, doc["methods"][methods[frame["id"]]]["result"]).validate(frame["result"])
    for frame in pushes:
        _validator(doc, doc["notifications"][frame["method"]]["params"]).validate(frame["params"])
