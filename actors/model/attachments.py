"""What a model is sent of a message's attachments (issue "Real models in production").

A user message keeps its attachments as references (``Message.attachments``: name, kind, sniffed
MIME type, size, sha256). For each model call the session resolves them off the actor thread
(:func:`resolve`, blob reads are file I/O):

* an **image** goes to the provider as a :class:`~actors.model.base.ModelAttachment` with its
  bytes: a vision model gets it as an ``image_url`` content part (a ``data:`` URL with the sniffed
  type); a model without vision is told in the text that it does not see it;
* a **text-like file** (any non-media file whose bytes decode as UTF-8 with no NUL) is inlined in
  the message text, with its name, cut to :data:`INLINE_CHARS` characters;
* **anything else** (audio, video, binary files, a blob no longer on disk) is described in the
  text by name, type and size.

The trimming rules count attachments before the call (:func:`estimated_chars`, which needs no
file: an image as :data:`IMAGE_CHARS`, a file as at most :data:`INLINE_CHARS`, media as a
description), so ``contextChars`` bounds what is sent; compaction's transcript names them.
Everything here is a pure function of the references and the bytes read, so a replay of the
same log sends the same.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import msgspec

from sessionloop.actors.events import AttachmentRef, Message
from sessionloop.actors.model.base import ModelAttachment, ModelRequest

#: A text file is inlined up to this many characters (the rest is cut, and the cut is said).
INLINE_CHARS = 20_000
#: What an image counts for in the context budget (a vision model's image costs a few hundred
#: tokens; characters are the budget's unit, about 4 a token).
IMAGE_CHARS = 1_000
_DESCRIPTION_CHARS = 120

ReadBlob = Callable[[str], bytes | None]


def estimated_chars(refs: Sequence[AttachmentRef]) -> int:
    """What a message's attachments count for in the context budget, without reading them."""
    total = 0
    for ref in refs:
        if ref.kind == "image":
            total += IMAGE_CHARS
        elif ref.kind == "file":
            total += min(ref.size, INLINE_CHARS) + _DESCRIPTION_CHARS
        else:
            total += _DESCRIPTION_CHARS
    return total


def describe(ref: AttachmentRef, why: str = "") -> str:
    """``[file report.bin (application/octet-stream, 2048 bytes)]`` and why it is not shown."""
    return f"[{ref.kind} {ref.name} ({ref.mime}, {ref.size} bytes){': ' + why if why else ''}]"


def inline_text(ref: AttachmentRef, data: bytes) -> str | None:
    """The file as text for the model, or None when it is not text (not UTF-8, or a NUL in it)."""
    if b"\x00" in data:
        return None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return None
    cut = "" if len(text) <= INLINE_CHARS else f"\n[… {len(text) - INLINE_CHARS} more characters cut]"
    return f"[file {ref.name}]\n{text[:INLINE_CHARS]}{cut}\n[end of file {ref.name}]"


def resolve(request: ModelRequest, read: ReadBlob) -> ModelRequest:
    """``request`` with each message's attachments turned into what the model is sent (see the
    module doc): text files and descriptions in the message text, images as attachments of the
    message's index. Blocking (reads blobs): call it off the actor thread."""
    messages = list(request.messages)
    images: dict[int, list[ModelAttachment]] = {}
    for i, message in enumerate(messages):
        if not message.attachments:
            continue
        notes: list[str] = []
        for ref in message.attachments:
            data = read(ref.sha256) if ref.kind in ("image", "file") else None
            if ref.kind in ("image", "file") and data is None:
                notes.append(describe(ref, "no longer stored"))
            elif ref.kind == "image" and data is not None:
                images.setdefault(i, []).append(ModelAttachment(name=ref.name, kind="image", mime=ref.mime, data=data))
            elif ref.kind == "file" and data is not None and (text := inline_text(ref, data)) is not None:
                notes.append(text)
            else:
                notes.append(describe(ref, "not shown to the model"))
        content = "\n".join([message.content, *notes]) if message.content else "\n".join(notes)
        messages[i] = msgspec.structs.replace(message, content=content)
    # the inlined files change the messages' characters: the sender's counts no longer hold
    return msgspec.structs.replace(request, messages=messages, attachments=images, tally=None)


def has_attachments(messages: Sequence[Message]) -> bool:
    return any(m.attachments for m in messages)


def request_has_attachments(request: ModelRequest) -> bool:
    """Whether any message of ``request`` has files (from its tally when it carries one)."""
    tally = request.tally
    return tally.attachments > 0 if tally is not None else has_attachments(request.messages)


__all__ = ["IMAGE_CHARS", "INLINE_CHARS", "describe", "estimated_chars", "has_attachments", "inline_text",
           "request_has_attachments", "resolve"]
