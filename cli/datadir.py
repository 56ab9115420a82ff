"""The files of a data directory that ``serve`` makes before anything serves: the owner token."""

from __future__ import annotations

import os
import secrets

TOKEN_FILE = "token"


def read_or_create_token(data_dir: str) -> tuple[str, bool]:
    """The owner token of ``data_dir`` (file mode 0600), generated on first start: (token, new)."""
    path = os.path.join(data_dir, TOKEN_FILE)
    try:
        with open(path) as f:
            token = f.read().strip()
        if token:
            return token, False
    except FileNotFoundError:
        pass
    os.makedirs(data_dir, exist_ok=True)
    token = secrets.token_urlsafe(32)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(token + "\n")
    return token, True
