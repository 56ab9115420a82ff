"""Content-addressed attachment storage in the data directory (``blobs/ab/abcdef...``).

Attachments can be 20 MB; they stay out of the event log, which records only their name, size,
MIME type and sha256 (``AttachmentRef``). A blob is written to a temporary file and renamed, so
a crash never leaves a half-written blob under its final name; an orphan blob (written, then
the input was refused) is harmless.
"""

from __future__ import annotations

import hashlib
import os

# File signatures (magic numbers): the seed has the server decide the type from the header,
# never from what the browser claimed (.ts reported as video/mp2t).
_SIGNATURES: list[tuple[bytes, int, str]] = [
    (b"\x89PNG\r\n\x1a\n", 0, "image/png"),
    (b"\xff\xd8\xff", 0, "image/jpeg"),
    (b"GIF87a", 0, "image/gif"),
    (b"GIF89a", 0, "image/gif"),
    (b"BM", 0, "image/bmp"),
    (b"%PDF-", 0, "application/pdf"),
    (b"ID3", 0, "audio/mpeg"),
    (b"\xff\xfb", 0, "audio/mpeg"),
    (b"OggS", 0, "audio/ogg"),
    (b"fLaC", 0, "audio/flac"),
    (b"\x1aE\xdf\xa3", 0, "video/webm"),
]


def sniff_mime(data: bytes) -> str:
    """The MIME type the bytes show (``application/octet-stream`` when they show none we know)."""
    for magic, offset, mime in _SIGNATURES:
        if data[offset:offset + len(magic)] == magic:
            return mime
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "image/webp"
    if data[:4] == b"RIFF" and data[8:12] == b"WAVE":
        return "audio/wav"
    if data[4:8] == b"ftyp":
        return "audio/mp4" if data[8:11] == b"M4A" else "video/mp4"
    return "application/octet-stream"


def kind_of(mime: str) -> str:
    major = mime.split("/", 1)[0]
    return major if major in ("image", "audio", "video") else "file"


class BlobStore:
    def __init__(self, root: str) -> None:
        self.root = root
        os.makedirs(root, exist_ok=True)

    def path(self, sha256: str) -> str:
        if len(sha256) != 64 or not all(c in "0123456789abcdef" for c in sha256):
            raise ValueError(f"not a blob id: {sha256!r}")
        return os.path.join(self.root, sha256[:2], sha256)

    def put(self, data: bytes) -> str:
        digest = hashlib.sha256(data).hexdigest()
        final = self.path(digest)
        if os.path.exists(final):
            return digest
        os.makedirs(os.path.dirname(final), exist_ok=True)
        tmp = f"{final}.{os.getpid()}.tmp"
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, final)
        return digest

    def exists(self, sha256: str) -> bool:
        try:
            return os.path.exists(self.path(sha256))
        except ValueError:
            return False
