"""Attachments reach the model (actors/model/attachments.py): images as content parts for a
vision model, text files inlined with their name, other files described; the context budget
counts them; a session's model call sends them, read from the blob store."""

from __future__ import annotations

import base64

import pytest

from sessionloop.actors import events as E
from sessionloop.actors.model import OpenAIProvider
from sessionloop.actors.model.attachments import IMAGE_CHARS, INLINE_CHARS, estimated_chars, resolve
from sessionloop.actors.model.base import ModelRequest
from sessionloop.actors.replay.timeline import build_timeline
from sessionloop.actors.session.context import message_chars
from tests.actors.approvals.test_approvals import turn_done
from tests.actors.gateway_harness import MemoryClient
from tests.fake_openai import Exchange, ThreadedFakeServer

PNG = b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" + b"\x00" * 64


def ref(name: str, kind: str, mime: str, data: bytes, sha: str) -> E.AttachmentRef:
    return E.AttachmentRef(name=name, kind=kind, mime=mime, size=len(data), sha256=sha)


def test_an_image_goes_as_an_attachment_a_text_file_is_inlined_and_the_rest_is_described() -> None:
    blobs = {"a" * 64: PNG, "b" * 64: b"line one\nline two", "c" * 64: b"\x00\x01binary", "e" * 64: b"x"}
    refs = (ref("pic.png", "image", "image/png", PNG, "a" * 64),
            ref("notes.txt", "file", "application/octet-stream", blobs["b" * 64], "b" * 64),
            ref("data.bin", "file", "application/octet-stream", blobs["c" * 64], "c" * 64),
            ref("gone.txt", "file", "application/octet-stream", b"123", "d" * 64),
            ref("voice.ogg", "audio", "audio/ogg", b"x", "e" * 64))
    request = ModelRequest(messages=[E.Message(role="system", content="sys"),
                                     E.Message(role="user", content="look", attachments=refs)])
    sent = resolve(request, blobs.get)
    text = sent.messages[1].content
    assert text.startswith("look\n[file notes.txt]\nline one\nline two\n[end of file notes.txt]")
    assert "[file data.bin (application/octet-stream, 8 bytes): not shown to the model]" in text
    assert "[file gone.txt (application/octet-stream, 3 bytes): no longer stored]" in text
    assert "[audio voice.ogg (audio/ogg, 1 bytes): not shown to the model]" in text
    (image,) = sent.attachments[1]
    assert (image.name, image.mime, image.data) == ("pic.png", "image/png", PNG)
    assert sent.messages[0] == request.messages[0]


def test_a_long_text_file_is_cut_and_says_so() -> None:
    data = ("x" * (INLINE_CHARS + 50)).encode()
    request = ModelRequest(messages=[E.Message(role="user", content="",
                                               attachments=(ref("big.log", "file", "text", data, "f" * 64),))])
    text = resolve(request, {"f" * 64: data}.get).messages[0].content
    assert "[… 50 more characters cut]" in text and text.count("x") == INLINE_CHARS


def test_the_context_budget_counts_a_messages_attachments() -> None:
    refs = (ref("pic.png", "image", "image/png", PNG, "a" * 64),
            ref("notes.txt", "file", "application/octet-stream", b"y" * 30_000, "b" * 64))
    plain = E.Message(role="user", content="look")
    assert message_chars(E.Message(role="user", content="look", attachments=refs)) == \
        message_chars(plain) + estimated_chars(refs) and estimated_chars(refs) >= IMAGE_CHARS + INLINE_CHARS


@pytest.fixture
def vision_model(service):
    seen: list[dict] = []

    async def script(x: Exchange) -> None:
        seen.append(x.body)
        await x.answer(["seen"], usage={"prompt_tokens": 5, "completion_tokens": 1})

    fake = ThreadedFakeServer(script).__enter__()
    provider = OpenAIProvider(model="vision-model", base_url=fake.base_url, api_key="sk-test-key-5678", vision=True)
    host, svc = service(provider=provider)
    yield host, svc, seen
    host.rt.worker.submit(provider.aclose()).result(10)
    fake.__exit__()


def test_a_sent_image_and_text_file_reach_a_vision_model_and_the_call_names_them(vision_model) -> None:
    host, svc, seen = vision_model
    c = MemoryClient(svc)
    sid = c.result("session/create", {})["session"]["id"]
    c.result("session/subscribe", {"sessionId": sid})
    files = [{"data": "data:image/png;base64," + base64.b64encode(PNG).decode(), "name": "pic.png"},
             {"data": "data:text/plain;base64," + base64.b64encode(b"hello from a file").decode(), "name": "a.txt"}]
    c.result("turn/send", {"sessionId": sid, "content": "what is this?", "attachments": files})
    assert turn_done(c, sid)["outcome"] == "replied"
    (body,) = seen
    user = body["messages"][-1]
    texts = [p["text"] for p in user["content"] if p["type"] == "text"]
    images = [p["image_url"]["url"] for p in user["content"] if p["type"] == "image_url"]
    assert texts == ["what is this?\n[file a.txt]\nhello from a file\n[end of file a.txt]"]
    assert images == ["data:image/png;base64," + base64.b64encode(PNG).decode()]
    (started,) = [r.event for r in host.session(sid).events() if isinstance(r.event, E.LlmStarted)]
    assert started.attachments == [f"pic.png (image, image/png, {len(PNG)} bytes)",
                                   "a.txt (file, application/octet-stream, 17 bytes)"]


def test_replay_shows_the_files_a_model_call_was_sent(vision_model) -> None:
    host, svc, _ = vision_model
    c = MemoryClient(svc)
    sid = c.result("session/create", {})["session"]["id"]
    c.result("session/subscribe", {"sessionId": sid})
    c.result("turn/send", {"sessionId": sid, "content": "see", "attachments": [
        {"data": "data:image/png;base64," + base64.b64encode(PNG).decode(), "name": "pic.png"}]})
    turn_done(c, sid)
    (step,) = [e for e in build_timeline(sid, list(host.session(sid).events())).entries
               if e.kind == "model" and "stepId" in e.facts]
    assert step.facts["attachments"] == [f"pic.png (image, image/png, {len(PNG)} bytes)"]
