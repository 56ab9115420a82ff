"""Rendering ``/metrics`` for ``serve``."""

from __future__ import annotations

from sessionloop.actors.api.host import Host


def render_metrics(host: Host) -> bytes:
    return host.rt.metrics.render()
