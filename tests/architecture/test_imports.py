"""The import graph, read from the source: the layers only import downwards (eventstore <-
protocol <- client <- actors <- the package root <- cli), no module-level import closes a cycle,
every import of our code names the one installed top-level package, ``sessionloop``, and the
client (``sessionloop.client``, kept in actors/client/) imports nothing of ours but protocol/.

Imports inside functions are not part of the cycle check: they are how some modules still break
their cycles (issue "One house plan" removes them); imports under ``if TYPE_CHECKING`` never run.
"""

from __future__ import annotations

import ast
import configparser
import os
from collections.abc import Iterator

from tests.conftest import REPO

FOLDERS = ("eventstore", "protocol", "actors", "cli")  # the design card's folders, sessionloop.<folder>
ROOT = os.path.join("actors", "public")  # the root module of sessionloop (setup.cfg's package_dir)
CLIENT = os.path.join("actors", "client")  # sessionloop.client (setup.cfg's package_dir)
LAYERS = ("eventstore", "protocol", "client", "actors", "", "cli")  # "": the package root, sessionloop itself


def module_name(rel: str) -> str:
    """The installed name of the source file at ``rel`` (a path under the repository)."""
    if rel == ROOT or rel.startswith(ROOT + os.sep):
        rel = rel[len(ROOT):].lstrip(os.sep)
    elif rel == CLIENT or rel.startswith(CLIENT + os.sep):
        rel = "client" + rel[len(CLIENT):]
    return ".".join(["sessionloop", *[p for p in rel.split(os.sep) if p]]).removesuffix(".__init__")


def layer(mod: str) -> str:
    if mod == "sessionloop.__main__":  # ``python -m sessionloop``: the command line
        return "cli"
    return mod.split(".")[1] if mod.count(".") else ""


def modules() -> dict[str, str]:
    found = {}
    for folder in FOLDERS:
        for root, _, files in os.walk(os.path.join(REPO, folder)):
            for name in files:
                if name.endswith(".py"):
                    path = os.path.join(root, name)
                    found[module_name(os.path.relpath(path, REPO)[:-3])] = path
    return found


def imports(mod: str, path: str, known: dict[str, str]) -> Iterator[tuple[str, bool]]:
    """(our module imported, whether at module level) for every import statement of ``mod``."""
    package = mod if path.endswith("__init__.py") else mod.rpartition(".")[0]

    def walk(body: list[ast.stmt], top: bool) -> Iterator[tuple[str, bool]]:
        for node in body:
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                continue
            if isinstance(node, ast.Import):
                for alias in node.names:
                    yield alias.name, top
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")[: len(package.split(".")) - node.level + 1]
                    target = ".".join(base + ([node.module] if node.module else []))
                else:
                    target = node.module or ""
                subs = [f"{target}.{a.name}" for a in node.names if f"{target}.{a.name}" in known]
                yield from ((s, top) for s in subs)
                if len(subs) < len(node.names):  # names defined in the module itself
                    yield target, top
            inner = top and not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
            for field in ("body", "orelse", "finalbody", "handlers"):
                sub = getattr(node, field, None)
                if isinstance(sub, list):
                    yield from walk(sub, inner)

    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), path)
    yield from ((t, top) for t, top in walk(tree.body, True) if t.split(".")[0] in ("sessionloop", *FOLDERS))


def test_every_import_of_our_code_goes_through_the_sessionloop_package() -> None:
    """A bare ``import actors`` works only from a checkout: installed, it is a stranger's package."""
    known = modules()
    bare = [f"{mod} imports {target}" for mod, path in known.items() for target, _ in imports(mod, path, known)
            if target.split(".")[0] != "sessionloop"]
    assert bare == []


def test_every_layer_imports_only_the_layers_below_it() -> None:
    known = modules()
    upward = [f"{mod} imports {target}" for mod, path in known.items() for target, _ in imports(mod, path, known)
              if LAYERS.index(layer(target)) > LAYERS.index(layer(mod))]
    assert upward == []


def test_protocol_imports_nothing_of_ours_outside_protocol() -> None:
    """protocol/ is the wire: the store and the actors reach it, never the other way round (its
    errors translate theirs by ``code`` and ``data``), at module level or inside a function."""
    known = modules()
    outside = [f"{mod} imports {target}" for mod, path in known.items() if layer(mod) == "protocol"
               for target, _ in imports(mod, path, known) if layer(target) != "protocol"]
    assert outside == []


def test_the_client_imports_nothing_of_ours_but_protocol() -> None:
    """A bot installs sessionloop for its client: importing it must not start (or even import) the
    server's actors, store or command line, wherever the import stands."""
    own = "sessionloop.client"
    foreign = [f"{mod} imports {target}" for mod, path in modules().items() if mod == own or mod.startswith(own + ".")
               for target in imports_outside(path, mod if path.endswith("__init__.py") else mod.rpartition(".")[0],
                                             own)
               if not (target == "sessionloop.protocol" or target.startswith("sessionloop.protocol."))]
    assert foreign == []
    assert modules()[own].endswith(os.path.join("actors", "client", "__init__.py"))


def test_no_module_level_import_closes_a_cycle() -> None:
    known = modules()
    graph = {mod: {t for t, top in imports(mod, path, known) if top and t in known and t != mod}
             for mod, path in known.items()}
    # a package's __init__ importing its own submodules is how a package exposes them, not a cycle
    for mod in graph:
        graph[mod] = {t for t in graph[mod] if not (mod in known and t.startswith(mod + ".")
                                                     and known[mod].endswith("__init__.py"))}
    assert find_cycles(graph) == []


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle per back edge a depth-first walk finds (empty: the graph has none)."""
    cycles: list[list[str]] = []
    state: dict[str, str] = {}

    def visit(mod: str, trail: list[str]) -> None:
        state[mod] = "open"
        for target in sorted(graph[mod]):
            if state.get(target) == "open":
                cycles.append(trail[trail.index(target):] + [target])
            elif target not in state:
                visit(target, trail + [target])
        state[mod] = "done"

    for mod in sorted(graph):
        if mod not in state:
            visit(mod, [mod])
    return cycles


def test_the_checker_sees_an_upward_import_and_a_cycle(tmp_path) -> None:
    """The reader itself: a module importing a higher layer and two modules importing each other."""
    (tmp_path / "eventstore").mkdir()
    (tmp_path / "eventstore" / "a.py").write_text("from sessionloop.actors import host\nfrom . import b\n"
                                                  "import cli.main\n")
    (tmp_path / "eventstore" / "b.py").write_text("from .a import thing\n")
    known = {f"sessionloop.eventstore.{m}": str(tmp_path / "eventstore" / f"{m}.py") for m in ("a", "b")}
    assert sorted(imports("sessionloop.eventstore.a", known["sessionloop.eventstore.a"], known)) == [
        ("cli.main", True), ("sessionloop.actors", True), ("sessionloop.eventstore.b", True)]
    assert list(imports("sessionloop.eventstore.b", known["sessionloop.eventstore.b"], known)) == [
        ("sessionloop.eventstore.a", True)]
    assert [layer(m) for m in ("sessionloop", "sessionloop.cli.main", "sessionloop.actors")] == ["", "cli", "actors"]
    assert module_name(os.path.join("actors", "public", "__init__")) == "sessionloop"
    assert module_name(os.path.join("actors", "model", "mock")) == "sessionloop.actors.model.mock"
    assert module_name(os.path.join("actors", "client", "aio")) == "sessionloop.client.aio"
    assert module_name(os.path.join("actors", "client", "__init__")) == "sessionloop.client"
    assert layer("sessionloop.client.aio") == "client"
    assert find_cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c", "a"]]
    assert find_cycles({"a": {"b"}, "b": set(), "c": {"a", "b"}}) == []


def test_setup_cfg_lists_every_package_under_its_installed_name() -> None:
    """setup.cfg names the packages one by one (it cannot prefix ``find:``): a new folder with an
    ``__init__.py`` that the list lacks would be missing from the installed distribution."""
    parser = configparser.ConfigParser()
    parser.read(os.path.join(REPO, "setup.cfg"))
    listed = set(parser["options"]["packages"].split())
    packages = {mod for mod, path in modules().items() if path.endswith("__init__.py")}
    assert listed == packages


def imports_outside(path: str, package: str, own: str) -> list[str]:
    """Our modules outside the package ``own`` that the file at ``path`` (in ``package``) imports,
    wherever the import stands: module level, a function, ``if TYPE_CHECKING``."""
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), path)
    targets: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package.split(".")[: len(package.split(".")) - node.level + 1] if node.level else []
            module = ".".join(base + ([node.module] if node.module else []))
            targets += [module] if node.module else [f"{module}.{alias.name}" for alias in node.names]
    ours = [t for t in targets if t.split(".")[0] in ("sessionloop", *FOLDERS)]
    return [t for t in ours if t != own and not t.startswith(own + ".")]


def test_the_event_store_imports_nothing_of_ours_outside_itself() -> None:
    """eventstore/ is generic: the application's events are handed in when a store opens, so no
    module of it may import the domain events (actors/events.py) or anything else of ours."""
    own = "sessionloop.eventstore"
    foreign = [f"{mod} imports {target}" for mod, path in modules().items() if mod == own or mod.startswith(own + ".")
               for target in imports_outside(path, mod if path.endswith("__init__.py") else mod.rpartition(".")[0],
                                             own)]
    assert foreign == []


def test_the_event_store_check_sees_a_domain_import_wherever_it_stands(tmp_path) -> None:
    """The check itself: the domain events imported at module level, in a function, under
    ``if TYPE_CHECKING`` or relatively are all found; the store's own modules are not."""
    path = tmp_path / "codec.py"
    path.write_text("from typing import TYPE_CHECKING\nimport msgspec\n"
                    "from sessionloop.eventstore import keys\nfrom . import errors\n"
                    "from sessionloop.actors import events as E\n"
                    "if TYPE_CHECKING:\n    from sessionloop.actors.events import Event\n"
                    "def f():\n    import sessionloop.protocol.frames\n    from .. import actors\n")
    assert imports_outside(str(path), "sessionloop.eventstore", "sessionloop.eventstore") == [
        "sessionloop.actors", "sessionloop.actors.events", "sessionloop.protocol.frames", "sessionloop.actors"]
