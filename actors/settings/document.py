"""The host configuration document ``<data>/config.toml`` (docs/owners.md, "Settings"): the TOML
file that holds the host's ``name`` (the ``appName`` of handshakes) and ``language`` (``en`` or
``zh``: the language of human text in frames, the global layer's language), and the session-setting
values of the global (the plugins' configuration), platform and platformType layers::

    name = "Aalis"
    language = "zh"
    [plugins.<plugin>]
    [sessionSettings.platform.<platform>.<plugin>]
    [sessionSettings.platformType.<platform>.<type>.<plugin>]

The same file holds the named models, ``[models.NAME]``, read by :mod:`actors.model.registry`
at start (and on a reload), never written here: a settings write keeps them, as every other key.

:class:`ConfigDocument` re-reads it when it changed on disk (when asked: a settings request, a
handshake, ``serve``'s SIGHUP) and writes it whole and atomically (temp file, fsync, rename),
keeping every other key; a failed or refused save (no write bit on the file) is answered with
the ``unsaved`` sentence, not raised. An edit that does not read as a configuration document
(not TOML, a table that is not one, a value a field refuses: the caller's ``check``) is refused:
logged once, naming the file and what is wrong, and the document read before stays in force.
:func:`dump_toml` is the TOML writer (tomllib only reads); :func:`layer_path` says where a layer
keeps a plugin's values.
"""

from __future__ import annotations

import logging
import math
import os
import re
import tempfile
import tomllib
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from sessionloop.actors.settings.context import Ident, Layer
from sessionloop.actors.settings.texts import LANGUAGES, Text
from sessionloop.protocol.schemas_types import PlatformLayer, PlatformTypeLayer

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


#: Where the layers keep their plugin tables (``layer_path``), and how many table levels lie
#: between that path and a plugin's table (platform; platform and type).
_LAYER_TABLES: tuple[tuple[tuple[str, ...], int], ...] = (
    (("plugins",), 0), (("sessionSettings", "platform"), 1), (("sessionSettings", "platformType"), 2))


def _plugin_tables(doc: Mapping[str, Any]) -> Iterator[tuple[str, str, Any]]:
    """``(dotted path, plugin, node)`` of every plugin table of the three layers; ``node`` is
    whatever the file holds there (a table, unless the file is wrong). A node on the way that
    is not a table comes as ``(its path, "", node)``."""
    for path, depth in _LAYER_TABLES:
        node: Any = doc
        where = ""
        for part in path:
            if not isinstance(node, dict):
                break
            node, where = node.get(part), f"{where}.{part}" if where else part
        if node is not None:
            yield from _descend(node, where, depth)


def _descend(node: Any, where: str, depth: int) -> Iterator[tuple[str, str, Any]]:
    if not isinstance(node, dict):
        yield where, "", node
        return
    for key, child in node.items():
        if depth == 0:
            yield f"{where}.{key}", key, child
        else:
            yield from _descend(child, f"{where}.{key}", depth - 1)


def document_problem(doc: Mapping[str, Any]) -> str | None:
    """Why ``doc`` is not a configuration document (the dotted path of the first table or
    value that is wrong), or None: ``name`` a string; ``language`` one of ``en``, ``zh``;
    ``plugins.<plugin>``,
    ``sessionSettings.platform.<platform>.<plugin>`` and
    ``sessionSettings.platformType.<platform>.<type>.<plugin>`` tables."""
    if "name" in doc and not isinstance(doc["name"], str):
        return "name: expected a string"
    if "language" in doc and doc["language"] not in LANGUAGES:
        return f"language: expected one of {', '.join(LANGUAGES)}, got {doc['language']!r}"
    for where, _plugin, node in _plugin_tables(doc):
        if not isinstance(node, dict):
            return f"{where}: expected a table"
    return None


def setting_values(doc: Mapping[str, Any]) -> Iterator[tuple[str, str, str, Any]]:
    """``(dotted path, plugin, key, value)`` of every session-setting value in a document that
    :func:`document_problem` accepts."""
    for where, plugin, node in _plugin_tables(doc):
        if isinstance(node, dict):
            for key, value in node.items():
                yield f"{where}.{key}", plugin, key, value


class ConfigDocument:
    """``<data>/config.toml``: read when it changed on disk, written whole and atomically.

    ``problem`` is why the file on disk was last refused (None while what is on disk is in force)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.doc: dict[str, Any] = {}
        self.problem: str | None = None
        self._signature: tuple[int, int, int] | None = None
        self._started = False
        self.refresh()  # at start nothing older is in force: the owner says so (``problem``)
        self._started = True

    def _stat(self) -> tuple[int, int, int] | None:
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        return (st.st_mtime_ns, st.st_size, st.st_ino)

    def refresh(self, check: Callable[[dict[str, Any]], str | None] | None = None) -> bool:
        """Re-read the document if it changed on disk; True when the new one is in force.

        One that cannot be read, is not TOML, fails :func:`document_problem` or ``check`` (a
        sentence naming what is wrong) is refused: ``problem`` says why, a warning is logged
        once for that version of the file, and the document read before stays in force. A
        missing file is an empty document."""
        signature = self._stat()
        if signature == self._signature:
            return False
        self._signature = signature
        try:
            with open(self.path, "rb") as f:
                doc = tomllib.load(f)
        except FileNotFoundError:
            doc = {}
        except tomllib.TOMLDecodeError as e:
            return self._refuse(f"not valid TOML ({e})")
        except (OSError, UnicodeDecodeError) as e:
            return self._refuse(f"cannot be read ({e})")
        problem = document_problem(doc) or (check(doc) if check is not None else None)
        if problem is not None:
            return self._refuse(problem)
        self.doc, self.problem = doc, None
        return True

    def _refuse(self, problem: str) -> bool:
        self.problem = problem
        if self._started:
            log.warning("%s refused: %s; the settings read before stay in force (fix the file, then send the "
                        "server SIGHUP)", self.path, problem)
        return False

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
        sentence (a text object, shown in the server's language) when that failed.

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
            return Text("settings.unsaved-refused", path=self.path)
        except OSError as e:
            return Text("settings.unsaved-failed", path=self.path, error=e.strerror or str(e))
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


__all__ = ["ConfigDocument", "document_problem", "dump_toml", "setting_values"]
