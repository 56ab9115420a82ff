"""Content-addressed attachment storage in the data directory (``blobs/ab/abcdef...``).

Attachments can be 20 MB; they stay out of the event log, which records only their name, size,
MIME type and sha256 (``AttachmentRef``). A blob is written to a temporary file and renamed, so
a crash never leaves a half-written blob under its final name; an orphan blob (written, then
the input was refused) is harmless.
"""

from __future__ import annotations

import hashlib
import os

import filetype

#: Media kinds the protocol names (seed 004 ItemAttachment.kind); every other type is a "file".
MEDIA = ("image", "audio", "video")
OCTET_STREAM = "application/octet-stream"
#: The head of a file the sniffer reads (every media signature sits near the start).
SNIFF_BYTES = 64 * 1024


def sniff_mime(data: bytes) -> str:
    """The MIME type the bytes' header shows, for media; ``application/octet-stream`` for
    everything else (seed 004 附件: 种类由会话服务按文件头判定 … 不是媒体的写
    application/octet-stream): a PDF, a zip or a text file is a file, whatever the client called
    it (a browser names types by extension: ``.ts`` becomes video/mp2t). The signatures are the
    ``filetype`` package's, not a table of ours (it names Ogg, the container of IM voice notes,
    audio/ogg)."""
    kind = filetype.guess(data[:SNIFF_BYTES])
    mime = kind.mime if kind is not None else ""
    return mime if mime.split("/", 1)[0] in MEDIA else OCTET_STREAM


def kind_of(mime: str) -> str:
    major = mime.split("/", 1)[0]
    return major if major in MEDIA else "file"


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
