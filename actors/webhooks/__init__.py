"""Webhooks: an app's sessions' events announced to its URL, signed as Standard Webhooks does,
from the store's outbox (``eventstore/outbox.py``), at least once (docs/webhooks.md)."""
