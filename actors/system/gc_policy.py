"""The cyclic garbage collector's settings for a process that hosts sessions.

Process-wide, so the process owner applies them, not ``Host.open``: ``sessionloop serve`` and
``sessionloop bench`` do, and so do the in-process benchmarks (they measure what the server
does). An application embedding a :class:`~actors.api.host.Host` may call them the same way.

Why: a collection stops every thread, and a full one walks every tracked object. A busy host
allocates many short-lived container objects per turn (closures, futures, replies) and keeps a
few per turn for good (tool arguments and outputs in the history). With the default young
threshold (700) the short-lived ones are collected young dozens of times a second, those that
outlive a turn are promoted, and full passes of 40-80 ms fell inside measured half-load runs
(README, Turns). A young threshold of 10,000 lets most of them die by reference count before
any pass looks at them; the young pass that remains costs a few milliseconds.
"""

from __future__ import annotations

import gc

#: allocations (net, of tracked objects) between young collections
YOUNG_THRESHOLD = 10_000


def apply() -> None:
    """Raise the young-generation threshold to :data:`YOUNG_THRESHOLD` (never lower it)."""
    young, middle, old = gc.get_threshold()
    gc.set_threshold(max(young, YOUNG_THRESHOLD), middle, old)


def freeze_startup() -> None:
    """Move what exists now (modules, the host, the transport) out of the collector's view:
    it lives as long as the process, and a full pass then walks only what sessions made since
    (over ~30k startup objects it cost ~15 ms of every full pause)."""
    gc.freeze()
