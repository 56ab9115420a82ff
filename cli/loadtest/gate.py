"""``--fail-if "p99_ms>200,errors>0"``: the conditions that make a run's exit code non-zero, so a
CI job can gate on a load test. A condition is ``METRIC OP NUMBER`` with a metric of
:data:`sessionloop.cli.loadtest.results.METRICS` and OP one of ``> >= < <= == !=``; commas join them
and any one that holds fails the run.
"""

from __future__ import annotations

import operator
import re
from collections.abc import Callable
from dataclasses import dataclass

from sessionloop.cli.loadtest.results import METRICS

OPS: dict[str, Callable[[float, float], bool]] = {
    ">=": operator.ge, "<=": operator.le, "==": operator.eq, "!=": operator.ne,
    ">": operator.gt, "<": operator.lt,
}
_CONDITION = re.compile(r"^\s*([a-z0-9_]+)\s*(>=|<=|==|!=|>|<)\s*(-?[0-9]+(?:\.[0-9]+)?)\s*$")
MAX_CONDITIONS = 32


class GateError(ValueError):
    """The ``--fail-if`` text does not parse; the message names the part that is wrong."""


@dataclass(frozen=True)
class Condition:
    metric: str
    op: str
    value: float

    def holds(self, figures: dict[str, float]) -> bool:
        return OPS[self.op](figures[self.metric], self.value)

    def __str__(self) -> str:
        return f"{self.metric}{self.op}{self.value:g}"


def parse(text: str) -> list[Condition]:
    parts = [p for p in text.split(",") if p.strip()]
    if not parts:
        raise GateError("no condition given (expected e.g. 'p99_ms>200,errors>0')")
    if len(parts) > MAX_CONDITIONS:
        raise GateError(f"{len(parts)} conditions; at most {MAX_CONDITIONS}")
    conditions = []
    for part in parts:
        match = _CONDITION.match(part)
        if match is None:
            raise GateError(f"{part.strip()[:80]!r} is not METRIC OP NUMBER (e.g. p99_ms>200)")
        metric, op, number = match.groups()
        if metric not in METRICS:
            raise GateError(f"unknown metric {metric!r}; one of: {', '.join(METRICS)}")
        conditions.append(Condition(metric, op, float(number)))
    return conditions


def failures(conditions: list[Condition], figures: dict[str, float]) -> list[str]:
    """The conditions that hold (each as ``p99_ms>200 (p99_ms = 312.5)``); empty: the run passes."""
    return [f"{c} ({c.metric} = {figures[c.metric]:g})" for c in conditions if c.holds(figures)]


__all__ = ["MAX_CONDITIONS", "Condition", "GateError", "failures", "parse"]
