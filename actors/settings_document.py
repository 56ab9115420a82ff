"""The host configuration document ``<data>/config.toml`` (seed 004): the TOML file that holds
the session-setting values of the global (the plugins' configuration), platform and
platformType layers::

    [plugins.<plugin>]
    [sessionSettings.platform.<platform>.<plugin>]
    [sessionSettings.platformType.<platform>.<type>.<plugin>]

The same file holds the named models, ``[models.NAME]``, read by :mod:`actors.model.registry`
at start (and on a reload), never written here: a settings write keeps them, as every other key.

:class:`ConfigDocument` re-reads it when it changed on disk and writes it whole and atomically
(temp file, fsync, rename), keeping every other key; a failed or refused save (no write bit on
the file) is answered with the ``unsaved`` sentence, not raised. :func:`dump_toml` is the TOML
writer (tomllib only reads); :func:`layer_path` says where a layer keeps a plugin's values.
"""

from __future__ import annotations

import logging
import math
import os
import re
import tempfile
import tomllib
from collections.abc import Iterable, Mapping
from typing import Any

from protocol.schemas_types import PlatformLayer, PlatformTypeLayer

from .settings_context import Ident, Layer
from .settings_texts import text

log = logging.getLogger("sessionloop.settings")


# --- the host configuration document --------------------------------------------------------------

_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")


def _toml_str(s: str) -> str:
    out = []
    for ch in s:
        if ch in '"\\':
            out.append("\\" + ch)
        elif ch == "\n":
            out.append("\\n")
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def _toml_key(key: str) -> str:
    return key if _BARE_KEY.fullmatch(key) else _toml_str(key)


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return repr(v) if math.isfinite(v) else ("nan" if math.isnan(v) else ("inf" if v > 0 else "-inf"))
    if isinstance(v, str):
        return _toml_str(v)
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{ " + ", ".join(f"{_toml_key(str(k))} = {_toml_value(x)}" for k, x in v.items()) + " }"
    if hasattr(v, "isoformat"):  # dates and times read by tomllib
        return str(v.isoformat())
    raise TypeError(f"cannot write {type(v).__name__} to TOML")


def dump_toml(doc: Mapping[str, Any]) -> str:
    """A TOML text for ``doc`` (what tomllib reads back as the same dict)."""
    lines: list[str] = []

    def table(path: list[str], d: Mapping[str, Any]) -> None:
        scalars = [(k, v) for k, v in d.items() if not isinstance(v, dict)]
        subs = [(k, v) for k, v in d.items() if isinstance(v, dict)]
        if path and (scalars or not subs):
            lines.append("[" + ".".join(_toml_key(p) for p in path) + "]")
        lines.extend(f"{_toml_key(k)} = {_toml_value(v)}" for k, v in scalars)
        if scalars or (path and not subs):
            lines.append("")
        for k, v in subs:
            table([*path, k], v)

    table([], doc)
    return "\n".join(lines).rstrip("\n") + "\n"


class ConfigDocument:
    """``<data>/config.toml``: read when it changed on disk, written whole and atomically."""

    def __init__(self, path: str, language: str = "en") -> None:
        self.path = path
        self.language = language
        self.doc: dict[str, Any] = {}
        self._signature: tuple[int, int, int] | None = None
        self.refresh()

    def _stat(self) -> tuple[int, int, int] | None:
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        return (st.st_mtime_ns, st.st_size, st.st_ino)

    def refresh(self) -> bool:
        """Re-read the document if it changed on disk; True when it did."""
        signature = self._stat()
        if signature == self._signature:
            return False
        self._signature = signature
        try:
            with open(self.path, "rb") as f:
                self.doc = tomllib.load(f)
        except FileNotFoundError:
            self.doc = {}
        except (OSError, tomllib.TOMLDecodeError) as e:
            log.warning("cannot read %s: %s", self.path, e)
            self.doc = {}
        return True

    def table(self, path: Iterable[str]) -> Any:
        node: Any = self.doc
        for part in path:
            node = node.get(part) if isinstance(node, dict) else None
        return node if isinstance(node, dict) else None

    def values(self, path: list[str]) -> dict[Ident, Any]:
        """``{(plugin, key): value}`` of the ``plugin -> {key: value}`` table at ``path``."""
        out: dict[Ident, Any] = {}
        for plugin, fields in (self.table(path) or {}).items():
            if isinstance(fields, dict):
                out.update({(plugin, key): value for key, value in fields.items()})
        return out

    def put(self, path: list[str], value: Any) -> None:
        """Set (``value`` not None) or delete the key at ``path``, pruning emptied tables."""
        node, trail = self.doc, []
        for part in path[:-1]:
            child = node.get(part)
            if not isinstance(child, dict):
                if value is None:
                    return
                child = node[part] = {}
            trail.append((node, part))
            node = child
        if value is not None:
            node[path[-1]] = value
            return
        node.pop(path[-1], None)
        for parent, part in reversed(trail):
            if parent[part]:
                break
            del parent[part]

    def save(self, rendered: str) -> str | None:
        """Write ``rendered`` (``dump_toml`` of the document) atomically; the ``unsaved``
        sentence when that failed.

        A document with no write permission bit is the owner's "do not touch" and is refused
        even when this process could write it (root): the same answer as a refused write.
        """
        directory = os.path.dirname(self.path) or "."
        tmp = None
        try:
            st = os.stat(self.path) if os.path.lexists(self.path) else None
            if st is not None and os.path.isfile(self.path) and not st.st_mode & 0o222:
                raise PermissionError(f"{self.path} is read-only")
            fd, tmp = tempfile.mkstemp(prefix=".config.toml.", suffix=".tmp", dir=directory)
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(rendered)
                f.flush()
                os.fsync(f.fileno())
            os.chmod(tmp, (st.st_mode & 0o777) if st is not None else 0o644)
            os.replace(tmp, self.path)
            tmp = None
        except PermissionError:
            return text(self.language, "refused", path=self.path)
        except OSError as e:
            return text(self.language, "failed", path=self.path, error=e.strerror or str(e))
        finally:
            if tmp is not None:
                try:
                    os.unlink(tmp)
                except OSError:
                    pass
        self._signature = self._stat()
        return None


def layer_path(layer: Layer, plugin: str) -> list[str]:
    """Where a config-document layer keeps ``plugin``'s values."""
    if isinstance(layer, PlatformLayer):
        return ["sessionSettings", "platform", layer.platform, plugin]
    if isinstance(layer, PlatformTypeLayer):
        return ["sessionSettings", "platformType", layer.platform, layer.type, plugin]
    return ["plugins", plugin]


__all__ = ["ConfigDocument", "dump_toml"]
