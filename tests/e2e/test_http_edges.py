"""The HTTP edges of a real server that strangers can reach (SPEC §7): ambiguous headers, the
Origin rule against DNS rebinding, who may read /metrics, password guessing, and app tokens."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.conftest import REPO
from tests.e2e.conftest import APPS, TOKEN

pytestmark = pytest.mark.e2e


def serve_with_apps(tmp_path, apps: str) -> subprocess.CompletedProcess[str]:
    data = tmp_path / "data"
    os.makedirs(data, exist_ok=True)
    (data / "apps.toml").write_text(apps)
    return subprocess.run([sys.executable, "-m", "cli.main", "serve", "--data", str(data), "--port", "0",
                           "--token", TOKEN], capture_output=True, text=True, timeout=60, cwd=REPO)


def test_an_app_token_shorter_than_32_characters_stops_serve_with_one_line_naming_the_app(tmp_path):
    apps = APPS + '\n[apps.shortbot]\ntoken = "only-31-characters-long-token.."\nplatform = "x"\n'
    assert len("only-31-characters-long-token..") == 31
    done = serve_with_apps(tmp_path, apps)
    lines = done.stderr.strip().splitlines()
    assert done.returncode != 0 and done.stdout == ""
    assert len(lines) == 1 and "[apps.shortbot]" in lines[0] and "31 characters" in lines[0], done.stderr
    assert "only-31" not in done.stderr  # the token itself is never printed
