"""The server's GC settings (actors/system/gc_policy.py): applied by the process owner, never lowered."""

from __future__ import annotations

import gc

import pytest

from sessionloop.actors.system import gc_policy


@pytest.fixture
def thresholds():
    saved = gc.get_threshold()
    yield
    gc.set_threshold(*saved)


def test_apply_raises_the_young_threshold_and_keeps_the_others(thresholds):
    gc.set_threshold(700, 10, 10)
    gc_policy.apply()
    assert gc.get_threshold() == (gc_policy.YOUNG_THRESHOLD, 10, 10)


def test_apply_never_lowers_a_higher_threshold_the_application_chose(thresholds):
    gc.set_threshold(50_000, 20, 30)
    gc_policy.apply()
    assert gc.get_threshold() == (50_000, 20, 30)
