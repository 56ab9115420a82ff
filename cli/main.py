"""Entry point of the ``sessionloop`` command: one click group, one module per command family."""

from __future__ import annotations

import click

from eventstore.errors import SessionloopError


class CleanErrors(click.Group):
    """Every error a user can cause becomes one clear line on stderr and a non-zero exit."""

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


def _register() -> None:
    from .bench_cmd import bench
    from .chat import chat
    from .replay_cmd import events, import_events, replay, rerun
    from .serve import serve
    from .sessions_cmd import send, sessions, watch
    from .tasks_cmd import tasks

    main.add_command(serve)
    main.add_command(replay)
    main.add_command(rerun)
    main.add_command(events)
    main.add_command(import_events)
    main.add_command(chat)
    main.add_command(sessions)
    main.add_command(watch)
    main.add_command(send)
    main.add_command(tasks)
    main.add_command(bench)


_register()

if __name__ == "__main__":  # pragma: no cover
    main()
