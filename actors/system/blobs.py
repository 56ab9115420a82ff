"""Content-addressed attachment storage in the data directory (``blobs/ab/abcdef...``).

Attachments can be 20 MB; they stay out of the event log, which records only their name, size,
MIME type and sha256 (``AttachmentRef``). A blob is written to a temporary file and renamed, so
a crash never leaves a half-written blob under its final name; an orphan blob (written, then
the input was refused) is harmless.

References: one blob may be sent to many sessions (the same image to every contact), and when a
session is deleted its attachments go with it unless another session still refers to them
(a delete clears the history). Each ``put`` for a session leaves two empty marker files,
``blobs/ab/<sha>.refs/<session>`` (who refers to the blob) and ``blobs/sessions/<session>/<sha>``
(what a session refers to, read again after a crash), before it writes the blob.
:meth:`BlobStore.release_session` removes a session's markers and deletes each blob whose last
marker that was. A marker is written before the input that refers to the blob is committed, so a
refused input leaves a marker (the blob stays until that session is deleted), never the other
way round. A blob stored before markers existed gets ``_legacy`` (no session id starts with
``_``) the first time it is put again, and is never deleted: who else refers to it is unknown.
One lock orders puts and releases, so a blob a put is handing to a session is never deleted
under it; a put for a session already released is refused.
"""

from __future__ import annotations

import hashlib
import os
import re
import threading

import filetype

from sessionloop.actors.errors import NotFound
from sessionloop.actors.settings.texts import Text

#: Media kinds the protocol names (``ItemAttachment.kind``); every other type is a "file".
MEDIA = ("image", "audio", "video")
OCTET_STREAM = "application/octet-stream"
#: The head of a file the sniffer reads (every media signature sits near the start).
SNIFF_BYTES = 64 * 1024


def sniff_mime(data: bytes) -> str:
    """The MIME type the bytes' header shows, for media; ``application/octet-stream`` for
    everything else (the kind is judged by the server from the file header; what is not media
    is application/octet-stream): a PDF, a zip or a text file is a file, whatever the client called
    it (a browser names types by extension: ``.ts`` becomes video/mp2t). The signatures are the
    ``filetype`` package's, not a table of ours (it names Ogg, the container of IM voice notes,
    audio/ogg)."""
    kind = filetype.guess(data[:SNIFF_BYTES])
    mime = kind.mime if kind is not None else ""
    return mime if mime.split("/", 1)[0] in MEDIA else OCTET_STREAM


def kind_of(mime: str) -> str:
    major = mime.split("/", 1)[0]
    return major if major in MEDIA else "file"


_SESSION_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
LEGACY = "_legacy"


def marker_name(session_id: str) -> str:
    """``session_id`` as a file name; ValueError for an id that cannot be one (ids the server
    makes and ``import --as`` allows always can)."""
    if not _SESSION_NAME.match(session_id):
        raise ValueError(f"session id {session_id[:64]!r} cannot name a blob reference")
    return session_id


class BlobStore:
    def __init__(self, root: str) -> None:
        self.root = root
        os.makedirs(root, exist_ok=True)
        self._lock = threading.Lock()
        self._released: set[str] = set()

    def path(self, sha256: str) -> str:
        if len(sha256) != 64 or not all(c in "0123456789abcdef" for c in sha256):
            raise ValueError(f"not a blob id: {sha256!r}")
        return os.path.join(self.root, sha256[:2], sha256)

    def _session_dir(self, session_id: str) -> str:
        return os.path.join(self.root, "sessions", marker_name(session_id))

    def put(self, data: bytes, session_id: str) -> str:
        """Store ``data`` for ``session_id``; its sha256. Raises NotFound for a deleted session."""
        digest = hashlib.sha256(data).hexdigest()
        final = self.path(digest)
        refs = f"{final}.refs"
        mine = self._session_dir(session_id)
        with self._lock:
            if session_id in self._released:
                raise NotFound(Text("error.session-not-found", session=session_id))
            had_blob, had_refs = os.path.exists(final), os.path.isdir(refs)
            os.makedirs(refs, exist_ok=True)
            if had_blob and not had_refs:  # stored before references were kept: never deleted
                _touch(os.path.join(refs, LEGACY))
            _touch(os.path.join(refs, session_id))
            os.makedirs(mine, exist_ok=True)
            _touch(os.path.join(mine, digest))
            if not had_blob:
                tmp = f"{final}.{os.getpid()}.tmp"
                with open(tmp, "wb") as f:
                    f.write(data)
                os.replace(tmp, final)
        return digest

    def read(self, sha256: str) -> bytes | None:
        """The blob's bytes, or None when it is not stored (never was, or deleted since)."""
        try:
            with open(self.path(sha256), "rb") as f:
                return f.read()
        except (OSError, ValueError):
            return None

    def referrers(self, sha256: str) -> list[str]:
        """The sessions (and ``_legacy``) whose markers keep the blob."""
        try:
            return sorted(os.listdir(f"{self.path(sha256)}.refs"))
        except FileNotFoundError:
            return []

    def release_session(self, session_id: str) -> list[str]:
        """Drop ``session_id``'s references and delete the blobs nobody else refers to; the ids
        of the blobs deleted. Idempotent (a crash in the middle is finished by calling it again);
        later puts for the session are refused."""
        mine = self._session_dir(session_id)
        deleted: list[str] = []
        with self._lock:
            self._released.add(session_id)
            try:
                digests = sorted(os.listdir(mine))
            except FileNotFoundError:
                return deleted
            for digest in digests:
                try:
                    final = self.path(digest)
                except ValueError:  # not a marker this store wrote
                    continue
                _unlink(os.path.join(f"{final}.refs", session_id))
                try:
                    os.rmdir(f"{final}.refs")  # fails while another session (or _legacy) refers to it
                except FileNotFoundError:
                    pass
                except OSError:
                    _unlink(os.path.join(mine, digest))
                    continue
                if _unlink(final):
                    deleted.append(digest)
                _unlink(os.path.join(mine, digest))
            try:
                os.rmdir(mine)
            except OSError:
                pass
        return deleted

    def exists(self, sha256: str) -> bool:
        try:
            return os.path.exists(self.path(sha256))
        except ValueError:
            return False


def _touch(path: str) -> None:
    os.close(os.open(path, os.O_WRONLY | os.O_CREAT, 0o600))


def _unlink(path: str) -> bool:
    try:
        os.unlink(path)
    except FileNotFoundError:
        return False
    return True
