"""Ids of sessions, turns and inputs."""

from __future__ import annotations

import os
import random
import time

#: the random part of ids: seeded once from the OS, then drawn without a system call. An id names
#: a session, turn or input and grants nothing (access is checked by app and token), so it needs
#: to be unique, not unguessable; ``os.urandom`` per id released the GIL twice per turn and every
#: release handed it to another thread (measured: half of the in-process driver's time per turn).
_id_random = random.Random(os.urandom(32))


def new_id() -> str:
    """A time-ordered id: 11 hex digits of milliseconds, then 10 random hex digits."""
    return f"{int(time.time() * 1000):011x}{_id_random.getrandbits(40):010x}"
