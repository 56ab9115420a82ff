"""What one ``sessionloop bench`` run is (``cli/bench_cmd.py``): its configuration and flags, the
mock model's clock they set (``actors/model/mock.py``: latency, jitter, streaming rate, seed),
and the turns each session sends (plain and tool turns, spread evenly).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import click

from sessionloop.actors.model.base import ModelError
from sessionloop.actors.model.mock import DEFAULT_SIGMA, JITTERS, MockClock
from sessionloop.cli.bench_observers import OBSERVE_MODES

PLAIN_TEXT, PLAIN_ANSWER = "hello world", "echo: hello world"
TOOL_TEXT, TOOL_ANSWER = '!tool list_files {"path": "."}', "done: 1 tool calls"
EXPECTED = {PLAIN_TEXT: PLAIN_ANSWER, TOOL_TEXT: TOOL_ANSWER}

F = TypeVar("F", bound=Callable[..., Any])


@dataclass
class BenchConfig:
    sessions: int = 100
    turns: int | None = 10  # per session; None: until ``duration_s``
    concurrency: int | None = None  # turns in flight at most; None: one per session
    tool_ratio: float = 0.5
    via: str = "inprocess"
    durability: str = "sync"
    llm_latency_ms: float = 0.0
    latency_jitter: str = "none"  # the mock's clock (actors/model/mock.py): how the latency varies
    latency_sigma: float = DEFAULT_SIGMA
    stream_tokens_per_s: float = 0.0
    seed: int | None = None
    duration_s: float | None = None
    data_dir: str | None = None
    per_connection: int | None = None  # None: auto (see :func:`sessions_per_connection`)
    turn_timeout_s: float = 60.0
    max_live: int | None = None
    progress: bool = True
    observe: str = "subscriber"  # in process: who watches the turns stream (cli.bench_observers)

    def validate(self) -> None:
        if self.sessions < 1:
            raise click.BadParameter("must be at least 1", param_hint="--sessions")
        if self.turns is not None and self.turns < 1:
            raise click.BadParameter("must be at least 1", param_hint="--turns")
        if self.turns is None and self.duration_s is None:
            raise click.BadParameter("give --turns, --duration or both", param_hint="--turns")
        if self.concurrency is not None and self.concurrency < 1:
            raise click.BadParameter("must be at least 1", param_hint="--concurrency")
        if not 0.0 <= self.tool_ratio <= 1.0:
            raise click.BadParameter("must be between 0 and 1", param_hint="--tool-ratio")
        if self.llm_latency_ms < 0:
            raise click.BadParameter("must be >= 0", param_hint="--llm-latency")
        try:
            MockClock(**self.model_options())
        except ModelError as e:  # names the option: latency_ms is --llm-latency, the others their flag
            raise click.BadParameter(str(e), param_hint=_clock_flag(str(e))) from None
        if self.duration_s is not None and self.duration_s <= 0:
            raise click.BadParameter("must be > 0", param_hint="--duration")
        if self.per_connection is not None and self.per_connection < 1:
            raise click.BadParameter("must be at least 1", param_hint="--per-connection")
        if self.observe not in OBSERVE_MODES:
            raise click.BadParameter(f"one of {', '.join(OBSERVE_MODES)}", param_hint="--observe")
        if self.via == "ws" and self.observe != "subscriber":
            raise click.BadParameter("with --via ws the WebSocket clients are the subscribers", param_hint="--observe")

    def model_options(self) -> dict[str, Any]:
        """The mock's options (``HostOptions.model_options``): its clock."""
        return {"latency_ms": self.llm_latency_ms, "latency_jitter": self.latency_jitter,
                "latency_sigma": self.latency_sigma, "stream_tokens_per_s": self.stream_tokens_per_s,
                "seed": self.seed}


def _clock_flag(problem: str) -> str:
    for option, flag in (("latency_jitter", "--latency-jitter"), ("latency_sigma", "--latency-sigma"),
                         ("stream_tokens_per_s", "--stream-tokens-per-s"), ("seed", "--seed")):
        if problem.startswith(f"mock: {option}"):
            return flag
    return "--llm-latency"


def sessions_per_connection(cfg: BenchConfig) -> int:
    """``--per-connection``, or by default enough connections (up to 50 sessions each, at least 20
    connections when there are sessions for them) that the server's per-connection request rate
    limit (100 requests/s, burst 200; one request per turn) is not what the run measures."""
    return cfg.per_connection or max(1, min(50, cfg.sessions // 20))


def is_tool_turn(ratio: float, session_index: int, turn_index: int) -> bool:
    """Tool turns spread evenly over the sessions in flight and over each session's turns: turn
    ``t`` of session ``s`` is a tool turn when ``floor((k + 1) * ratio) - floor(k * ratio)`` is 1
    for ``k = s + t``. The sessions of one round take consecutive ``k``, and so do the turns of
    one session, so each gets its share within one: at ratio 0.5 the turns of a round alternate
    and so does every session, whatever the session count. (A tool turn costs about three plain
    ones: giving every session its tool turns at the same turn index would offer bursts of tool
    turns, then of plain ones, instead of a steady mix.)"""
    k = session_index + turn_index
    return int((k + 1) * ratio + 1e-9) - int(k * ratio + 1e-9) == 1


#: the mock clock's flags, as ``bench`` shows them
_CLOCK_OPTIONS = [
    click.option("--llm-latency", "llm_latency_ms", default=0.0, show_default=True, type=float,
                 help="Mock model delay per call in ms, before the first token (to model a real provider; the "
                      "median with --latency-jitter)."),
    click.option("--latency-jitter", type=click.Choice(list(JITTERS)), default="none", show_default=True,
                 help="How the delay varies: none, lognormal (median --llm-latency, spread --latency-sigma) or "
                      "uniform (0 to twice --llm-latency)."),
    click.option("--latency-sigma", default=DEFAULT_SIGMA, show_default=True, type=float,
                 help="Sigma of the lognormal jitter (0 to 3)."),
    click.option("--stream-tokens-per-s", default=0.0, show_default=True, type=float,
                 help="Stream each answer at N tokens/s (a token is 4 characters); 0: as fast as they come."),
    click.option("--seed", default=None, type=int, help="Seed of the jitter's random generator (repeatable runs)."),
]


def mock_clock_options(command: F) -> F:
    """The flags of the mock model's clock (``--llm-latency``, ``--latency-jitter``,
    ``--latency-sigma``, ``--stream-tokens-per-s``, ``--seed``), in this order in ``--help``;
    :meth:`BenchConfig.model_options` hands them to the mock."""
    for option in reversed(_CLOCK_OPTIONS):
        command = option(command)
    return command


__all__ = ["EXPECTED", "PLAIN_ANSWER", "PLAIN_TEXT", "TOOL_ANSWER", "TOOL_TEXT", "BenchConfig", "is_tool_turn",
           "mock_clock_options", "sessions_per_connection"]
