"""Protocol version negotiation for ``initialize`` (docs/protocol.md, Handshake): a pure function.

The rule:

* the protocol number follows the protocol, not the package. Below 1.0 it is written ``0.x.y``:
  an incompatible change bumps the second part, an additive one the third, and the handshake
  compares the **first two** parts. From 1.0 on an incompatible change bumps the first part and
  the handshake compares the **first** part only;
* clients may send two or three parts; the 0.20 generation sends a two-part ``"1.0"``, which must
  get the same ``unsupported`` refusal as any other mismatch, *not* ``invalidParams``;
* a mismatch is answered with ``applicationError`` / ``data.code = 'unsupported'`` and a message
  naming both versions, after which the server closes the connection; a difference in the third
  part alone is a normal handshake.

Only a string that is not a version at all (not 2–3 dot-separated non-negative integers) is
``invalidParams``: the client then did not follow the schema, and the connection stays open.
"""

from __future__ import annotations

import re
from typing import Final

from sessionloop.protocol.errors import RpcError

__all__ = [
    "SESSION_PROTOCOL_VERSION",
    "compatibility_key",
    "negotiate",
    "parse_version",
]

SESSION_PROTOCOL_VERSION: Final = "0.2.2"
# 0.2.1: approval grants; 0.2.2: loop/watch from a cursor, cursor-expired, the rate limits in
# initialize, webhooks/deadLetters/* (each additive)

# ASCII digits only (``\d`` would accept other scripts' digits), and a bound on each part so
# ``int()`` never meets a 5,000-digit number.
_VERSION: Final = re.compile(r"[0-9]{1,9}(?:\.[0-9]{1,9}){1,2}")


def parse_version(version: str) -> tuple[int, ...]:
    """``"0.2.0"`` -> ``(0, 2, 0)``; raises ``RpcError`` (invalidParams) if it is not a version."""
    if not _VERSION.fullmatch(version):
        shown = version if len(version) <= 40 else version[:40] + "…"
        raise RpcError.invalid_params(
            f"params.protocolVersion: {shown!r} is not a version (expected two or three "
            "dot-separated non-negative integers, e.g. '0.2.0')"
        )
    return tuple(int(part) for part in version.split("."))


def compatibility_key(parts: tuple[int, ...]) -> tuple[int, ...]:
    """The parts the handshake compares: the first two below 1.0, the first one from 1.0 on."""
    return parts[:2] if parts[0] == 0 else parts[:1]


def negotiate(client_version: str, server_version: str = SESSION_PROTOCOL_VERSION) -> str:
    """Decide whether a client speaking ``client_version`` may talk to this server.

    Returns the server's version (what ``initialize`` answers) when they are compatible. Raises
    :class:`RpcError`: ``invalidParams`` when ``client_version`` is not a version string,
    ``applicationError`` with ``data.code == 'unsupported'`` (and both versions in ``data``) when
    it is incompatible; after that reply the connection must be closed.
    """
    client = parse_version(client_version)
    server = tuple(int(part) for part in server_version.split("."))
    if compatibility_key(client) == compatibility_key(server):
        return server_version
    compared = "first two parts" if server[0] == 0 else "first part"
    raise RpcError.unsupported(
        f"protocol version {client_version} is not supported: this server speaks "
        f"{server_version} (versions must agree in the {compared})",
        clientVersion=client_version,
        serverVersion=server_version,
    )
