"""OpenTelemetry export of the spans :mod:`actors.views.traces` builds (the optional extra ``otel``).

Two ways out, one span tree:

* :class:`LiveTraces`, a commit listener of the runtime (``actors.system.ports.CommitListener``): each span goes
  to a span processor (``BatchSpanProcessor`` over an OTLP/HTTP exporter in ``serve
  --otlp-endpoint``, over the SDK's ``InMemorySpanExporter`` in tests) when the event that ends
  it has committed (persist, then publish);
* :func:`otlp_json`, the OTLP/JSON form of spans rebuilt from a stored log (``sessionloop
  trace``): an ``ExportTraceServiceRequest`` as the SDK's encoder makes it for the wire, mapped
  to JSON with the OTLP deviations from protobuf's mapping (trace and span ids in hex, enums
  as integers).

The actor never waits for tracing. The listener, on the session's thread, makes one
``put_nowait`` per commit onto a bounded queue. One tracing thread folds the commits, in commit
order per session, through a :class:`~actors.views.traces.SpanBuilder` per session with work open,
and hands finished spans to the processor, whose ``on_end`` only appends to its own bounded
queue (the SDK exports from its worker thread; a collector that hangs holds up that thread
alone). Two cases read the session's log, on the tracing thread (a short read of the local
store, the only I/O here):

* a session met mid-turn (its turn began before this process started): its earlier events are
  folded first, their spans not exported again;
* commits the full queue dropped (counted in ``dropped``): at the session's next traced commit
  its log is folded up to there and the spans that ended in the dropped commits are exported
  then, late but whole.

The SDK is imported when tracing is used, not when this module is (an optional dependency,
ARCHITECTURE rule 2); without it, :class:`TracingUnavailable` says which extra to install.
"""

from __future__ import annotations

import base64
import logging
import queue
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

from sessionloop.actors.errors import ActorError
from sessionloop.actors.system.ports import Commit
from sessionloop.actors.views.traces import SPAN_EVENTS, MissingHistory, SpanBuilder, SpanData
from sessionloop.eventstore import EventStore

__all__ = ["LiveTraces", "TracingUnavailable", "batch_processor", "otlp_exporter", "otlp_json", "sdk_spans"]

log = logging.getLogger("sessionloop.tracing")

SCOPE = "sessionloop"
SERVICE = "sessionloop"
#: commits waiting for the tracing thread; past it a commit's spans are dropped (never a wait)
DEFAULT_BACKLOG = 100_000
_EXTRA = "tracing needs the otel extra: pip install 'sessionloop[otel]'"


class TracingUnavailable(ActorError):
    """The OpenTelemetry packages of the ``otel`` extra are not installed."""

    code = "tracing-unavailable"


def _sdk() -> SimpleNamespace:
    """The parts of opentelemetry-sdk this module uses, imported on first use."""
    try:
        from opentelemetry.sdk.resources import Resource  # noqa: PLC0415
        from opentelemetry.sdk.trace import ReadableSpan  # noqa: PLC0415
        from opentelemetry.sdk.trace.export import BatchSpanProcessor  # noqa: PLC0415
        from opentelemetry.sdk.util.instrumentation import InstrumentationScope  # noqa: PLC0415
        from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode, TraceFlags  # noqa: PLC0415
    except ImportError as e:
        raise TracingUnavailable(_EXTRA) from e
    return SimpleNamespace(Resource=Resource, ReadableSpan=ReadableSpan, BatchSpanProcessor=BatchSpanProcessor,
                           InstrumentationScope=InstrumentationScope, SpanContext=SpanContext, SpanKind=SpanKind,
                           Status=Status, StatusCode=StatusCode, TraceFlags=TraceFlags)


# --- SpanData -> the SDK's spans ---------------------------------------------------------------------


class _Converter:
    """Makes the SDK's ``ReadableSpan`` of a :class:`SpanData`: the ids, times and parent are
    the span tree's own (the SDK's tracer would draw new ids and read the clock)."""

    def __init__(self) -> None:
        sdk = self.sdk = _sdk()
        resource = sdk.Resource.create()
        if str(resource.attributes.get("service.name", "")).startswith("unknown_service"):
            resource = resource.merge(sdk.Resource({"service.name": SERVICE}))  # OTEL_SERVICE_NAME wins
        self.resource = resource
        self.scope = sdk.InstrumentationScope(SCOPE)
        self.kinds = {"internal": sdk.SpanKind.INTERNAL, "client": sdk.SpanKind.CLIENT}

    def readable(self, span: SpanData) -> Any:
        sdk = self.sdk
        flags = sdk.TraceFlags(sdk.TraceFlags.SAMPLED if span.sampled else sdk.TraceFlags.DEFAULT)
        context = sdk.SpanContext(span.trace_id, span.span_id, is_remote=False, trace_flags=flags)
        parent = None if span.parent_id is None else \
            sdk.SpanContext(span.trace_id, span.parent_id, is_remote=span.remote_parent, trace_flags=flags)
        status = sdk.Status(sdk.StatusCode.ERROR, span.error) if span.error is not None else sdk.Status()
        return sdk.ReadableSpan(name=span.name, context=context, parent=parent, resource=self.resource,
                                attributes=span.attributes, kind=self.kinds[span.kind], status=status,
                                start_time=span.start_ns, end_time=span.end_ns, instrumentation_scope=self.scope)


def sdk_spans(spans: Iterable[SpanData]) -> list[Any]:
    """The SDK's ``ReadableSpan`` of each span (for an exporter's ``export``)."""
    convert = _Converter()
    return [convert.readable(s) for s in spans]


def otlp_json(spans: Sequence[SpanData]) -> dict[str, Any]:
    """``spans`` as one OTLP/JSON ``ExportTraceServiceRequest`` (the body an OTLP/HTTP collector
    takes with ``Content-Type: application/json``, one line of an OTLP JSON file)."""
    _sdk()
    try:
        from google.protobuf.json_format import MessageToDict  # noqa: PLC0415
        from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans  # noqa: PLC0415
    except ImportError as e:
        raise TracingUnavailable(_EXTRA) from e
    body: dict[str, Any] = MessageToDict(encode_spans(sdk_spans(spans)), use_integers_for_enums=True)
    for resource_spans in body.get("resourceSpans", []):
        for scope_spans in resource_spans.get("scopeSpans", []):
            for span in scope_spans.get("spans", []):
                _hex_ids(span)
                for link in span.get("links", []):
                    _hex_ids(link)
    return body


def _hex_ids(obj: dict[str, Any]) -> None:
    """OTLP/JSON: ids are hex strings, not protobuf's base64 of the bytes."""
    for key in ("traceId", "spanId", "parentSpanId"):
        if obj.get(key):
            obj[key] = base64.b64decode(obj[key]).hex()


# --- processors and exporters ------------------------------------------------------------------------


def batch_processor(exporter: Any) -> Any:
    """The SDK's ``BatchSpanProcessor`` over ``exporter`` (its queue and batch sizes follow the
    ``OTEL_BSP_*`` environment variables)."""
    return _sdk().BatchSpanProcessor(exporter)


def otlp_exporter(base_url: str) -> Any:
    """An OTLP/HTTP (protobuf) span exporter to ``base_url``/v1/traces: ``base_url`` means what
    ``OTEL_EXPORTER_OTLP_ENDPOINT`` means (headers, timeout, TLS and compression come from the
    exporter's own ``OTEL_EXPORTER_OTLP_*`` variables). Raises TracingUnavailable, ValueError."""
    if not base_url.startswith(("http://", "https://")):
        raise ValueError(f"--otlp-endpoint: expected an http:// or https:// URL, got {base_url[:100]!r}")
    _sdk()
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter  # noqa: PLC0415
    except ImportError as e:
        raise TracingUnavailable(_EXTRA) from e
    return OTLPSpanExporter(endpoint=f"{base_url.removesuffix('/')}/v1/traces")


# --- the live exporter -------------------------------------------------------------------------------


@dataclass
class _Tracked:
    builder: SpanBuilder
    next_version: int  # the stream version the next commit of the session must start at


_STOP = object()


class LiveTraces:
    """Exports each span of every session when the event that ends it commits (see the module
    docstring for the threads). Give :meth:`committed` to ``Host.open(listeners=...)``, so it
    hears the commits of sessions resuming at open too. ``close()`` stops listening, folds what
    is queued and shuts the processor down (which exports what it holds)."""

    def __init__(self, processor: Any, *, backlog: int = DEFAULT_BACKLOG) -> None:
        self._convert = _Converter()
        self._processor = processor
        self._closed = False
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=backlog)
        self._sessions: dict[str, _Tracked] = {}  # the tracing thread's alone
        #: session id -> the first version of a commit the full queue dropped (set on the
        #: session's thread, taken on the tracing thread)
        self._gaps: dict[str, int] = {}
        self.dropped = 0  # commits not queued because the queue was full
        self._warned_at = 0.0
        self._thread = threading.Thread(target=self._run, name="sessionloop-traces", daemon=True)
        self._thread.start()

    # --- on the session's thread --------------------------------------------------------------

    def committed(self, commit: Commit) -> None:
        """A commit listener (``actors.system.ports``): queue the commit, never wait."""
        events = commit.events
        if self._closed or not any(type(e) in SPAN_EVENTS for e in events):
            return
        first_version = commit.result.first_version
        try:
            self._queue.put_nowait((commit.log, commit.session_id, first_version, events))
        except queue.Full:
            self._gaps.setdefault(commit.session_id, first_version)
            self.dropped += 1
            now = time.monotonic()
            if now - self._warned_at > 60:
                self._warned_at = now
                log.warning("tracing is %d commits behind; %d commits were not traced",
                            self._queue.qsize(), self.dropped)

    # --- on the tracing thread ----------------------------------------------------------------

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is _STOP:
                return
            if isinstance(item, threading.Event):
                item.set()
                continue
            store, session_id, first_version, events = item
            try:
                self._trace(store, session_id, first_version, events)
            except Exception:  # tracing must never stop: forget the session, fold it anew next time
                log.exception("tracing session %s failed", session_id)
                self._sessions.pop(session_id, None)

    def _trace(self, store: EventStore, session_id: str, first_version: int, events: list[Any]) -> None:
        tracked = self._sessions.get(session_id)
        gap = self._gaps.pop(session_id, None)
        if gap is not None and gap > first_version:  # dropped after this one: for a later commit
            self._gaps.setdefault(session_id, gap)
            gap = None
        if tracked is not None and tracked.next_version != first_version:
            gap = min(gap or first_version, tracked.next_version)
        if gap is not None:  # commits were dropped: fold the log up to here, export what ended there
            tracked = self._from_log(store, session_id, first_version, export_from=gap)
        elif tracked is None:  # new in this process: from its first event, or lazily from its log
            tracked = _Tracked(SpanBuilder(session_id, complete=first_version == 1), first_version)
        try:
            spans = tracked.builder.feed_all(events)
        except MissingHistory:
            tracked = self._from_log(store, session_id, first_version)
            spans = tracked.builder.feed_all(events)
        tracked.next_version = first_version + len(events)
        if tracked.builder.idle:
            self._sessions.pop(session_id, None)
        else:
            self._sessions[session_id] = tracked
        for span in spans:
            self._processor.on_end(self._convert.readable(span))

    def _from_log(self, store: EventStore, session_id: str, first_version: int,
                  export_from: int | None = None) -> _Tracked:
        """A builder fed the session's stored events before ``first_version``. Their spans were
        exported when they ended (by this process or the one before it), but for those ending
        at ``export_from`` or later: those commits were dropped, their spans go out now."""
        builder = SpanBuilder(session_id)
        if first_version > 1:
            for recorded in store.read_stream(f"session-{session_id}", 1, limit=first_version - 1):
                spans = builder.feed(recorded.event)
                if export_from is not None and recorded.version >= export_from:
                    for span in spans:
                        self._processor.on_end(self._convert.readable(span))
        return _Tracked(builder, first_version)

    # --- control ------------------------------------------------------------------------------

    def flush(self, timeout: float = 10.0) -> bool:
        """Wait until every commit queued so far is folded and the processor exported its spans."""
        folded = threading.Event()
        try:
            self._queue.put(folded, timeout=timeout)
        except queue.Full:
            return False
        return folded.wait(timeout) and bool(self._processor.force_flush(int(timeout * 1000)))

    def close(self, timeout: float = 10.0) -> None:
        self._closed = True
        try:
            self._queue.put(_STOP, timeout=timeout)
        except queue.Full:
            log.warning("tracing: %d queued commits were not traced at shutdown", self._queue.qsize())
        else:
            self._thread.join(timeout)
        self._processor.shutdown()
