"""``sessionloop trace SESSION``: the OpenTelemetry spans of a past session, rebuilt from its log.

The spans are the ones ``serve --otlp-endpoint`` exports live, ids and times included: both come
from one fold of the session's events (``actors/views/traces.py``). The output is OTLP/JSON, one
``ExportTraceServiceRequest`` on one line: the body a collector's ``/v1/traces`` takes with
``Content-Type: application/json``, and a line of the files its ``otlpjsonfile`` receiver reads.
The store is opened read-only, so this works while a server runs on the data directory.
"""

from __future__ import annotations

import json

import click

from sessionloop.actors.system.trace_export import otlp_json
from sessionloop.actors.views.traces import build_spans
from sessionloop.cli.session_log import data_option, open_store, read_session, session_id_of


@click.command("trace")
@click.argument("session")
@data_option
@click.option("-o", "--output", "output", type=click.Path(dir_okay=False, writable=True), default=None,
              metavar="FILE", help="Write the OTLP JSON to FILE (default: standard output).")
def trace(session: str, data_dir: str, output: str | None) -> None:
    """Write the spans of SESSION (each turn, model call and tool call, with the GenAI semantic
    conventions) as OTLP JSON, rebuilt from its event log. A turn still under way has no span
    yet. Needs the otel extra: pip install 'sessionloop[otel]'.

    \b
    Examples:
      sessionloop trace 18f3a2c0d41e5b7a90c1d > trace.json
      curl -H 'Content-Type: application/json' --data @trace.json http://127.0.0.1:4318/v1/traces
    """
    session_id = session_id_of(session)
    store = open_store(data_dir, session_id)
    try:
        recorded = read_session(store, data_dir, session_id)
    finally:
        store.close()
    spans = build_spans(session_id, (r.event for r in recorded))
    text = json.dumps(otlp_json(spans), ensure_ascii=False, separators=(",", ":"))
    if output is None:
        click.echo(text)
        return
    try:
        with open(output, "w", encoding="utf-8") as f:
            f.write(text + "\n")
    except OSError as e:
        raise click.ClickException(f"cannot write {output}: {e.strerror or e}") from e
    click.echo(f"{len(spans)} spans of session {session_id} written to {output}", err=True)
