"""benchmarks/measure.py's machine reference: a fixed workload whose time tells a slow machine."""

from __future__ import annotations

import math

from benchmarks.measure import machine_reference_ms, reference_work


def test_the_reference_work_is_fixed_work_with_a_fixed_checksum() -> None:
    # 512 keys of "s0".."s511"; each round adds len(key) and n % 3 of a counter that grows by i & 7
    table: dict[str, int] = {}
    expected = 0
    for i in range(3000):
        key = f"s{i % 512}"
        table[key] = table.get(key, 0) + (i & 7)
        expected += len(key) + table[key] % 3
    assert reference_work(3000) == expected + 512
    assert reference_work() == reference_work()


def test_the_machine_reference_is_a_time_in_milliseconds() -> None:
    ms = machine_reference_ms(repeats=2)
    assert math.isfinite(ms) and ms > 0
