"""Attachment types are decided by the file's header (seed 004 附件): media keep their sniffed MIME
type, every other file is application/octet-stream, whatever the client's data URL said."""

from __future__ import annotations

import base64

import pytest

from sessionloop.actors import events as E
from sessionloop.actors.system.blobs import kind_of, sniff_mime
from tests.actors.gateway_harness import MemoryClient

PNG = b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" + b"\x00" * 64
JPEG = b"\xff\xd8\xff\xe0\x00\x10JFIF\x00" + b"\x00" * 64
WEBM = b"\x1aE\xdf\xa3\x9fB\x86\x81\x01B\xf7\x81\x01B\xf2\x81\x04B\xf3\x81\x08B\x82\x84webmB\x87\x81\x04" + b"\x00" * 64
MP4 = b"\x00\x00\x00\x20ftypisom\x00\x00\x02\x00isomiso2avc1mp41" + b"\x00" * 64
OGG = b"OggS\x00\x02" + b"\x00" * 64
PDF = b"%PDF-1.7\n%\xe2\xe3\xcf\xd3\n" + b"0" * 64
ZIP = b"PK\x03\x04\x14\x00\x00\x00\x08\x00" + b"\x00" * 64


@pytest.mark.parametrize(("data", "mime", "kind"), [
    (PNG, "image/png", "image"), (JPEG, "image/jpeg", "image"), (WEBM, "video/webm", "video"),
    (MP4, "video/mp4", "video"), (OGG, "audio/ogg", "audio"),
    (PDF, "application/octet-stream", "file"), (ZIP, "application/octet-stream", "file"),
    (b"just some text\n" * 8, "application/octet-stream", "file"), (b"", "application/octet-stream", "file"),
])
def test_media_keep_their_sniffed_type_and_every_other_file_is_an_octet_stream(data, mime, kind) -> None:
    assert sniff_mime(data) == mime and kind_of(sniff_mime(data)) == kind


def test_a_pdf_sent_as_an_image_is_recorded_as_a_file_of_octet_stream(service) -> None:
    host, svc = service()
    c = MemoryClient(svc)
    sid = c.result("session/create", {})["session"]["id"]
    for name, data, claimed in (("doc.png", PDF, "image/png"), ("clip.ts", PNG, "video/mp2t")):
        url = f"data:{claimed};base64," + base64.b64encode(data).decode()
        c.result("turn/send", {"sessionId": sid, "content": name, "attachments": [{"data": url, "name": name}]})
    refs = [a for r in host.session(sid).events() if isinstance(r.event, E.InputAccepted)
            for a in r.event.attachments]
    assert [(a.name, a.kind, a.mime) for a in refs] == [
        ("doc.png", "file", "application/octet-stream"), ("clip.ts", "image", "image/png")]
