"""The user documentation stays honest about what ships: every relative link in README.md and
docs/*.md points at a file that exists (and at a heading that exists, for links with a
``#fragment`` into a Markdown file), and every ``sessionloop COMMAND`` that README.md and
docs/reference.md name in code is a real command of the CLI (a subcommand of a group too:
``sessionloop sessions ls``)."""

from __future__ import annotations

import glob
import os
import re

import click
import pytest

from sessionloop.cli.main import main
from tests.conftest import REPO

DOCS = [os.path.join(REPO, "README.md"), *sorted(glob.glob(os.path.join(REPO, "docs", "*.md")))]
COMMAND_DOCS = [os.path.join(REPO, "README.md"), os.path.join(REPO, "docs", "reference.md")]

_LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
_FENCE = re.compile(r"^(```|~~~).*?^\1", re.S | re.M)
_INLINE = re.compile(r"`([^`\n]+)`")
# "sessionloop WORD": not "from sessionloop import", ".sessionloop/", "sessionloop_turns_total"
_COMMAND = re.compile(r"(?<![\w./-])sessionloop[ \t]+([a-z][a-z0-9-]*)(?:[ \t]+([a-z][a-z0-9-]*))?")


def _read(path: str) -> str:
    with open(path, encoding="utf-8") as f:
        return f.read()


def _anchors(markdown: str) -> set[str]:
    """GitHub's anchors of the headings: lower case, punctuation dropped, spaces to dashes."""
    out = set()
    for line in _FENCE.sub("", markdown).splitlines():
        if line.startswith("#"):
            title = line.lstrip("#").strip().lower()
            out.add(re.sub(r"[^\w\- ]", "", title).replace(" ", "-"))
    return out


def relative_links(path: str) -> list[str]:
    """The relative link targets of a Markdown file (outside code blocks and code spans)."""
    text = _INLINE.sub("", _FENCE.sub("", _read(path)))
    return [t for t in _LINK.findall(text) if not re.match(r"[a-z][a-z0-9+.-]*:", t) and not t.startswith("#")]


def broken_links(path: str) -> list[str]:
    broken = []
    for target in relative_links(path):
        file, _, fragment = target.partition("#")
        resolved = os.path.normpath(os.path.join(os.path.dirname(path), file))
        if not os.path.exists(resolved):
            broken.append(target)
        elif fragment and resolved.endswith(".md") and fragment not in _anchors(_read(resolved)):
            broken.append(target)
    return broken


def named_commands(path: str) -> list[tuple[str, str | None]]:
    """``(command, next word)`` for every ``sessionloop COMMAND`` in the file's code (code blocks
    and code spans)."""
    text = _read(path)
    code = [m.group(0) for m in _FENCE.finditer(text)] + _INLINE.findall(_FENCE.sub("", text))
    found = []
    for chunk in code:
        for line in chunk.splitlines():
            for m in _COMMAND.finditer(line):
                if m.group(1) == "import":  # "import sessionloop" / "from sessionloop import ..."
                    continue
                found.append((m.group(1), m.group(2)))
    return found


def unknown_commands(path: str) -> list[str]:
    ctx = click.Context(main)
    commands = set(main.list_commands(ctx))
    unknown = []
    for name, sub in named_commands(path):
        if name not in commands:
            unknown.append(name)
            continue
        group = main.get_command(ctx, name)
        if isinstance(group, click.Group) and sub is not None and sub not in group.list_commands(ctx):
            unknown.append(f"{name} {sub}")
    return unknown


@pytest.mark.parametrize("path", DOCS, ids=lambda p: os.path.relpath(p, REPO))
def test_every_relative_link_points_at_a_file_that_exists(path: str) -> None:
    assert broken_links(path) == []


@pytest.mark.parametrize("path", COMMAND_DOCS, ids=lambda p: os.path.relpath(p, REPO))
def test_every_sessionloop_command_named_is_a_real_subcommand(path: str) -> None:
    assert named_commands(path), "no command found: the pattern no longer matches the file"
    assert unknown_commands(path) == []


def test_the_checks_catch_a_broken_link_and_an_unknown_command(tmp_path) -> None:
    page = tmp_path / "page.md"
    (tmp_path / "there.md").write_text("# A title\n")
    page.write_text("[ok](there.md) [ok](there.md#a-title) [web](https://example.com)\n"
                    "[gone](missing.md) [no heading](there.md#nope)\n"
                    "`sessionloop serve` `sessionloop sessions ls` `from sessionloop import Host`\n"
                    "```\nsessionloop frobnicate\nsessionloop tasks explode\n```\n")
    assert broken_links(str(page)) == ["missing.md", "there.md#nope"]
    assert unknown_commands(str(page)) == ["frobnicate", "tasks explode"]


# "python benchmarks/NAME.py --option ...": the benchmark commands benchmarks/README.md gives
BENCH_README = os.path.join(REPO, "benchmarks", "README.md")
_BENCH = re.compile(r"python3? (benchmarks/[\w/]+\.py)((?:[ \t]+[^\s`|]+)*)")


def bench_commands(path: str) -> list[tuple[str, list[str]]]:
    """``(script, its --options)`` for every ``python benchmarks/X.py ...`` in the file's code."""
    text = _read(path)
    code = [m.group(0) for m in _FENCE.finditer(text)] + _INLINE.findall(_FENCE.sub("", text))
    return [(m.group(1), [w.split("=")[0] for w in m.group(2).split() if w.startswith("--")])
            for chunk in code for m in _BENCH.finditer(chunk)]


def unknown_bench_commands(path: str, root: str) -> list[str]:
    """The scripts that do not exist, and the options their argument parsers do not declare."""
    unknown = []
    for script, options in bench_commands(path):
        file = os.path.join(root, script)
        if not os.path.exists(file):
            unknown.append(script)
            continue
        source = _read(file)
        unknown += [f"{script} {o}" for o in options if f'"{o}"' not in source]
    return unknown


def test_every_benchmark_command_names_a_script_and_options_it_has() -> None:
    assert bench_commands(BENCH_README), "no command found: the pattern no longer matches the file"
    assert unknown_bench_commands(BENCH_README, REPO) == []


def test_the_benchmark_check_catches_a_missing_script_and_an_unknown_option(tmp_path) -> None:
    (tmp_path / "benchmarks").mkdir()
    (tmp_path / "benchmarks" / "b.py").write_text('ap.add_argument("--quick")\n')
    page = tmp_path / "README.md"
    page.write_text("`python benchmarks/b.py --quick` `python benchmarks/b.py --nope 3`\n"
                    "```\npython benchmarks/gone.py --quick\n```\n")
    assert unknown_bench_commands(str(page), str(tmp_path)) == ["benchmarks/gone.py", "benchmarks/b.py --nope"]
