"""``serve --webhook-*``: how the server delivers the apps' webhooks (``WebhookOptions``)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import click

from sessionloop.actors.webhooks.config import WebhookOptions, parse_networks

__all__ = ["webhook_options"]

_D = WebhookOptions()


def webhook_options(f: Callable[..., Any]) -> Callable[..., Any]:
    """Add the ``--webhook-*`` options to ``serve``; it receives them as ``webhooks: WebhookOptions``."""

    @click.option("--webhook-allow-net", "webhook_allow", multiple=True, metavar="CIDR",
                  help="A private, loopback or link-local network webhooks may be delivered to (repeatable), "
                       "e.g. 127.0.0.1/32 or 10.0.0.0/8; without it such targets are refused.")
    @click.option("--webhook-retry-first", default=_D.retry_first_s, show_default=True,
                  type=click.FloatRange(min=0.01), help="Seconds before a failed delivery is tried again; each "
                                                         "later wait doubles.")
    @click.option("--webhook-retry-max-delay", default=_D.retry_max_delay_s, show_default=True,
                  type=click.FloatRange(min=0.01), help="The longest wait between two attempts, seconds.")
    @click.option("--webhook-retry-window", default=_D.retry_window_s, show_default=True,
                  type=click.FloatRange(min=0.01),
                  help="Seconds after its commit (or replay) a delivery is tried for; then it is a dead letter.")
    @click.option("--webhook-timeout", default=_D.timeout_s, show_default=True, type=click.FloatRange(min=0.01),
                  help="Seconds one attempt may take (connect, send, the receiver's answer).")
    @click.option("--webhook-concurrency", default=_D.concurrency, show_default=True, type=click.IntRange(min=1),
                  help="Deliveries in flight at once (each app gets at most a quarter of them, at least 1).")
    @functools.wraps(f)
    def wrapper(*args: Any, webhook_allow: tuple[str, ...], webhook_retry_first: float,
                webhook_retry_max_delay: float, webhook_retry_window: float, webhook_timeout: float,
                webhook_concurrency: int, **kwargs: Any) -> Any:
        try:
            parse_networks(list(webhook_allow))
        except ValueError as e:
            raise click.BadParameter(str(e), param_hint="--webhook-allow-net") from e
        options = WebhookOptions(allow_networks=list(webhook_allow), retry_first_s=webhook_retry_first,
                                 retry_max_delay_s=webhook_retry_max_delay, retry_window_s=webhook_retry_window,
                                 timeout_s=webhook_timeout, concurrency=webhook_concurrency,
                                 per_target=max(1, webhook_concurrency // 4))
        return f(*args, webhooks=options, **kwargs)

    return wrapper
