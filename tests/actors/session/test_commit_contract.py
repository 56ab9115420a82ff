"""Decide, persist, publish (the session shell's contract, actors/session/actor.py): the state may
be evolved in place before the append, but when the append fails nothing of it is left: not in
the state, not in the listing, not in a push, not in a reply.

The failure is injected at ``before-commit`` (the events decided and folded into the working
state, the drive loop run, nothing written) and is the store's own refusal, StorageUnavailable.
"""

from __future__ import annotations

import json

import pytest

from sessionloop.eventstore import StorageUnavailable
from tests.actors.gateway_harness import MemoryClient


def trace(state) -> tuple:
    return (state.version, [(m.role, m.content) for m in state.messages], [q.turn_id for q in state.queue],
            state.current_turn, sorted(state.turns), state.title, state.status)


@pytest.mark.parametrize("command", ["send", "rename"])
def test_a_failed_append_leaves_no_trace_in_state_listing_pushes_or_replies(service, command) -> None:
    host, gateway = service(permission_mode="acceptCalls")
    session = host.create(title="contract")
    session.run("before")
    client = MemoryClient(gateway)
    client.result("session/subscribe", {"sessionId": session.id})
    before, listed = trace(session.snapshot()), [i for i in host.list() if i.id == session.id]
    version = host.store.stream_version(f"session-{session.id}")
    client.clear()

    host.rt.faults.arm("before-commit", StorageUnavailable("the event store is unavailable (injected)"))
    with pytest.raises(StorageUnavailable):
        if command == "send":
            session.send("lost input")  # evolves a queue entry and starts a turn in place
        else:
            session.rename("lost title")

    assert trace(session.snapshot()) == before
    assert host.store.stream_version(f"session-{session.id}") == version
    assert [i for i in host.list() if i.id == session.id] == listed
    # what comes next is pushed (the subscriber would have seen the failed commit's pushes before it)
    assert session.run("kept input").output_text == "echo: kept input"
    client.wait(lambda f: "echo: kept input" in json.dumps(f) and f.get("method") == "item/completed")
    seen = json.dumps(client.frames)
    assert "lost" not in seen
    assert "kept input" in seen
