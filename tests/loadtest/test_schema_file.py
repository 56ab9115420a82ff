"""docs/bench-results.schema.json is what results.py's Structs say today, and a results file made
from real histograms validates against it (while one with a field missing or mistyped does not)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import jsonschema
import msgspec
import pytest

from sessionloop.cli.loadtest.results import SCHEMA_ID, Result, dump, json_schema, load
from sessionloop.cli.loadtest.schema_file import COMMAND, schema_text
from tests.conftest import REPO
from tests.loadtest.results_factory import steady_run

SCHEMA_FILE = os.path.join(REPO, "docs", "bench-results.schema.json")


def _checked_in() -> dict:
    with open(SCHEMA_FILE, encoding="utf-8") as f:
        return json.load(f)


def test_the_checked_in_schema_is_up_to_date() -> None:
    with open(SCHEMA_FILE, encoding="utf-8") as f:
        assert f.read() == schema_text(), f"docs/bench-results.schema.json is stale: run {COMMAND}"


def test_the_module_writes_the_schema_file(tmp_path) -> None:
    out = tmp_path / "schema.json"
    done = subprocess.run([sys.executable, "-m", "sessionloop.cli.loadtest.schema_file", str(out)], cwd=REPO,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert out.read_text() == schema_text()
    assert json.loads(out.read_text()) == json_schema()
    usage = subprocess.run([sys.executable, "-m", "sessionloop.cli.loadtest.schema_file"], cwd=REPO,
                           capture_output=True, text=True, timeout=60)
    assert usage.returncode == 2 and f"usage: {COMMAND}" in usage.stderr


def test_the_schema_is_a_valid_draft_2020_12_schema_whose_references_resolve() -> None:
    doc = _checked_in()
    jsonschema.Draft202012Validator.check_schema(doc)
    assert doc["$ref"] == "#/$defs/Result"
    text = json.dumps(doc)
    refs = {part.split('"')[0] for part in text.split('"$ref": "#/$defs/')[1:]}
    assert refs == set(doc["$defs"]) and "Latency" in refs  # every definition is used, and each used is defined


def test_a_result_from_real_histograms_validates_against_the_schema(tmp_path) -> None:
    path = str(tmp_path / "run.json")
    result = steady_run(1, missing=1)
    dump(result, path)
    with open(path, encoding="utf-8") as f:
        written = json.load(f)
    jsonschema.Draft202012Validator(_checked_in()).validate(written)
    assert written["schema"] == SCHEMA_ID and written["overall"]["latency"]["hdr"].startswith("HISTF")
    assert load(path) == result


@pytest.mark.parametrize(("change", "words"), [
    (lambda d: d.pop("audit"), "'audit' is a required property"),
    (lambda d: d["overall"]["latency"].update(p99_ms="slow"), "'slow' is not of type 'number'"),
    (lambda d: d["timeline"][0].update(extra=1), "Additional properties are not allowed"),
    (lambda d: d["phases"][0].update(kind="plateau"), "'plateau' is not one of"),
])
def test_a_results_file_with_a_field_missing_or_mistyped_does_not_validate(change, words: str) -> None:
    written = json.loads(msgspec.json.encode(steady_run(1)))
    change(written)
    with pytest.raises(jsonschema.ValidationError, match=words):
        jsonschema.Draft202012Validator(_checked_in()).validate(written)
    with pytest.raises(msgspec.ValidationError):
        msgspec.json.decode(json.dumps(written), type=Result)
