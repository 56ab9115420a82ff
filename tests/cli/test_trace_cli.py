"""``sessionloop trace`` and ``serve --otlp-endpoint``: errors are one line; without the otel extra
both refuse naming it (a fresh interpreter in which the opentelemetry packages cannot be imported)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from click.testing import CliRunner

from sessionloop.actors.api.host import Host
from sessionloop.cli.main import main
from tests.conftest import REPO

#: ``python -c`` a CLI whose interpreter cannot import opentelemetry (as without the extra)
WITHOUT_OTEL = "import sys; sys.modules['opentelemetry'] = None; from sessionloop.cli.main import main; main()"


def stored_session(data_dir: str, text: str = "hello") -> str:
    with Host.open(data_dir, durability="nosync") as host:
        session = host.create()
        assert session.run(text).state == "completed"
        return session.id


def cli_without_otel(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", WITHOUT_OTEL, *args], cwd=REPO, capture_output=True, text=True,
                          timeout=60, env=env, check=False)


def test_trace_of_an_unknown_session_exits_non_zero_with_one_line(tmp_path):
    data = str(tmp_path / "data")
    stored_session(data)
    result = CliRunner().invoke(main, ["trace", "nosuchsession", "--data", data])
    assert result.exit_code == 1
    assert result.output.strip().splitlines() == [f"Error: session nosuchsession not found in {data}"]


def test_trace_prints_one_line_of_otlp_json_with_the_sessions_spans(tmp_path):
    data = str(tmp_path / "data")
    session_id = stored_session(data)
    result = CliRunner().invoke(main, ["trace", f"session-{session_id}", "--data", data])
    assert result.exit_code == 0, result.output
    assert len(result.output.splitlines()) == 1
    spans = [s for rs in json.loads(result.output)["resourceSpans"] for ss in rs["scopeSpans"] for s in ss["spans"]]
    assert sorted(s["name"] for s in spans) == ["chat mock", "invoke_agent"]
    assert all(len(s["traceId"]) == 32 and len(s["spanId"]) == 16 for s in spans)


def test_trace_to_a_file_in_a_missing_folder_exits_with_one_line(tmp_path):
    data = str(tmp_path / "data")
    session_id = stored_session(data)
    target = str(tmp_path / "nope" / "trace.json")
    result = CliRunner().invoke(main, ["trace", session_id, "--data", data, "-o", target])
    assert result.exit_code == 1
    assert result.output.strip().splitlines() == [f"Error: cannot write {target}: No such file or directory"]


def test_trace_without_the_otel_extra_refuses_in_one_line_naming_the_extra(tmp_path):
    data = str(tmp_path / "data")
    session_id = stored_session(data)
    done = cli_without_otel("trace", session_id, "--data", data)
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr.strip().splitlines() == [
        "Error: tracing needs the otel extra: pip install 'sessionloop[otel]'"]


@pytest.mark.parametrize("how", ["option", "environment"])
def test_serve_with_an_otlp_endpoint_without_the_otel_extra_refuses_in_one_line(tmp_path, how):
    data = str(tmp_path / "data")
    args = ["serve", "--data", data, "--port", "0", "--durability", "nosync"]
    env = None
    if how == "option":
        args += ["--otlp-endpoint", "http://127.0.0.1:4318"]
    else:
        env = {**os.environ, "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}
    done = cli_without_otel(*args, env=env)
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr.strip().splitlines() == [
        "Error: tracing needs the otel extra: pip install 'sessionloop[otel]'"]


def test_serve_refuses_an_otlp_endpoint_that_is_not_an_http_url(tmp_path):
    result = CliRunner().invoke(main, ["serve", "--data", str(tmp_path / "data"), "--port", "0",
                                       "--otlp-endpoint", "collector:4318"])
    assert result.exit_code == 1
    assert result.output.strip().splitlines() == [
        "Error: --otlp-endpoint: expected an http:// or https:// URL, got 'collector:4318'"]
