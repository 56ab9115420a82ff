"""A bot over the wire with the synchronous client: one room, one message, its answer, and the
events of the turn. The example of docs/bots.md ("Over the wire") as a file.

    SESSIONLOOP_TOKEN=<the app's token> python examples/bot.py [URL]

The app needs a container ``inbox`` in ``DATA/apps.toml`` (docs/bots.md, "Declare the app").
"""

from __future__ import annotations

import os
import sys

from sessionloop.client import Client, Conflict


def main(url: str, token: str) -> str:
    with Client(url, token) as bot:                      # connects, initializes; reconnects by itself
        s = bot.create(container_id="inbox", title="Chat with Alice")
        receipt = bot.send(s.session_id, "What is the weather?", idempotency_key="msg-123")
        # receipt.state: accepted | queued | duplicate (this key was seen: its turn) | rejected
        result = bot.wait_for_turn(s.session_id, receipt.turn_id, timeout_ms=60_000)
        try:
            bot.send(s.session_id, "another text", idempotency_key="msg-123")
        except Conflict as e:                            # typed errors: e.code, e.data, e.retry_after_ms
            print("refused:", e.code)
        for event in bot.list_events(session_id=s.session_id).events:
            print(event.cursor, event.type)
        return result.output_text or result.state


if __name__ == "__main__":
    token = os.environ.get("SESSIONLOOP_TOKEN") or sys.exit("set SESSIONLOOP_TOKEN to the app's token")
    print(main(sys.argv[1] if len(sys.argv) > 1 else "ws://127.0.0.1:8765/session", token))
