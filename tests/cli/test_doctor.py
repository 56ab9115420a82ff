"""``sessionloop doctor``: one small real call per configured model, against a fake
OpenAI-compatible endpoint on 127.0.0.1 (real HTTP, real SSE), run as the real command."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import pytest

from tests.fake_models import FakeOpenAI, closed_port

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SECRET = "sk-doctor-secret-0123456789"
CHECKS = ("reachable", "modelAccepted", "streaming", "toolCalls", "usage")


def doctor(data: str, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "sessionloop", "doctor", "--data", data, "--timeout", "10", *args],
                          capture_output=True, text=True, timeout=120, cwd=REPO, check=False,
                          env=dict(os.environ, DOCTOR_KEY=SECRET, **(env or {})))


def data_with(tmp_path: Any, config_toml: str) -> str:
    data = tmp_path / "data"
    os.makedirs(data, exist_ok=True)
    (data / "config.toml").write_text(config_toml)
    return str(data)


def model(name: str, base_url: str, model_id: str, key: bool = False) -> str:
    table = f'[models.{name}]\nprovider = "openai"\nbase_url = "{base_url}"\nmodel = "{model_id}"\n'
    return table + ('api_key_env = "DOCTOR_KEY"\n' if key else "") + "\n"


def reports(done: subprocess.CompletedProcess[str]) -> dict[str, dict[str, Any]]:
    return {r["name"]: r for r in json.loads(done.stdout)["models"]}


@pytest.fixture
def fake():
    with FakeOpenAI() as f:
        yield f


def test_a_working_model_passes_every_check_with_one_streaming_tool_call_that_asks_for_usage(tmp_path, fake):
    done = doctor(data_with(tmp_path, model("default", fake.base_url, "model-a", key=True)), "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    report = reports(done)["default"]
    assert report["ok"] is True and all(report[c] is True for c in CHECKS), report
    [request] = fake.requests
    body = request["body"]
    assert (body["model"], body["stream"], body["stream_options"]) == ("model-a", True, {"include_usage": True})
    assert [t["function"]["name"] for t in body["tools"]] == ["ping"]
    assert request["headers"]["authorization"] == f"Bearer {SECRET}"
    assert SECRET not in done.stdout + done.stderr


def test_an_unreachable_port_fails_reachable_and_exits_non_zero(tmp_path):
    port = closed_port()
    done = doctor(data_with(tmp_path, model("gone", f"http://127.0.0.1:{port}/v1", "m")), "--json")
    assert done.returncode == 1
    report = reports(done)["gone"]
    assert (report["ok"], report["reachable"], report["modelAccepted"]) == (False, False, None)
    assert f"cannot connect to http://127.0.0.1:{port}/v1/chat/completions" in report["detail"]


def test_a_model_id_the_endpoint_does_not_have_fails_model_accepted(tmp_path, fake):
    done = doctor(data_with(tmp_path, model("typo", fake.base_url, "model-zz")), "--json")
    assert done.returncode == 1
    report = reports(done)["typo"]
    assert (report["reachable"], report["modelAccepted"], report["streaming"]) == (True, False, None)
    assert "does not take model id 'model-zz': HTTP 404: The model `model-zz` does not exist" in report["detail"]


def test_an_endpoint_that_reports_no_usage_fails_the_usage_check_only(tmp_path):
    with FakeOpenAI(usage=False) as quiet:
        done = doctor(data_with(tmp_path, model("quiet", quiet.base_url, "model-a")), "--json")
    assert done.returncode == 1
    report = reports(done)["quiet"]
    assert [report[c] for c in CHECKS] == [True, True, True, True, False]
    assert "no usage in the stream" in report["detail"]


def test_the_table_has_a_row_per_model_and_a_line_for_each_failure_and_a_bad_config_is_not_called(tmp_path, fake):
    config = (model("default", fake.base_url, "model-a") + model("typo", fake.base_url, "model-zz")
              + '[models.nokey]\nprovider = "openai"\nmodel = "m"\napi_key_env = "UNSET_DOCTOR_KEY"\n\n'
              + '[models.local]\nprovider = "mock"\n')
    done = doctor(data_with(tmp_path, config))
    assert done.returncode == 1
    lines = done.stdout.splitlines()
    assert lines[0].split() == ["MODEL", "PROVIDER", "MODEL", "ID", "REACHABLE", "MODEL", "ACCEPTED", "STREAMING",
                                "TOOL", "CALLS", "USAGE"]
    assert lines[1].split() == ["default", "openai", "model-a", "yes", "yes", "yes", "yes", "yes"]
    assert lines[2].split() == ["typo", "openai", "model-zz", "yes", "NO", "-", "-", "-"]
    assert lines[4].split() == ["local", "mock", "mock", "yes", "yes", "yes", "yes", "yes"]
    assert any(line.startswith("nokey: FAILED: not called:") and "UNSET_DOCTOR_KEY is not set" in line
               for line in lines)
    assert [r["body"]["model"] for r in fake.requests] == ["model-a", "model-zz"]


def test_model_checks_one_model_and_an_unknown_name_is_one_line(tmp_path, fake):
    data = data_with(tmp_path, model("default", fake.base_url, "model-a") + model("fast", fake.base_url, "model-b"))
    done = doctor(data, "--model", "fast", "--json")
    assert done.returncode == 0 and list(reports(done)) == ["fast"]
    assert [r["body"]["model"] for r in fake.requests] == ["model-b"]
    unknown = doctor(data, "--model", "slow")
    assert unknown.returncode != 0 and unknown.stderr.strip().splitlines() == [
        f"Error: --model slow: no such model in {os.path.join(data, 'config.toml')} (configured: default, fast)"]


def test_the_one_model_flags_are_checked_without_a_config_file(tmp_path, fake):
    done = doctor(str(tmp_path / "data"), "--base-url", fake.base_url, "--model-name", "model-b", "--json")
    assert done.returncode == 0 and reports(done)["default"]["ok"] is True


def test_with_nothing_configured_the_built_in_mock_is_reported(tmp_path):
    done = doctor(str(tmp_path / "data"), "--json")
    out = json.loads(done.stdout)
    assert done.returncode == 0 and "no models configured" in out["note"]
    assert [m["name"] for m in out["models"]] == ["mock"] and out["models"][0]["ok"] is True
