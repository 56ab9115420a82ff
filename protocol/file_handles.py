"""Opaque, unforgeable file handles for attachments (docs/protocol.md: attachments are fetched by handle).

A handle names one stored file for one session during one epoch (one start of the server). It is
``<payload>.<mac>``, both base64url without padding, so it has the documented shape (letters, digits,
``-``, ``_`` and exactly one ``.``) and clients pass it through untouched:

* ``payload`` is the file id (UTF-8, base64url);
* ``mac`` is HMAC-SHA256 under the **epoch key** over a domain tag, the session id and the
  payload *text*. Keying per epoch is what makes handles expire at restart: a new epoch's key
  rejects every older handle. Binding the session id makes a handle useless in another session.

Why the MAC covers the payload as text, and the MAC is compared as text: base64 has several
spellings of the same bytes (the unused low bits of the last character); verifying over decoded
bytes would accept such altered handles. Comparing the canonical text refuses every alteration.

:func:`resolve` never raises on a handle from the peer: anything wrong is ``None``. The transport
then answers 404 without saying why (forged, altered, other session or previous epoch).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import re
import secrets
from typing import Final

from sessionloop.protocol.errors import ProtocolMisuse

__all__ = [
    "HANDLE_SHAPE",
    "MAX_HANDLE_CHARS",
    "derive_epoch_key",
    "issue",
    "new_epoch_key",
    "resolve",
]

HANDLE_SHAPE: Final = re.compile(r"[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+")
#: File ids are short; a longer handle is refused before any decoding or hashing.
MAX_HANDLE_CHARS: Final = 2048
MIN_KEY_BYTES: Final = 16
_DOMAIN: Final = b"sessionloop/file-handle/v1\x00"


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _check_key(key: bytes) -> None:
    if len(key) < MIN_KEY_BYTES:
        raise ProtocolMisuse(f"a file-handle key needs at least {MIN_KEY_BYTES} bytes")


def _mac(key: bytes, session_id: str, payload: str) -> str:
    sid = session_id.encode("utf-8", "surrogatepass")
    # Length-prefixed, so (session, payload) pairs cannot be re-split into another valid pair.
    message = _DOMAIN + len(sid).to_bytes(4, "big") + sid + payload.encode("ascii")
    return _b64(hmac.new(key, message, hashlib.sha256).digest())


def new_epoch_key() -> bytes:
    """A fresh random key for a new epoch (32 bytes)."""
    return secrets.token_bytes(32)


def derive_epoch_key(master: bytes, epoch: int) -> bytes:
    """A per-epoch key from a long-lived secret: the same epoch always gives the same key (so
    several worker processes agree), a new epoch a different one."""
    _check_key(master)
    return hmac.new(master, _DOMAIN + b"epoch:" + str(epoch).encode("ascii"), hashlib.sha256).digest()


def issue(key: bytes, session_id: str, file_id: str) -> str:
    """A handle for ``file_id`` in ``session_id``, valid while ``key`` (the epoch's key) is."""
    _check_key(key)
    if not file_id:
        raise ProtocolMisuse("cannot issue a handle for an empty file id")
    payload = _b64(file_id.encode("utf-8"))
    return f"{payload}.{_mac(key, session_id, payload)}"


def resolve(key: bytes, session_id: str, handle: str) -> str | None:
    """The file id a valid handle names, or ``None`` (forged, altered, other session, old epoch).

    The MAC is compared with :func:`hmac.compare_digest` (constant time in the MAC's content).
    """
    _check_key(key)
    if not isinstance(handle, str) or len(handle) > MAX_HANDLE_CHARS or not HANDLE_SHAPE.fullmatch(handle):
        return None
    payload, mac = handle.split(".")
    if not hmac.compare_digest(mac, _mac(key, session_id, payload)):
        return None
    try:
        return base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)).decode("utf-8")
    except (binascii.Error, ValueError):  # only reachable with a leaked key; stay total
        return None
