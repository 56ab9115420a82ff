"""Actor tests run a real Host on real LMDB in a temporary directory; every actor is stopped after
each test (the host closes its directory)."""

from __future__ import annotations

import gc

import pytest

from sessionloop.actors.api.host import Host


@pytest.fixture
def data_dir(tmp_path):
    return str(tmp_path / "data")


@pytest.fixture
def open_host(data_dir):
    hosts: list[Host] = []

    def make(at: str | None = None, **options):
        """A host on ``data_dir`` (or on the directory ``at``)."""
        options.setdefault("durability", "nosync")
        host = Host.open(at or data_dir, **options)
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


@pytest.fixture
def service(open_host):
    """``make(**host options) -> (host, its SessionProtocolService)``: the gateway without sockets,
    for tests that talk to it through ``gateway_harness.MemoryClient``."""

    def make(**options):
        host = open_host(**options)
        return host, host.protocol()

    return make


@pytest.fixture
def paused_gc():
    """For tests that time an actor's answer (cancel, status while a turn runs): this test
    process holds ~140k objects from earlier tests, and a full pass of the cyclic collector over
    them takes 70-135 ms (measured with ``gc.callbacks``), which is the test process's pause, not
    the actor's. A server freezes its startup objects and raises the young threshold
    (``actors/system/gc_policy.py``); here the collector is simply held off while the test runs."""
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
