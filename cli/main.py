"""Entry point of the ``sessionloop`` command: one click group, one module per command family."""

from __future__ import annotations

import importlib

import click

from sessionloop.eventstore.errors import SessionloopError

#: Commands are imported when used: ``serve`` does not load the client, and the client does not
#: load the server (click's documented lazy-loading pattern).
COMMANDS: dict[str, str] = {
    "serve": "sessionloop.cli.serve:serve",
    "chat": "sessionloop.cli.chat:chat",
    "sessions": "sessionloop.cli.sessions_cmd:sessions",
    "watch": "sessionloop.cli.sessions_cmd:watch",
    "send": "sessionloop.cli.sessions_cmd:send",
    "tasks": "sessionloop.cli.tasks_cmd:tasks",
    "replay": "sessionloop.cli.replay_cmd:replay",
    "rerun": "sessionloop.cli.rerun_cmd:rerun",
    "events": "sessionloop.cli.events_cmd:events",
    "import": "sessionloop.cli.events_cmd:import_events",
    "trace": "sessionloop.cli.trace_cmd:trace",
    "bench": "sessionloop.cli.bench_cmd:bench",
    "doctor": "sessionloop.cli.doctor:doctor",
    "compact": "sessionloop.cli.maintenance:compact",
    "backup": "sessionloop.cli.maintenance:backup",
    "schema": "sessionloop.cli.schema_cmd:schema",
    "webhooks": "sessionloop.cli.webhooks_cmd:webhooks",
}


class CleanErrors(click.Group):
    """Every error a user can cause becomes one clear line on stderr and a non-zero exit."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        target = COMMANDS.get(name)
        if target is None:
            return None
        module, attr = target.split(":")
        command = getattr(importlib.import_module(module), attr)
        assert isinstance(command, click.Command)
        return command

    def invoke(self, ctx: click.Context) -> object:
        try:
            return super().invoke(ctx)
        except SessionloopError as e:
            raise click.ClickException(str(e)) from e


@click.group(cls=CleanErrors, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="sessionloop")
def main() -> None:
    """sessionloop: a server that hosts LLM-agent sessions as event-sourced actors.

    \b
    Example:
      sessionloop serve --data ./.sessionloop
    """


if __name__ == "__main__":  # pragma: no cover
    main()
