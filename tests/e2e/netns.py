"""Hosts on one machine: network namespaces joined by veth pairs to a bridge, made with iproute2.

``Hosts(n)`` makes a namespace per host (``<tag>h<i>``, address ``10.A.B.11+i``) and one for the
switch (a Linux bridge), each host joined to the switch by a veth pair, and joins this namespace
to the switch too (``10.A.B.1``), so a test reaches every host as a client on the network would.
``cut(i)`` sets host ``i``'s port on the switch down, a partition of that host from every other
(the test included) while its own processes go on; ``heal(i)`` sets it up again. A process runs on
host ``i`` under ``prefix(i)`` (``ip netns exec``, which execs the command: the pid a test signals
is the process's own). ``close()`` removes it all. Making namespaces needs root (CAP_NET_ADMIN);
CI runs as root, as this machine does.
"""

from __future__ import annotations

import ipaddress
import random
import secrets
import subprocess


def _ip(*args: str) -> None:
    done = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=10)
    if done.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {done.stderr.strip()}")


def _used_networks() -> list[ipaddress.IPv4Network]:
    out = subprocess.run(["ip", "-4", "-o", "addr"], capture_output=True, text=True, timeout=10).stdout
    return [ipaddress.IPv4Interface(f.split()[3]).network for f in out.splitlines() if len(f.split()) > 3]


class Hosts:
    def __init__(self, n: int) -> None:
        self.tag = f"sl{secrets.token_hex(2)}"
        used = _used_networks()
        while True:
            net = ipaddress.IPv4Network(f"10.{random.randint(100, 250)}.{random.randint(0, 255)}.0/24")
            if not any(net.overlaps(u) for u in used):
                break
        self.network = net
        base = net.network_address
        self.gateway = str(base + 1)
        self.addresses = [str(base + 11 + i) for i in range(n)]
        self.switch = f"{self.tag}sw"
        self.namespaces = [f"{self.tag}h{i}" for i in range(n)]
        self._made: list[str] = []
        self._root_link = f"{self.tag}r"
        try:
            self._make()
        except BaseException:
            self.close()
            raise

    def _make(self) -> None:
        _ip("netns", "add", self.switch)
        self._made.append(self.switch)
        _ip("-n", self.switch, "link", "add", "br0", "type", "bridge")
        _ip("-n", self.switch, "link", "set", "br0", "up")
        for i, ns in enumerate(self.namespaces):
            _ip("netns", "add", ns)
            self._made.append(ns)
            _ip("link", "add", "eth0", "netns", ns, "type", "veth", "peer", "name", self.port(i), "netns", self.switch)
            _ip("-n", ns, "addr", "add", f"{self.addresses[i]}/{self.network.prefixlen}", "dev", "eth0")
            _ip("-n", ns, "link", "set", "eth0", "up")
            _ip("-n", ns, "link", "set", "lo", "up")
            _ip("-n", self.switch, "link", "set", self.port(i), "master", "br0", "up")
        _ip("link", "add", self._root_link, "type", "veth", "peer", "name", f"{self.tag}q", "netns", self.switch)
        _ip("-n", self.switch, "link", "set", f"{self.tag}q", "master", "br0", "up")
        _ip("addr", "add", f"{self.gateway}/{self.network.prefixlen}", "dev", self._root_link)
        _ip("link", "set", self._root_link, "up")

    def port(self, i: int) -> str:
        """Host ``i``'s port on the switch (the veth end in the switch's namespace)."""
        return f"{self.tag}p{i}"

    def prefix(self, i: int) -> list[str]:
        return ["ip", "netns", "exec", self.namespaces[i]]

    def cut(self, i: int) -> None:
        _ip("-n", self.switch, "link", "set", self.port(i), "down")

    def heal(self, i: int) -> None:
        _ip("-n", self.switch, "link", "set", self.port(i), "up")

    def close(self) -> None:
        subprocess.run(["ip", "link", "del", self._root_link], capture_output=True, timeout=10)
        for ns in reversed(self._made):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=10)
        self._made.clear()
