"""Idempotent appends: the receipt lives in the same transaction as the events it dedups."""

from __future__ import annotations

import threading
import time

import pytest

from sessionloop.eventstore import ANY_VERSION, IdempotencyClaim, IdempotencyConflict, request_hash
from tests.eventstore.union import Noted, open_test_store


def claim(key: str, body: dict, receipt: bytes = b"r") -> IdempotencyClaim:
    return IdempotencyClaim("app:bot", key, request_hash(body), receipt)


def accepted(i: str) -> Noted:
    return Noted(key=i, text="hi")


def test_a_repeat_returns_the_original_result_and_writes_nothing(store):
    first = store.append("session-a", [accepted("1")], 0, idempotency=claim("k", {"text": "hi"}, b"R1"))
    head = store.head_position
    again = store.append("session-a", [accepted("2")], ANY_VERSION, idempotency=claim("k", {"text": "hi"}, b"R2"))
    assert again.duplicate and not first.duplicate
    assert (again.first_position, again.last_version, again.receipt) == (first.first_position, 1, b"R1")
    assert store.head_position == head
    assert len(store.read_stream("session-a")) == 1


def test_a_repeat_with_a_different_body_is_a_conflict(store):
    store.append("session-a", [accepted("1")], 0, idempotency=claim("k", {"text": "hi"}))
    with pytest.raises(IdempotencyConflict) as info:
        store.append("session-a", [accepted("2")], 1, idempotency=claim("k", {"text": "bye"}))
    assert info.value.key == "k" and "different request" in str(info.value)
    assert store.stream_version("session-a") == 1


def test_the_request_hash_ignores_key_order():
    assert request_hash({"a": 1, "b": [1, {"x": 1, "y": 2}]}) == request_hash({"b": [1, {"y": 2, "x": 1}], "a": 1})
    assert request_hash({"a": 1}) != request_hash({"a": 2})


def test_a_duplicate_within_one_group_commit_is_caught(store):
    barrier = threading.Barrier(12)
    results = []

    def send(i: int) -> None:
        barrier.wait()
        results.append(store.append("session-a", [accepted(str(i))], ANY_VERSION,
                                    idempotency=claim("same", {"text": "hi"})))

    threads = [threading.Thread(target=send, args=(i,)) for i in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(not r.duplicate for r in results) == 1
    assert len({r.first_position for r in results}) == 1
    assert store.stream_version("session-a") == 1


def test_receipts_survive_a_reopen(store_path):
    with open_test_store(store_path, durability="sync") as s:
        s.append("session-a", [accepted("1")], 0, idempotency=claim("k", {"t": 1}, b"orig"))
    with open_test_store(store_path, durability="sync") as s:
        again = s.append("session-a", [accepted("1")], ANY_VERSION, idempotency=claim("k", {"t": 1}))
        assert again.duplicate and again.receipt == b"orig"
        assert s.get_receipt("app:bot", "k").receipt == b"orig"
        assert s.get_receipt("app:bot", "other") is None


def test_long_keys_up_to_512_characters_work(store):
    key = "é" * 512  # 1 KiB of UTF-8: beyond LMDB's key limit, so the index hashes it
    store.append("session-a", [accepted("1")], 0, idempotency=claim(key, {}))
    assert store.append("session-a", [accepted("1")], ANY_VERSION, idempotency=claim(key, {})).duplicate


def test_same_key_in_another_scope_is_independent(store):
    store.append("session-a", [accepted("1")], 0, idempotency=IdempotencyClaim("app:one", "k", "h"))
    result = store.append("session-b", [accepted("1")], 0, idempotency=IdempotencyClaim("app:two", "k", "h"))
    assert not result.duplicate


def test_the_index_is_rebuilt_by_replaying_the_log(store):
    store.append("session-a", [accepted("1")], 0, idempotency=claim("k1", {"t": 1}, b"one"))
    store.append("session-b", [accepted("2")], 0, idempotency=claim("k2", {"t": 2}, b"two"))
    assert store.rebuild_idempotency() == 2
    assert store.get_receipt("app:bot", "k1").receipt == b"one"
    assert store.append("session-b", [accepted("3")], ANY_VERSION, idempotency=claim("k2", {"t": 2})).duplicate


def test_expired_receipts_are_pruned(store_path):
    with open_test_store(store_path, durability="nosync", idempotency_ttl_s=0, prune_interval_s=0) as s:
        s.append("session-a", [accepted("1")], 0, idempotency=claim("k", {"t": 1}))

        time.sleep(0.01)
        s.append("session-b", [accepted("2")], 0)  # a later commit runs the pruning slice
        assert s.get_receipt("app:bot", "k") is None
        assert not s.append("session-a", [accepted("1")], ANY_VERSION, idempotency=claim("k", {"t": 1})).duplicate
