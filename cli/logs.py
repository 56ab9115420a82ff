"""How ``serve`` logs: the standard ``logging`` module, text or JSON lines on stderr, and no secret
in any line.

``configure(level, fmt, secrets)`` installs one stderr handler on the root logger. Its formatter
replaces every secret it is told of in the whole formatted line (message, arguments, traceback)
with ``[redacted]``: the owner token, the app tokens (``secrets`` is called for each line, so a
SIGHUP reload's new tokens count at once) and the values of environment variables whose names
say they hold one (``*_KEY``, ``*_TOKEN``, ``*_SECRET``, ``*_PASSWORD``: API keys are named by
variable in the model configuration, never written in a file). The code does not log secrets; this
is the second line of defence, for a message that quotes a request or an exception.
"""

from __future__ import annotations

import json
import logging
import os
import re
import sys
from collections.abc import Callable, Iterable
from typing import Final

LEVELS: Final = ("debug", "info", "warning", "error")
FORMATS: Final = ("text", "json")
REDACTED: Final = "[redacted]"
_SECRET_NAME = re.compile(r"(KEY|TOKEN|SECRET|PASSWORD)$", re.IGNORECASE)
_MIN_SECRET: Final = 8  # shorter values would redact ordinary words

Secrets = Callable[[], Iterable[str]]


def env_secrets(environ: dict[str, str] | None = None) -> list[str]:
    """The values of environment variables whose names say they hold a secret."""
    env = os.environ if environ is None else environ
    return [v for k, v in env.items() if _SECRET_NAME.search(k) and len(v) >= _MIN_SECRET]


def redact(text: str, secrets: Iterable[str]) -> str:
    for secret in sorted({s for s in secrets if len(s) >= _MIN_SECRET}, key=len, reverse=True):
        text = text.replace(secret, REDACTED)
    return text


class _Redacting(logging.Formatter):
    """A formatter whose every line has the secrets replaced (text: ``time LEVEL logger: message``)."""

    def __init__(self, secrets: Secrets) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")
        self._secrets = secrets
        self._env = env_secrets()

    def format(self, record: logging.LogRecord) -> str:
        return redact(self.render(record), [*self._env, *self._secrets()])

    def render(self, record: logging.LogRecord) -> str:
        return super().format(record)


class _JsonLines(_Redacting):
    """One JSON object a line: ``{"time", "level", "logger", "message"[, "exception"]}``."""

    def render(self, record: logging.LogRecord) -> str:
        out = {"time": self.formatTime(record), "level": record.levelname, "logger": record.name,
               "message": record.getMessage()}
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return json.dumps(out, ensure_ascii=False)


def configure(level: str = "info", fmt: str = "text", secrets: Secrets = lambda: ()) -> None:
    """Log at ``level`` and above to stderr as ``fmt``; raises ValueError for an unknown one."""
    if level not in LEVELS or fmt not in FORMATS:
        raise ValueError(f"log level must be one of {', '.join(LEVELS)} and format one of {', '.join(FORMATS)}")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_JsonLines(secrets) if fmt == "json" else _Redacting(secrets))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())
    for noisy in ("websockets", "httpx", "httpcore", "openai"):  # their INFO lines are per request
        logging.getLogger(noisy).setLevel(max(logging.WARNING, root.level))


__all__ = ["FORMATS", "LEVELS", "REDACTED", "configure", "env_secrets", "redact"]
