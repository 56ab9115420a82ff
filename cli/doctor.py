"""``sessionloop doctor``: one small real call per configured model, and what it showed.

For each model of ``DATA/config.toml`` (``[models.NAME]``) and the one-model flags, the doctor
sends one streaming chat-completions request with a tiny tool schema (``ping``, named in
``tool_choice``) and ``stream_options.include_usage``, and reports:

=================  ===========================================================================
reachable          an HTTP answer came back (not: refused, DNS, TLS, connect timeout)
model accepted     the endpoint took the model id (not: 404 or 400 naming the model)
streaming          the answer is Server-Sent Events (``text/event-stream``) that end properly
tool calls         the answer called ``ping`` with JSON arguments
usage              a usage chunk (prompt and completion tokens) came with the stream
=================  ===========================================================================

A model whose configuration cannot be used (unset key variable, unknown provider, malformed
URL) is reported with that reason and not called. The exit status is 1 when any model fails a
check. The request is made here with ``httpx``, from the same configuration the server uses
(base URL, model id, the key from ``api_key_env``), so what it finds is the endpoint's behaviour,
whatever the provider's retries would hide. The key is sent only to the model's own base URL and
is never printed.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Iterable
from typing import Any

import click
import httpx
import msgspec

from sessionloop.actors.events import Message
from sessionloop.actors.model.base import ModelRequest, error_message, ignore_delta
from sessionloop.actors.model.mock import MockProvider
from sessionloop.actors.model.registry import ModelConfig, ModelConfigError, check_model_configs
from sessionloop.cli.model_flags import flags_from, model_flag_options
from sessionloop.cli.output import clean, echo_json, echo_table
from sessionloop.cli.serve import CONFIG_FILE, DEFAULT_DATA

CHECKS = ("reachable", "modelAccepted", "streaming", "toolCalls", "usage")
HEADERS = ("MODEL", "PROVIDER", "MODEL ID", "REACHABLE", "MODEL ACCEPTED", "STREAMING", "TOOL CALLS", "USAGE")
PING_FUNCTION: dict[str, Any] = {
    "name": "ping", "description": "Answer a health check.",
    "parameters": {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]},
}
PING_TOOL: dict[str, Any] = {"type": "function", "function": PING_FUNCTION}
PING_PROMPT = 'Health check: call the ping tool with {"text": "ok"}.'
MAX_BODY = 1024 * 1024  # bytes of an answer read at most: the doctor needs a few chunks


class Report(msgspec.Struct, kw_only=True):
    """What one model's call showed (None: not checked, because an earlier step failed)."""

    name: str
    provider: str = ""
    model: str = ""
    baseUrl: str | None = None
    ok: bool = False
    reachable: bool | None = None
    modelAccepted: bool | None = None
    streaming: bool | None = None
    toolCalls: bool | None = None
    usage: bool | None = None
    detail: str = ""
    ms: int = 0

    def finish(self) -> Report:
        self.ok = all(getattr(self, check) is True for check in CHECKS)
        return self


class _Stream:
    """The SSE lines of one answer, folded into what the checks need."""

    def __init__(self) -> None:
        self.chunks = 0
        self.done = self.finished = False
        self.calls: dict[int, list[str]] = {}
        self.names: dict[int, str] = {}
        self.usage: Any = None
        self.problem: str | None = None

    def feed(self, line: str) -> None:
        if not line.startswith("data:"):
            return
        payload = line[5:].strip()
        if payload == "[DONE]":
            self.done = True
            return
        try:
            chunk = msgspec.json.decode(payload)
        except msgspec.DecodeError:
            self.problem = f"a data line is not JSON: {payload[:120]!r}"
            return
        if not isinstance(chunk, dict):
            self.problem = "a data line is not a JSON object"
            return
        if "error" in chunk:
            self.problem = f"error in the stream: {error_message(chunk)}"
            return
        self.chunks += 1
        if isinstance(chunk.get("usage"), dict):
            self.usage = chunk["usage"]
        for choice in chunk.get("choices") or []:
            if isinstance(choice, dict):
                self._choice(choice)

    def _choice(self, choice: dict[str, Any]) -> None:
        if choice.get("finish_reason"):
            self.finished = True
        delta = _object(choice.get("delta"))
        for fragment in delta.get("tool_calls") or []:
            if not isinstance(fragment, dict):
                continue
            index = fragment.get("index", 0)
            index = index if isinstance(index, int) else 0
            function = _object(fragment.get("function"))
            if function.get("name"):
                self.names.setdefault(index, str(function["name"]))
            if function.get("arguments"):
                self.calls.setdefault(index, []).append(str(function["arguments"]))

    def pinged(self) -> bool:
        for index, name in self.names.items():
            if name == "ping" and _is_json_object("".join(self.calls.get(index, [])) or "{}"):
                return True
        return False


def _object(value: Any) -> dict[str, Any]:
    """``value`` if it is a JSON object, else an empty one (a chunk may leave a part out)."""
    return value if isinstance(value, dict) else {}


def _is_json_object(text: str) -> bool:
    try:
        return isinstance(msgspec.json.decode(text), dict)
    except msgspec.DecodeError:
        return False


def _usage_reported(usage: Any) -> bool:
    return isinstance(usage, dict) and isinstance(usage.get("prompt_tokens"), int) \
        and isinstance(usage.get("completion_tokens"), int)


# --- probes -------------------------------------------------------------------------------------


def probe(cfg: ModelConfig, timeout: float, env: Any = None) -> Report:
    """One real call to ``cfg``'s model and the report of what it showed."""
    started = time.monotonic()
    report = Report(name=cfg.name, provider=cfg.provider, model=cfg.model, baseUrl=cfg.base_url)
    if cfg.provider == "mock":
        _probe_mock(report, cfg)
    else:
        environ = os.environ if env is None else env
        key = environ.get(cfg.api_key_env, "") if cfg.api_key_env else ""
        _probe_openai(report, cfg, key, timeout)
    report.ms = int((time.monotonic() - started) * 1000)
    return report.finish()


def _probe_mock(report: Report, cfg: ModelConfig) -> None:
    request = ModelRequest(messages=[Message(role="user", content='!tool ping {"text": "ok"}')],
                           tools=[PING_FUNCTION], model=cfg.model)
    response = asyncio.run(MockProvider(model=cfg.model).generate(request, ignore_delta))
    report.reachable = report.modelAccepted = report.streaming = True
    report.toolCalls = any(c.name == "ping" for c in response.tool_calls)
    report.usage = response.usage.prompt_tokens > 0
    report.detail = "built in, answered in this process"


def _probe_openai(report: Report, cfg: ModelConfig, key: str, timeout: float) -> None:
    url = f"{(cfg.base_url or '').rstrip('/')}/chat/completions"
    body = {"model": cfg.model, "messages": [{"role": "user", "content": PING_PROMPT}], "tools": [PING_TOOL],
            "tool_choice": {"type": "function", "function": {"name": "ping"}}, "stream": True,
            "stream_options": {"include_usage": True}}
    headers = {"Accept": "text/event-stream"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    try:
        with httpx.Client(timeout=httpx.Timeout(timeout, connect=min(timeout, 10.0))) as client, \
                client.stream("POST", url, json=body, headers=headers) as reply:
            report.reachable = True
            if reply.status_code >= 400:
                _refused(report, reply.status_code, url, _read_some(reply))
                return
            report.modelAccepted = True
            _answer(report, reply)
    except httpx.ConnectError as e:
        report.reachable = False
        report.detail = f"cannot connect to {url}: {e}"
    except httpx.TimeoutException as e:
        if report.reachable:
            report.streaming = False
            report.detail = f"the answer stopped for more than {timeout:g} s ({type(e).__name__})"
        else:
            report.reachable = False
            report.detail = f"no answer from {url} within {timeout:g} s ({type(e).__name__})"
    except httpx.HTTPError as e:
        if report.reachable:
            report.streaming = False
            report.detail = f"the answer broke off: {type(e).__name__}: {e}"
        else:
            report.reachable = False
            report.detail = f"cannot reach {url}: {type(e).__name__}: {e}"


def _read_some(reply: httpx.Response) -> bytes:
    data = bytearray()
    for piece in reply.iter_bytes():
        data += piece
        if len(data) >= MAX_BODY:
            break
    return bytes(data[:MAX_BODY])


def _refused(report: Report, status: int, url: str, body: bytes) -> None:
    try:
        message = error_message(msgspec.json.decode(body))
    except msgspec.DecodeError:
        message = body.decode("utf-8", "replace").strip()[:300] or "(empty body)"
    if status in (400, 404, 422) and "model" in message.lower():
        report.modelAccepted = False
        report.detail = f"the endpoint does not take model id {report.model!r}: HTTP {status}: {message}"
    elif status == 404:
        report.detail = (f"HTTP 404 from {url}: {message} (no chat-completions endpoint there: is the base URL "
                         "right? it usually ends in /v1)")
    elif status in (401, 403):
        report.detail = f"the key was refused: HTTP {status}: {message}"
    else:
        report.detail = f"HTTP {status} from {url}: {message}"


def _answer(report: Report, reply: httpx.Response) -> None:
    kind = reply.headers.get("content-type", "")
    if "text/event-stream" not in kind:
        report.streaming = False
        _non_streamed(report, _read_some(reply), kind)
        return
    stream = _Stream()
    size = 0
    for line in reply.iter_lines():
        size += len(line)
        stream.feed(line)
        if stream.done or stream.problem or size > MAX_BODY:
            break
    problems = []
    report.streaming = stream.problem is None and stream.chunks > 0 and (stream.done or stream.finished)
    if stream.problem:
        problems.append(stream.problem)
    elif not report.streaming:
        problems.append("the stream ended before [DONE]" if stream.chunks else "the stream had no chunks")
    report.toolCalls = stream.pinged()
    if not report.toolCalls:
        problems.append("the model did not call the ping tool (tool calls may be unsupported by this model or "
                        "server)")
    report.usage = _usage_reported(stream.usage)
    if not report.usage:
        problems.append("no usage in the stream (stream_options.include_usage): token counts will be missing")
    report.detail = "; ".join(problems)


def _non_streamed(report: Report, body: bytes, kind: str) -> None:
    """A server that ignored ``stream: true``: the rest is judged from its one JSON answer."""
    problems = [f"the answer is not streamed (Content-Type {kind or 'missing'})"]
    try:
        data = msgspec.json.decode(body)
    except msgspec.DecodeError:
        data = None
    choices = data.get("choices") if isinstance(data, dict) else None
    message = choices[0].get("message") if isinstance(choices, list) and choices and isinstance(choices[0], dict) \
        else None
    calls = message.get("tool_calls") if isinstance(message, dict) else None
    report.toolCalls = isinstance(calls, list) and any(
        isinstance(c, dict) and isinstance(c.get("function"), dict) and c["function"].get("name") == "ping"
        for c in calls)
    report.usage = _usage_reported(data.get("usage") if isinstance(data, dict) else None)
    if not report.toolCalls:
        problems.append("the model did not call the ping tool")
    if not report.usage:
        problems.append("no usage reported")
    report.detail = "; ".join(problems)


# --- the command ----------------------------------------------------------------------------------


def _mark(value: bool | None) -> str:
    return "-" if value is None else ("yes" if value else "NO")


def _config_failure(name: str, error: ModelConfigError) -> Report:
    return Report(name=name, detail=f"not called: {error}").finish()


def run_doctor(config_path: str, flags: Any, only: str | None, timeout: float) -> tuple[list[Report], str | None]:
    """The reports of every model (or ``only``) and a note when none is configured."""
    found = check_model_configs(config_path, flags)
    if only is not None:
        names = [name for name, _ in found]
        found = [(name, cfg) for name, cfg in found if name == only]
        if not found:
            listed = ", ".join(names) if names else "none"
            raise click.ClickException(f"--model {only}: no such model in {config_path} (configured: {listed})")
    note = None
    if not found:
        note = f"no models configured in {config_path}: sessions use the built-in mock model"
        found = [("mock", ModelConfig(name="mock", provider="mock", model="mock", builtin=True, source="built in"))]
    reports = [probe(cfg, timeout) if isinstance(cfg, ModelConfig) else _config_failure(name, cfg)
               for name, cfg in found]
    return reports, note


def _print_table(reports: Iterable[Report]) -> None:
    reports = list(reports)
    echo_table(HEADERS, [[clean(r.name), clean(r.provider), clean(r.model), *(_mark(getattr(r, c)) for c in CHECKS)]
                         for r in reports])
    for r in reports:
        if r.detail:
            click.echo(f"{clean(r.name)}: {'ok' if r.ok else 'FAILED'}: {clean(r.detail)}")


@click.command("doctor")
@click.option("--data", "data_dir", default=DEFAULT_DATA, show_default=True,
              help="Data directory whose config.toml lists the models ([models.NAME]).")
@click.option("--model", "only", default=None, metavar="NAME", help="Check this configured model only.")
@model_flag_options
@click.option("--timeout", default=30.0, show_default=True, type=click.FloatRange(min=0.1),
              help="Seconds to wait for the connection and for each part of the answer.")
@click.option("--json", "as_json", is_flag=True, help="Print the reports as JSON.")
def doctor(data_dir: str, only: str | None, model_provider: str | None, base_url: str | None,
           model_name: str | None, api_key_env: str | None, timeout: float, as_json: bool) -> None:
    """Make one small real call per configured model and report: reachable, model id accepted,
    streaming, tool calls, usage reported. Exits 1 when a model fails a check.

    \b
    Example:
      sessionloop doctor --data ./.sessionloop
      sessionloop doctor --model fast --json
    """
    config_path = os.path.join(os.path.abspath(data_dir), CONFIG_FILE)
    flags = flags_from(model_provider, base_url, model_name, api_key_env)
    try:
        reports, note = run_doctor(config_path, flags, only, timeout)
    except ModelConfigError as e:
        raise click.ClickException(str(e)) from e
    if as_json:
        echo_json({"ok": all(r.ok for r in reports), "note": note, "models": [msgspec.to_builtins(r) for r in reports]})
    else:
        if note:
            click.echo(note)
        _print_table(reports)
    if not all(r.ok for r in reports):
        raise SystemExit(1)
