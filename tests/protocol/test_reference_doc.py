"""docs/protocol.md ships the protocol reference: its generated part is what the registry the
decoder enforces says today, and it names every method, notification, item kind and error code."""

from __future__ import annotations

import os
import typing

from sessionloop.protocol.errors import BUSINESS_CODES, RPC_ERROR_CODES
from sessionloop.protocol.reference import BEGIN, END, render, spliced
from sessionloop.protocol.registry import METHODS, NOTIFICATIONS
from sessionloop.protocol.schemas_items import SessionItem
from tests.conftest import REPO

DOC = os.path.join(REPO, "docs", "protocol.md")
REGENERATE = ("python -c \"import pathlib; from sessionloop.protocol.reference import spliced; "
              "p = pathlib.Path('docs/protocol.md'); p.write_text(spliced(p.read_text()))\"")


def doc() -> str:
    with open(DOC, encoding="utf-8") as f:
        return f.read()


def test_the_generated_part_of_docs_protocol_md_is_up_to_date() -> None:
    text = doc()
    assert text.count(BEGIN) == 1 and text.count(END) == 1
    assert spliced(text) == text, f"docs/protocol.md is out of date: run {REGENERATE}"


def test_the_reference_names_every_method_notification_item_kind_and_error_code() -> None:
    reference = render()
    missing = [m for m in [*METHODS, *NOTIFICATIONS] if f"| `{m}` |" not in reference]
    missing += [k for k in (c.__struct_config__.tag for c in typing.get_args(SessionItem))
                if f"#### `{k}`" not in reference]
    missing += [c for c in [*RPC_ERROR_CODES, *BUSINESS_CODES] if f"`{c}`" not in reference]
    assert missing == []


def test_every_type_the_reference_links_to_has_its_own_section() -> None:
    reference = render()
    linked = {part.split(")")[0] for part in reference.split("](#")[1:]}
    sections = {line[5:].strip().lower() for line in reference.splitlines() if line.startswith("#### ")}
    assert linked and linked <= sections, sorted(linked - sections)


def test_a_field_bound_shows_in_the_reference() -> None:
    # turn/send's content is bounded at 100,000 characters and its attachments at 10
    section = render().split("#### TurnSendParams", 1)[1].split("####", 1)[0]
    assert "| `content` | string (<= 100,000 chars) | yes |" in section
    assert "(<= 10) | no |" in section
