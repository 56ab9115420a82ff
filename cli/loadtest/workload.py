"""A workload of ``sessionloop bench --workload``: what the virtual users do, read from TOML
(docs/bench.md is the reference). A shipped one is named (``bots-steady``, ``burst``,
``long-sessions``, ``approvals``: the files of ``cli/loadtest/workloads/``), any other is a path.

    name = "bots-steady"
    seed = 1
    [sessions]
    turns = 20                                   # turns per session, then the user opens a new one
    think = { dist = "exponential", mean_ms = 200 }
    watched = 0.1                                # share of sessions an owner connection subscribes to
    duplicates = 0.02                            # share of sends made twice with the same idempotency key
    [[messages]]
    weight = 9
    text = "hello {n}"
    [[messages]]
    weight = 1
    text = '!tool list_files {"path": "."}'
    [[phases]]
    name = "ramp-up"
    kind = "ramp-up"
    seconds = 5
    users = 50                                   # closed loop; or rate = 40 (arrivals/s, open loop)

Every field has a bound; a file that breaks one is refused with the key that is wrong
(:class:`WorkloadError`), before anything is sent. ``--set KEY=VALUE`` changes one key first
(``sessions.turns=5``, ``phases.1.seconds=30``: a list item by its index from 0), the value read as
TOML (``5``, ``0.5``, ``"ask"``), or as a plain string when it is not TOML.
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Sequence
from importlib import resources
from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta

from sessionloop.protocol.limits import MAX_TEXT_CHARS

#: what a workload may ask for at most
MAX_USERS = 100_000
MAX_RATE = 100_000.0  # arrivals per second
MAX_PHASE_S = 7 * 86_400.0
MAX_PHASES = 50
MAX_MESSAGES = 100
MAX_TURNS = 1_000_000
MAX_DELAY_MS = 3_600_000.0
MAX_ATTACHMENT_BYTES = 1_000_000
MAX_CONNECTIONS = 10_000
MAX_FILE_BYTES = 1_000_000
MAX_SETS = 64

Name = Annotated[str, Meta(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9][A-Za-z0-9 ._-]*$")]
Share = Annotated[float, Meta(ge=0.0, le=1.0)]
DelayMs = Annotated[float, Meta(ge=0.0, le=MAX_DELAY_MS)]


class WorkloadError(ValueError):
    """The workload cannot be used; the message names the file and the key that is wrong."""


class Delay(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """A random delay: ``constant`` (always ``mean_ms``), ``exponential`` (mean ``mean_ms``),
    ``uniform`` (0 to twice ``mean_ms``), ``lognormal`` (median ``mean_ms``, spread ``sigma``)."""

    dist: Literal["constant", "exponential", "uniform", "lognormal"] = "constant"
    mean_ms: DelayMs = 0.0
    sigma: Annotated[float, Meta(ge=0.0, le=3.0)] = 0.5


class Message(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """One kind of message of the mix, picked by ``weight``. ``text`` is sent as it is (mock
    directives such as ``!tool``, ``!sleep MS``, ``!error TEXT``, or plain text for a real model),
    with ``{n}`` replaced by the turn's number in its session and ``{user}`` by the user's.
    ``approval``: the tool call it makes waits for an owner, and the virtual owner answers
    (``approve`` or ``deny``) after ``approval_delay``; it needs ``sessions.permission_mode = "ask"``
    and an owner token."""

    weight: Annotated[float, Meta(gt=0.0, le=1e6)] = 1.0
    text: Annotated[str, Meta(min_length=1, max_length=MAX_TEXT_CHARS)]
    approval: Literal["none", "approve", "deny"] = "none"
    approval_delay: Delay = msgspec.field(default_factory=Delay)


class Sessions(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """How a virtual user uses sessions."""

    turns: Annotated[int, Meta(ge=1, le=MAX_TURNS)] = 10  # per session, then a new one
    per_user: Annotated[int, Meta(ge=1, le=1_000)] = 1  # sessions a user keeps, taken in turn
    think: Delay = msgspec.field(default_factory=Delay)  # closed loop: after a turn ends, before the next send
    watched: Share = 0.0  # share of sessions an owner connection subscribes to (first-delta latency)
    duplicates: Share = 0.0  # share of sends made again with the same key (the server must answer "duplicate")
    attachments: Share = 0.0  # share of sends with one attachment
    attachment_bytes: Annotated[int, Meta(ge=1, le=MAX_ATTACHMENT_BYTES)] = 1_024
    permission_mode: Literal["ask", "acceptCalls", "deny"] = "acceptCalls"
    container: Annotated[str, Meta(min_length=1, max_length=64)] = "bench"  # declared in the app's manifest
    turn_timeout_s: Annotated[float, Meta(ge=1.0, le=3_600.0)] = 120.0  # a turn not ended by then is an error


class Phase(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """``users`` (closed loop: that many virtual users at the phase's end, changed linearly from
    the previous phase's count in a ramp) or ``rate`` (open loop: turns arriving per second, Poisson,
    changed linearly the same way); every phase of a workload uses the same one."""

    name: Name
    kind: Literal["ramp-up", "steady", "ramp-down"] = "steady"
    seconds: Annotated[float, Meta(gt=0.0, le=MAX_PHASE_S)]
    users: Annotated[int, Meta(ge=0, le=MAX_USERS)] | None = None
    rate: Annotated[float, Meta(ge=0.0, le=MAX_RATE)] | None = None


class ClientSettings(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """How the load generator connects: ``connections`` bot connections (users spread over them;
    default one per 10 users, at least 1), one owner connection per ``owner_sessions`` watched sessions."""

    connections: Annotated[int, Meta(ge=1, le=MAX_CONNECTIONS)] | None = None
    owner_sessions: Annotated[int, Meta(ge=1, le=10_000)] = 200
    interval_s: Annotated[float, Meta(ge=0.1, le=60.0)] = 1.0  # the timeline's interval
    drain_s: Annotated[float, Meta(ge=0.0, le=3_600.0)] = 30.0  # after the last phase: time for turns in flight


class MockClock(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """With ``--spawn``: the mock model's clock of the server started for the run (``serve --mock-*``)."""

    latency_ms: DelayMs = 0.0
    jitter: Literal["none", "lognormal", "uniform"] = "none"
    sigma: Annotated[float, Meta(ge=0.0, le=3.0)] = 0.5
    stream_tokens_per_s: Annotated[float, Meta(ge=0.0, le=1_000_000.0)] = 0.0


class Workload(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    name: Name
    description: Annotated[str, Meta(max_length=2_000)] = ""
    seed: Annotated[int, Meta(ge=0, le=2**63 - 1)] = 1
    sessions: Sessions = msgspec.field(default_factory=Sessions)
    messages: Annotated[list[Message], Meta(min_length=1, max_length=MAX_MESSAGES)]
    phases: Annotated[list[Phase], Meta(min_length=1, max_length=MAX_PHASES)]
    client: ClientSettings = msgspec.field(default_factory=ClientSettings)
    mock: MockClock = msgspec.field(default_factory=MockClock)

    @property
    def open_loop(self) -> bool:
        return self.phases[0].rate is not None

    @property
    def seconds(self) -> float:
        return sum(p.seconds for p in self.phases)

    @property
    def needs_owner(self) -> bool:
        """A virtual owner is needed: approvals to answer or sessions to watch."""
        return self.sessions.watched > 0 or any(m.approval != "none" for m in self.messages)


def shipped() -> list[str]:
    """The names of the workloads that come with sessionloop."""
    return sorted(f.name[:-5] for f in resources.files(__package__).joinpath("workloads").iterdir()
                  if f.name.endswith(".toml"))


def read_text(spec: str) -> tuple[str, str]:
    """(label, TOML text) of a shipped workload's name or a file's path."""
    if spec in shipped():
        return spec, resources.files(__package__).joinpath("workloads", f"{spec}.toml").read_text("utf-8")
    if not os.path.isfile(spec):
        raise WorkloadError(f"workload {spec!r}: no such file, and not a shipped workload "
                            f"({', '.join(shipped())})")
    if os.path.getsize(spec) > MAX_FILE_BYTES:
        raise WorkloadError(f"workload {spec}: larger than {MAX_FILE_BYTES:,} bytes")
    with open(spec, encoding="utf-8") as f:
        return os.path.basename(spec), f.read()


def parse_set(text: str) -> tuple[list[str], Any]:
    """``KEY=VALUE`` of ``--set``: the key's path and the value (TOML, else the text itself)."""
    key, sep, raw = text.partition("=")
    if not sep or not key.strip():
        raise WorkloadError(f"--set {text[:80]!r}: expected KEY=VALUE (e.g. sessions.turns=5)")
    path = [p.strip() for p in key.strip().split(".")]
    if any(not p for p in path) or len(path) > 4:
        raise WorkloadError(f"--set {key[:80]!r}: a key is names joined by dots (e.g. phases.0.seconds)")
    try:
        value = tomllib.loads(f"v = {raw.strip()}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw.strip()
    return path, value


def apply_set(doc: dict[str, Any], path: list[str], value: Any) -> None:
    node: Any = doc
    for i, part in enumerate(path[:-1]):
        where = ".".join(path[:i + 1])
        if isinstance(node, list):
            if not part.isdigit() or int(part) >= len(node):
                raise WorkloadError(f"--set {'.'.join(path)}: {where} is not an index of a list of {len(node)}")
            node = node[int(part)]
        elif isinstance(node, dict):
            node = node.setdefault(part, {})
        else:
            raise WorkloadError(f"--set {'.'.join(path)}: {'.'.join(path[:i])} is a value, not a table")
    last = path[-1]
    if isinstance(node, list):
        if not last.isdigit() or int(last) >= len(node):
            raise WorkloadError(f"--set {'.'.join(path)}: {last} is not an index of a list of {len(node)}")
        node[int(last)] = value
    elif isinstance(node, dict):
        node[last] = value
    else:
        raise WorkloadError(f"--set {'.'.join(path)}: {'.'.join(path[:-1])} is a value, not a table")


def parse(label: str, text: str, sets: Sequence[str] = ()) -> Workload:
    """The workload of a TOML text, with the ``--set`` changes applied, checked."""
    if len(sets) > MAX_SETS:
        raise WorkloadError(f"{len(sets)} --set options; at most {MAX_SETS}")
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise WorkloadError(f"workload {label}: not TOML: {e}") from None
    for item in sets:
        apply_set(doc, *parse_set(item))
    try:
        workload = msgspec.convert(doc, Workload)
    except msgspec.ValidationError as e:
        raise WorkloadError(f"workload {label}: {e}") from None
    check(label, workload)
    return workload


def check(label: str, w: Workload) -> None:
    """The rules that span fields."""
    for i, p in enumerate(w.phases):
        if (p.users is None) == (p.rate is None):
            raise WorkloadError(f"workload {label}: phases[{i}] ({p.name}) needs users (closed loop) or rate "
                                "(open loop), not both and not neither")
        if (p.rate is not None) != w.open_loop:
            raise WorkloadError(f"workload {label}: phases[{i}] ({p.name}) mixes an open loop (rate) and a closed "
                                "loop (users); every phase uses the same one")
    names = [p.name for p in w.phases]
    if len(set(names)) != len(names):
        raise WorkloadError(f"workload {label}: phases have the same name twice ({', '.join(names)})")
    if "all" in names:
        raise WorkloadError(f"workload {label}: a phase may not be named 'all' (the whole run is)")
    for i, m in enumerate(w.messages):
        if m.approval != "none" and w.sessions.permission_mode != "ask":
            raise WorkloadError(f"workload {label}: messages[{i}] waits for an approval, which needs "
                                f"sessions.permission_mode = \"ask\" (it is {w.sessions.permission_mode!r})")


def load(spec: str, sets: Sequence[str] = ()) -> tuple[Workload, str]:
    """The workload named or at ``spec`` and its text (kept in the results file)."""
    label, text = read_text(spec)
    return parse(label, text, list(sets)), text


__all__ = ["ClientSettings", "Delay", "Message", "MockClock", "Phase", "Sessions", "Workload", "WorkloadError",
           "apply_set", "load", "parse", "parse_set", "read_text", "shipped"]
