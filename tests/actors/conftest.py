"""Actor tests run a real Host on real LMDB in a temporary directory; every actor is stopped after
each test (the host closes its directory)."""

from __future__ import annotations

import pytest

from actors.host import Host


@pytest.fixture
def data_dir(tmp_path):
    return str(tmp_path / "data")


@pytest.fixture
def open_host(data_dir):
    hosts: list[Host] = []

    def make(**options):
        options.setdefault("durability", "nosync")
        host = Host.open(data_dir, **options)
        hosts.append(host)
        return host

    yield make
    for h in hosts:
        try:
            h.close()
        except Exception:
            pass


@pytest.fixture
def host(open_host):
    return open_host(permission_mode="acceptCalls")
