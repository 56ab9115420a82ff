"""docs/bench-results.schema.json, the JSON Schema of the results file
(:func:`sessionloop.cli.loadtest.results.json_schema`), as the checked-in text: sorted keys,
two-space indent, a final newline. tests/loadtest/test_schema_file.py fails when the file is
stale; regenerate it with::

    python -m sessionloop.cli.loadtest.schema_file docs/bench-results.schema.json
"""

from __future__ import annotations

import json
import sys

from sessionloop.cli.loadtest.results import json_schema

COMMAND = "python -m sessionloop.cli.loadtest.schema_file docs/bench-results.schema.json"


def schema_text() -> str:
    """The text docs/bench-results.schema.json holds."""
    return json.dumps(json_schema(), indent=2, sort_keys=True) + "\n"


def write(path: str) -> None:
    with open(path, "w", encoding="utf-8") as f:
        f.write(schema_text())


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(f"usage: {COMMAND}", file=sys.stderr)
        return 2
    write(argv[0])
    return 0


__all__ = ["COMMAND", "main", "schema_text", "write"]

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

