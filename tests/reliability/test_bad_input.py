"""RELIABILITY frame_fuzz / jsonrpc_conformance, on a real server: hypothesis-generated frames each
get exactly one valid JSON-RPC reply, nothing is written, and another connection keeps being
served with normal latency."""

from __future__ import annotations

import asyncio
import json
import statistics
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.conftest import store_head
from tests.e2e.conftest import initialized, open_client

pytestmark = pytest.mark.e2e

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=False) | st.text(max_size=30),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=20,
)
methods = st.sampled_from(["initialize", "turn/send", "sessions/list", "session/rename", "loop/send", "nope",
                           "session/subscribe", "approval/respond", "background/output", ""]) | st.text(max_size=20)
requests = st.fixed_dictionaries({"jsonrpc": st.sampled_from(["2.0", "1.0", 2]),
                                  "id": st.integers(0, 10**6) | st.text(max_size=8),
                                  "method": methods, "params": json_values})
frames = st.one_of(
    requests.map(json.dumps),
    json_values.map(json.dumps),
    st.text(max_size=200),
    st.binary(max_size=200).map(lambda b: b.decode("latin-1")),
    st.integers(1, 3000).map(lambda n: "[" * n + "]" * n),
    st.integers(1, 3000).map(lambda n: '{"a":' * n + "1" + "}" * n),
    st.just('{"jsonrpc":"2.0","id":1,"method":"sessions/list","params":{"limit":1e999}}'),
    st.just('{"jsonrpc":"2.0","id":1,"id":2,"method":"sessions/list","params":{}}'),
    st.just('{"jsonrpc":"2.0","id":7,"method":"turn/send","params":{"sessionId":"x","content":NaN}}'),
)


def generated_frames(count: int = 3000) -> list[str]:
    """Frames drawn by hypothesis (derandomized: the same corpus every run)."""
    out: list[str] = []

    @settings(max_examples=count, deadline=None, suppress_health_check=list(HealthCheck), database=None,
              derandomize=True)
    @given(frames)
    def collect(frame: str) -> None:
        out.append(frame)

    collect()
    return out


def test_fuzzed_frames_get_one_valid_reply_each_write_nothing_and_others_are_unaffected(server):
    corpus = generated_frames()
    latencies: list[float] = []
    store_path = f"{server.data_dir}/store"

    async def main():
        async with open_client(server) as fuzz_ws, open_client(server) as good_ws:
            await initialized(fuzz_ws)
            good = await initialized(good_ws)
            sid = (await good.result("session/create", {}))["session"]["id"]
            before = store_head(store_path)
            answered = []
            for i, frame in enumerate(corpus):
                await fuzz_ws.send(frame)
                answered.append(json.loads(await asyncio.wait_for(fuzz_ws.recv(), 10)))
                if i % 20 == 0:
                    t = time.perf_counter()
                    await good.result("session/rename", {"sessionId": sid, "title": f"t{i}"})
                    latencies.append(time.perf_counter() - t)
            return answered, before, store_head(store_path)

    answered, before, after = asyncio.run(main())
    assert len(answered) == len(corpus)
    assert all(r.get("jsonrpc") == "2.0" and ("result" in r or "error" in r) for r in answered)
    # the fuzzing connection wrote nothing: only the good connection's renames are new
    assert after - before == len(latencies)
    assert statistics.median(latencies) < 0.1


