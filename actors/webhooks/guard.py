"""Where a webhook may connect: never to a private, loopback, link-local or otherwise non-public
address unless the operator allows its network (``serve --webhook-allow-net``), checked when the
connection is made.

The check runs in the HTTP client's network backend (:class:`GuardedBackend`): the host is resolved
there, every address it resolves to is checked (one refused address refuses the target), and the
socket is connected to a checked address, never to the name again. So a name that resolves to a
public address when the file is read and to ``127.0.0.1`` later (DNS rebinding) is refused at
that later connection. TLS still verifies the certificate against the URL's host name (httpcore
passes it as ``server_hostname``). No proxy from the environment is used, and redirects are not
followed (the deliverer's client), so neither can lead around the check.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import Iterable, Sequence
from typing import Any

import httpcore
import httpx

__all__ = ["GuardedBackend", "TargetRefused", "guarded_transport", "refusal"]

Network = ipaddress.IPv4Network | ipaddress.IPv6Network
Address = ipaddress.IPv4Address | ipaddress.IPv6Address


class TargetRefused(httpcore.ConnectError):
    """The target's address is not public and its network is not allowed (not worth retrying:
    the delivery becomes a dead letter at once; replay it once the operator allowed it)."""


def refusal(ip: Address, allowed: Sequence[Network]) -> str | None:
    """Why ``ip`` may not be connected to, or None when it may."""
    if any(ip in net for net in allowed if net.version == ip.version):
        return None
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return refusal(ip.ipv4_mapped, allowed)
    for test, what in (("is_loopback", "a loopback"), ("is_link_local", "a link-local"),
                       ("is_private", "a private"), ("is_multicast", "a multicast"),
                       ("is_unspecified", "an unspecified"), ("is_reserved", "a reserved")):
        if getattr(ip, test):
            return f"{ip} is {what} address"
    if not ip.is_global:
        return f"{ip} is not a public address"
    return None


class GuardedBackend(httpcore.AsyncNetworkBackend):
    """httpcore's network backend with the address check in front of every TCP connection."""

    def __init__(self, allowed: Sequence[Network], inner: httpcore.AsyncNetworkBackend | None = None) -> None:
        self._allowed = list(allowed)
        self._inner = inner if inner is not None else httpcore.AnyIOBackend()

    async def resolve(self, host: str, port: int) -> list[Address]:
        try:
            return [ipaddress.ip_address(host)]
        except ValueError:
            pass
        try:
            infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except OSError as e:
            raise httpcore.ConnectError(f"cannot resolve {host}: {e}") from e
        return list(dict.fromkeys(ipaddress.ip_address(str(info[4][0]).split("%", 1)[0]) for info in infos))

    async def connect_tcp(self, host: str, port: int, timeout: float | None = None, local_address: str | None = None,
                          socket_options: Iterable[Any] | None = None) -> httpcore.AsyncNetworkStream:
        addresses = await self.resolve(host, port)
        if not addresses:
            raise httpcore.ConnectError(f"{host} resolves to no address")
        for ip in addresses:
            why = refusal(ip, self._allowed)
            if why is not None:
                raise TargetRefused(f"webhook target {host} refused: {why} (allow its network with serve "
                                    "--webhook-allow-net)")
        return await self._inner.connect_tcp(str(addresses[0]), port, timeout, local_address, socket_options)

    async def connect_unix_socket(self, path: str, timeout: float | None = None,
                                  socket_options: Iterable[Any] | None = None) -> httpcore.AsyncNetworkStream:
        raise TargetRefused("webhooks connect over TCP only")

    async def sleep(self, seconds: float) -> None:
        await self._inner.sleep(seconds)


class _GuardedTransport(httpx.AsyncHTTPTransport):
    """httpx's transport over a connection pool that connects through :class:`GuardedBackend`."""

    def __init__(self, allowed: Sequence[Network], max_connections: int) -> None:
        super().__init__(trust_env=False)
        # the pool httpx would build, with our network backend (httpx takes none as an argument)
        self._pool = httpcore.AsyncConnectionPool(
            ssl_context=httpx.create_ssl_context(trust_env=False), max_connections=max_connections,
            max_keepalive_connections=max_connections, keepalive_expiry=5.0,
            network_backend=GuardedBackend(allowed))


def guarded_transport(allowed: Sequence[Network], max_connections: int) -> httpx.AsyncBaseTransport:
    return _GuardedTransport(allowed, max_connections)
