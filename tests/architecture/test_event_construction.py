"""Stored facts are built only where they are decided: every construction of a stored event (a
subclass of ``sessionloop.actors.events.Event``) in actors/ and cli/ is in a pure decision module.

Read from the source with ``ast``: a call whose callee is a name or ``module.name`` that the
module's imports (at any depth) or its own classes bind to an event class. An event built through
another alias (``cls = E.TaskEnded; cls()``) or copied (``msgspec.structs.replace``) is not seen.
"""

from __future__ import annotations

import ast
import importlib
import os
import types
from collections.abc import Iterator

from sessionloop.actors.events import Event
from tests.architecture.test_imports import module_name
from tests.conftest import REPO

FOLDERS = ("actors", "cli")

#: the decision modules: the only places a stored event is constructed
ALLOWED = frozenset({
    "actors/session/decide.py",
    "actors/session/drive.py",
    "actors/approvals/model.py",
    "actors/tasks/model.py",
    "actors/settings/decide.py",
})

def event_classes() -> frozenset[type]:
    found: set[type] = set()
    todo = [Event]
    while todo:
        for sub in todo.pop().__subclasses__():
            if sub not in found:
                found.add(sub)
                todo.append(sub)
    return frozenset(found)


def _resolve(module: str, name: str | None = None) -> object:
    """The object ``from module import name`` (or ``import module``) binds; None if it fails."""
    try:
        target: object = importlib.import_module(module)
    except ImportError:
        return None
    if name is None:
        return target
    found = getattr(target, name, None)
    if found is None:
        try:
            found = importlib.import_module(f"{module}.{name}")
        except ImportError:
            return None
    return found


def bindings(tree: ast.Module, module: str, package: str) -> dict[str, object]:
    """Name -> object for every import in the module (at any depth) and its top-level classes."""
    bound: dict[str, object] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname:
                    bound[alias.asname] = _resolve(alias.name)
                else:
                    top = alias.name.split(".")[0]
                    bound[top] = _resolve(top)
        elif isinstance(node, ast.ImportFrom):
            target = node.module or ""
            if node.level:
                parts = package.split(".")
                target = ".".join(parts[: len(parts) - node.level + 1] + ([node.module] if node.module else []))
            for alias in node.names:
                bound[alias.asname or alias.name] = _resolve(target, alias.name)
    own = [n.name for n in tree.body if isinstance(n, ast.ClassDef)]
    if own:
        defined = _resolve(module)
        bound.update({name: getattr(defined, name, None) for name in own})
    return bound


def constructions(path: str, rel: str, events: frozenset[type]) -> Iterator[tuple[int, str]]:
    """(line, event class name) of every event construction in the source file at ``path``."""
    mod = module_name(rel[:-3])
    package = mod if rel.endswith("__init__.py") else mod.rpartition(".")[0]
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), path)
    bound = bindings(tree, mod, package)
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        callee = _named(node.func, bound)
        if isinstance(callee, type) and callee in events:
            yield node.lineno, callee.__name__


def _named(node: ast.expr, bound: dict[str, object]) -> object:
    """What ``name`` or ``module.[module.]name`` stands for in the module; None for anything else."""
    if isinstance(node, ast.Name):
        return bound.get(node.id)
    if isinstance(node, ast.Attribute):
        owner = _named(node.value, bound)
        if isinstance(owner, types.ModuleType):
            return getattr(owner, node.attr, None)
    return None


def constructing_modules() -> dict[str, list[tuple[int, str]]]:
    """Repository-relative path (with ``/``) -> its event constructions, for actors/ and cli/."""
    events = event_classes()
    found: dict[str, list[tuple[int, str]]] = {}
    for folder in FOLDERS:
        for root, _, files in os.walk(os.path.join(REPO, folder)):
            for name in sorted(files):
                if not name.endswith(".py"):
                    continue
                path = os.path.join(root, name)
                rel = os.path.relpath(path, REPO)
                built = sorted(constructions(path, rel, events))
                if built:
                    found[rel.replace(os.sep, "/")] = built
    return found


def test_stored_events_are_constructed_only_in_the_decision_modules() -> None:
    found = constructing_modules()
    outside = {rel: built for rel, built in found.items() if rel not in ALLOWED}
    assert outside == {}, "stored events built outside the decision modules (line, event): " + "; ".join(
        f"{rel}: {built}" for rel, built in sorted(outside.items()))
    assert sorted(ALLOWED - set(found)) == [], "decision modules that build no event: take them off ALLOWED"


def test_the_scan_sees_a_construction_through_the_events_module_and_through_a_name(tmp_path) -> None:
    """The scan itself: both spellings count, a protocol class of the same name does not."""
    source = tmp_path / "probe.py"
    source.write_text(
        "from sessionloop.actors import events as E\n"
        "from sessionloop.actors.events import TaskEnded\n"
        "import sessionloop.actors.events\n"
        "from sessionloop.protocol.schemas import ApprovalSettled\n"
        "def f():\n"
        "    return E.TaskStarted(task_id='t', session_id='s', label='exec')\n"
        "b = TaskEnded(task_id='t', status='aborted')\n"
        "c = sessionloop.actors.events.SessionSeen()\n"
        "d = ApprovalSettled(approval_id='a', settlement=None)\n"
        "e = E.Settlement(state='denied', source='absent', at=0)\n", encoding="utf-8")
    assert sorted(constructions(str(source), "actors/probe.py", event_classes())) == [
        (6, "TaskStarted"), (7, "TaskEnded"), (8, "SessionSeen")]
