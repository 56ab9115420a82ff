"""What one workload run of ``sessionloop bench`` writes (``--out FILE.json``) and what ``bench
compare`` and ``--fail-if`` read: the msgspec Structs of the results file. Its JSON Schema,
docs/bench-results.schema.json, is :func:`json_schema` (a test keeps the file in step).

Times are seconds since the run started (``*_s``) or milliseconds of latency (``*_ms``). A turn's
latency runs from its *intended* send time (open loop: the arrival the schedule drew, so a server
that falls behind is charged for the wait, as wrk2 measures) to the end of its turn. Each latency
block keeps its HDR histogram (microseconds, HdrHistogram's base64 encoding), so a reader can merge
phases or recompute any percentile.
"""

from __future__ import annotations

from typing import Literal

import msgspec

SCHEMA_ID = "sessionloop.bench/1"

#: the kinds of phase a workload has (docs/bench.md)
PhaseKind = Literal["ramp-up", "steady", "ramp-down"]


class Latency(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Percentiles of one latency histogram (ms); all 0.0 when ``count`` is 0."""

    count: int
    mean_ms: float
    p50_ms: float
    p90_ms: float
    p95_ms: float
    p99_ms: float
    p999_ms: float
    max_ms: float
    hdr: str  # the histogram in microseconds, HdrHistogram's encode() (base64, compressed)


class Counts(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """What happened to the sends of a phase (or of the whole run)."""

    sent: int  # sends made, duplicates included
    acknowledged: int  # sends the server acknowledged (a turn is owed for each distinct one)
    duplicates_sent: int  # sends made again with an idempotency key already used
    deduplicated: int  # of those, the ones the server answered as the same send (no new turn)
    turns: int  # turns that ended
    completed: int  # ... with an answer (outcome replied or silent)
    failed: int  # ... with a failure (the mock's !error, a model or tool failure)
    approvals: int  # tool calls the virtual owner approved or denied
    rejected: int  # back-pressure answers (rate limit, quota) waited out and retried
    errors: int  # requests that failed for good and turns that never ended (timeouts)


class Phase(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """One phase of the workload, or (``name`` "all", ``kind`` "steady") the whole run."""

    name: str
    kind: PhaseKind
    start_s: float
    end_s: float
    counts: Counts
    turns_per_s: float  # turns ended in the phase / its length
    latency: Latency  # intended send -> turn ended, for the turns that ended in the phase
    first_delta: Latency  # intended send -> first streamed delta, on watched sessions


class Sample(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """One interval of the timeline (``Result.interval_s`` long, ending at ``t_s``)."""

    t_s: float
    phase: str
    turns: int  # turns ended in the interval
    turns_per_s: float
    errors: int
    in_flight: int  # turns sent and not ended at the interval's end
    users: int  # virtual users (closed loop) or target arrival rate per s (open loop) at the end
    p50_ms: float | None  # None when no turn ended in the interval
    p95_ms: float | None
    p99_ms: float | None


class ErrorKind(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Errors of one kind: a client error class or a reason such as ``turn-timeout``."""

    kind: str
    count: int
    first_s: float
    example: str  # the first one's message (never a token: the client's errors carry none)


class Audit(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """The correctness audit over the event feed after the run."""

    acknowledged: int  # distinct acknowledged sends (idempotency keys)
    turns_found: int  # of those, the ones the feed shows exactly one turn for
    missing: int  # acknowledged sends the feed shows no turn for (lost)
    duplicated: int  # sends the feed shows more than one turn for
    duplicates_sent: int
    deduplicated: int  # duplicate sends that made no second turn
    examples: list[str]  # up to 20 lines naming the sessions and keys of what is wrong
    ok: bool


class Target(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """The deployment that was driven."""

    url: str  # tokens are never written here
    spawned: bool  # started by ``--spawn`` for this run
    server_version: str | None
    protocol_version: str | None


class Environment(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Where the load generator ran."""

    python: str
    platform: str
    cpus: int
    sessionloop: str  # the load generator's version


class Result(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """One run: the whole results file."""

    schema: str = SCHEMA_ID
    workload: str  # its name (a shipped one) or its file's name
    workload_toml: str  # the workload's text, so a run can be repeated
    overrides: list[str] = []  # the --set KEY=VALUE changes applied to it, in order
    seed: int
    target: Target
    environment: Environment
    started_at: str  # ISO 8601, UTC
    duration_s: float
    interval_s: float  # the timeline's interval
    phases: list[Phase]
    overall: Phase
    timeline: list[Sample]
    errors: list[ErrorKind]
    audit: Audit


#: what ``--fail-if`` and ``bench compare`` can name, and whether more of it is better
METRICS: dict[str, bool] = {
    "turns_per_s": True,
    "turns": True,
    "mean_ms": False,
    "p50_ms": False,
    "p90_ms": False,
    "p95_ms": False,
    "p99_ms": False,
    "p999_ms": False,
    "max_ms": False,
    "first_delta_p50_ms": False,
    "first_delta_p99_ms": False,
    "errors": False,
    "error_rate": False,
    "lost": False,
    "duplicated": False,
}


def metrics(result: Result) -> dict[str, float]:
    """The named figures of a run (over the whole run), as ``--fail-if`` and ``compare`` see them."""
    o = result.overall
    sent = max(o.counts.sent, 1)
    return {
        "turns_per_s": o.turns_per_s,
        "turns": float(o.counts.turns),
        "mean_ms": o.latency.mean_ms,
        "p50_ms": o.latency.p50_ms,
        "p90_ms": o.latency.p90_ms,
        "p95_ms": o.latency.p95_ms,
        "p99_ms": o.latency.p99_ms,
        "p999_ms": o.latency.p999_ms,
        "max_ms": o.latency.max_ms,
        "first_delta_p50_ms": o.first_delta.p50_ms,
        "first_delta_p99_ms": o.first_delta.p99_ms,
        "errors": float(o.counts.errors),
        "error_rate": o.counts.errors / sent,
        "lost": float(result.audit.missing),
        "duplicated": float(result.audit.duplicated),
    }


def load(path: str) -> Result:
    """Read a results file; msgspec.ValidationError names the field that is wrong."""
    with open(path, "rb") as f:
        return msgspec.json.decode(f.read(), type=Result)


def dump(result: Result, path: str) -> None:
    with open(path, "wb") as f:
        f.write(msgspec.json.format(msgspec.json.encode(result), indent=2))


def json_schema() -> dict[str, object]:
    return msgspec.json.schema(Result)


__all__ = ["METRICS", "SCHEMA_ID", "Audit", "Counts", "Environment", "ErrorKind", "Latency", "Phase",
           "PhaseKind", "Result", "Sample", "Target", "dump", "json_schema", "load", "metrics"]
