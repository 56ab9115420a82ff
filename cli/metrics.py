"""Rendering ``/metrics`` for ``serve``."""

from __future__ import annotations

from typing import Any


def render_metrics(host: Any) -> bytes:
    return host.rt.metrics.render()  # type: ignore[no-any-return]
