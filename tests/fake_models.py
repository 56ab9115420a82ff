"""An OpenAI-compatible endpoint that serves a few model ids, on :class:`tests.fake_openai.
ThreadedFakeServer` (real HTTP/1.1, real chunked SSE, in a thread of the test process), for tests
whose client is a real ``sessionloop`` process (serve, doctor).

``POST /v1/chat/completions`` for a model id it serves: a request with tools and a named
``tool_choice`` gets that tool called with ``{"text": "ok"}``; any other request gets ``reply
from <model id>`` in three deltas; a usage chunk follows unless ``usage=False``. A model id it
does not serve gets 404 ``The model `X` does not exist``. ``requests`` are what it was asked
(path, lower-cased headers, body).
"""

from __future__ import annotations

import socket
from typing import Any, Self

from tests.fake_openai import Exchange, ThreadedFakeServer, chunk, usage_chunk


class FakeOpenAI:
    def __init__(self, models: tuple[str, ...] = ("model-a", "model-b"), *, usage: bool = True) -> None:
        self.models = set(models)
        self.usage = usage
        self.server = ThreadedFakeServer(self._answer)

    def __enter__(self) -> Self:
        self.server.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.__exit__(*exc)

    @property
    def base_url(self) -> str:
        return self.server.base_url

    @property
    def requests(self) -> list[dict[str, Any]]:
        return [{"path": e.path, "headers": e.headers, "body": e.body} for e in self.server.exchanges if e.method]

    async def _answer(self, exchange: Exchange) -> None:
        body = exchange.body if isinstance(exchange.body, dict) else {}
        model = body.get("model")
        if exchange.path != "/v1/chat/completions":
            await exchange.error(404, f"no route {exchange.path}")
            return
        if model not in self.models:
            await exchange.error(404, f"The model `{model}` does not exist")
            return
        await exchange.start_sse()
        for piece in self._chunks(body, str(model)):
            await exchange.event(piece)
        await exchange.event("[DONE]")
        await exchange.end()

    def _chunks(self, body: dict[str, Any], model: str) -> list[dict[str, Any]]:
        choice = body.get("tool_choice")
        if body.get("tools") and isinstance(choice, dict):
            name = choice["function"]["name"]
            out = [chunk(tool_calls=[{"index": 0, "id": "call_fake", "type": "function",
                                      "function": {"name": name, "arguments": ""}}])]
            out += [chunk(tool_calls=[{"index": 0, "function": {"arguments": piece}}])
                    for piece in ('{"text"', ': "ok"}')]
            out.append(chunk(finish="tool_calls"))
        else:
            out = [chunk(piece) for piece in ("reply ", "from ", model)]
            out.append(chunk(finish="stop"))
        if self.usage:
            out.append(usage_chunk(prompt_tokens=12, completion_tokens=3))
        for piece in out:
            piece["model"] = model
        return out


def closed_port() -> int:
    """A port on 127.0.0.1 nothing listens on (bound, then closed)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
