"""``--fail-if``: the conditions parse, name what is wrong, and fail a run exactly when one holds."""

import pytest

from sessionloop.cli.loadtest.gate import GateError, failures, parse


def test_a_condition_that_holds_fails_the_run_and_one_that_does_not_passes() -> None:
    conditions = parse("p99_ms>200, errors>0")
    assert [str(c) for c in conditions] == ["p99_ms>200", "errors>0"]
    assert failures(conditions, {"p99_ms": 312.5, "errors": 0.0}) == ["p99_ms>200 (p99_ms = 312.5)"]
    assert failures(conditions, {"p99_ms": 200.0, "errors": 0.0}) == []
    assert failures(parse("turns_per_s<=100"), {"turns_per_s": 100.0}) == ["turns_per_s<=100 (turns_per_s = 100)"]


@pytest.mark.parametrize(("text", "words"), [
    ("", "no condition"),
    ("p99>200", "unknown metric 'p99'"),
    ("p99_ms=>200", "is not METRIC OP NUMBER"),
    ("p99_ms>abc", "is not METRIC OP NUMBER"),
    (",".join(["errors>0"] * 33), "at most 32"),
])
def test_what_does_not_parse_is_named(text: str, words: str) -> None:
    with pytest.raises(GateError, match=words):
        parse(text)
