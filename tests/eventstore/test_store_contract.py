"""A hypothesis state machine drives the store against a dict model, reopening it on the way."""

from __future__ import annotations

import shutil
import tempfile

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from sessionloop.eventstore import WrongExpectedVersion
from tests.eventstore.union import Stepped, open_test_store

STREAMS = [f"session-{n}" for n in ("a", "b", "ab", "c")]


class StoreModel(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.dir = tempfile.mkdtemp()
        self.store = open_test_store(self.dir, durability="nosync")
        self.model: dict[str, list[str]] = {s: [] for s in STREAMS}
        self.log: list[tuple[str, str]] = []
        self.counter = 0

    def teardown(self) -> None:
        self.store.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    @rule(stream=st.sampled_from(STREAMS), n=st.integers(1, 5), right=st.booleans())
    def append(self, stream: str, n: int, right: bool) -> None:
        ids = [f"e{self.counter + i}" for i in range(n)]
        self.counter += n
        expected = len(self.model[stream]) if right else len(self.model[stream]) + 1
        try:
            self.store.append(stream, [Stepped(step=i) for i in ids], expected)
        except WrongExpectedVersion:
            assert not right
            return
        assert right
        self.model[stream].extend(ids)
        self.log.extend((stream, i) for i in ids)

    @rule()
    def reopen(self) -> None:
        self.store.close()
        self.store = open_test_store(self.dir, durability="nosync")

    @precondition(lambda self: self.log)
    @rule(data=st.data(), stream=st.sampled_from(STREAMS))
    def read_a_slice(self, data: st.DataObject, stream: str) -> None:
        start = data.draw(st.integers(1, len(self.model[stream]) + 2))
        limit = data.draw(st.integers(1, 6))
        got = [e.event.step for e in self.store.read_stream(stream, start, limit)]
        assert got == self.model[stream][start - 1:start - 1 + limit]

    @invariant()
    def streams_and_log_match_the_model(self) -> None:
        for stream, ids in self.model.items():
            assert self.store.stream_version(stream) == len(ids)
            assert [e.event.step for e in self.store.read_stream(stream)] == ids
        all_events = list(self.store.iter_all(0, page=3))
        assert [(e.stream, e.event.step) for e in all_events] == self.log
        assert self.store.head_position == len(self.log)


TestStoreAgainstModel = StoreModel.TestCase
TestStoreAgainstModel.settings = settings(max_examples=40, stateful_step_count=25, deadline=None)
