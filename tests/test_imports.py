"""Imports point down only: the layers of ``src/`` as data, checked on its import graph.

The graph is read from the source (``ast``), not from running it, so every
import counts: at module level, inside a function, or under ``TYPE_CHECKING``.
Each module of ``effectful_durable`` belongs to one group of :data:`LAYERS`. A
module may import the modules of its own group, as long as no cycle forms, and
those of any group in a lower layer; never a module of a higher layer, nor one
of another group of its own layer (groups side by side: the two engines; the
parts and the SQL workspace). See ``docs/source/layout.rst``.

No module reaches into another package's private names either (``TestReachIns``):
what one package needs of another has a public name. effectful's own private
names are the one exception, in ``handlers/effectful_hooks.py`` alone.
"""

from __future__ import annotations

import ast
import sys
from dataclasses import dataclass
from functools import cache

from paths import ROOT

SRC = ROOT / "src"
PACKAGE = "effectful_durable"

#: The layers, top to bottom. A name stands for that module and, if it is a
#: package, everything in it that no longer name claims; ``""`` is the package
#: itself (``src/__init__.py``) alone.
LAYERS: list[list[tuple[str, ...]]] = [
    # what users run and import: the public API, the command, the test helpers
    [("", "__main__", "cli", "testing")],
    [("upgrades",)],  # check what new agent code does to the agents in flight; its repairs
    [("runner",), ("ui",)],  # AgentRunner: delivers alarms as turns; the page
    [("handlers",)],  # PersistenceHandler, CompactionHandler
    [("agents",)],  # PersistentAgent and the tool mixins
    [("store",)],  # the Store facade: reads, the turn protocol, maintenance
    [("store.parts",), ("store.workspace",)],  # what a turn writes; the agent's SQL tables
    [("store.records", "store.history", "store.rows", "store.ids")],  # shared leaves
    [("store.engine.sqlite",), ("store.engine.postgres",)],  # the two engines
    [("store.engine",)],  # the seam both engines implement
    [("store.sealing", "store.keys")],  # the cipher of stored content, and its keys
    # the hierarchy of errors; what a check found, as the check writes it and the page
    # reads it; where the user's code raised: each imports nothing of ours
    [("errors",), ("upgrades.report",), ("upgrades.user_code",)],
]


@dataclass(frozen=True)
class Import:
    """One import statement's arrow: ``source`` imports ``target`` at ``line``."""

    source: str
    target: str
    line: int

    def __str__(self) -> str:
        source, target = _absolute(self.source), _absolute(self.target)
        return f"src/{modules()[self.source]}:{self.line}: {source} imports {target}"


@cache
def modules() -> dict[str, str]:
    """Every module, by its name relative to the package ("" for the package), and its file."""
    found = {}
    for path in sorted(SRC.rglob("*.py")):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = str(path.relative_to(SRC))
    return found


def _absolute(name: str) -> str:
    return f"{PACKAGE}.{name}" if name else PACKAGE


def _relative(absolute: str) -> str | None:
    """``absolute`` relative to the package, or None if it is not ours."""
    if absolute == PACKAGE:
        return ""
    if absolute.startswith(PACKAGE + "."):
        return absolute[len(PACKAGE) + 1 :]
    return None


def _known(name: str) -> str:
    """``name``, or the nearest package of ours that holds it, if it is no module."""
    while name not in modules():
        name = name.rpartition(".")[0]
    return name


@cache
def imports() -> list[Import]:
    """Every arrow between two modules of ours, one per imported module and statement."""
    arrows: dict[Import, None] = {}
    for module, file in modules().items():
        tree = ast.parse((SRC / file).read_text("utf-8"), file)
        here = _absolute(module).split(".")
        package = here if file.endswith("__init__.py") else here[:-1]
        for node in ast.walk(tree):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package[: len(package) - (node.level - 1)]
                    origin = ".".join(base + ([node.module] if node.module else []))
                else:
                    origin = node.module or ""
                # "from package import module" imports that module
                targets = [f"{origin}.{alias.name}" for alias in node.names]
            for target in targets:
                ours = _relative(target)
                if ours is None:
                    continue
                ours = _known(ours)
                if ours != module:
                    arrows[Import(module, ours, node.lineno)] = None
    return list(arrows)


def group_of(module: str) -> tuple[int, tuple[str, ...]] | None:
    """The layer (0 at the top) and the group of ``module``: those of the longest name
    in :data:`LAYERS` that is it or a package holding it."""
    candidates = [module]  # then its packages, longest first (never "" for another)
    while "." in candidates[-1]:
        candidates.append(candidates[-1].rpartition(".")[0])
    for candidate in candidates:
        for layer, groups in enumerate(LAYERS):
            for group in groups:
                if candidate in group:
                    return layer, group
    return None


def shortest_cycle(component: list[str]) -> list[Import]:
    """The arrows of a shortest cycle through the first module of ``component``."""
    start, members = component[0], set(component)
    came: dict[str, Import] = {}
    frontier = [start]
    while frontier:
        following = []
        for module in frontier:
            for arrow in imports():
                if arrow.source != module or arrow.target not in members:
                    continue
                if arrow.target == start:
                    path = [arrow]
                    while path[0].source != start:
                        path.insert(0, came[path[0].source])
                    return path
                if arrow.target not in came:
                    came[arrow.target] = arrow
                    following.append(arrow.target)
        frontier = following
    return []


def cycles() -> list[list[str]]:
    """The strongly connected components of the import graph with more than one module."""
    edges: dict[str, set[str]] = {module: set() for module in modules()}
    for arrow in imports():
        edges[arrow.source].add(arrow.target)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in edges:
        if root in index:
            continue
        # Tarjan's algorithm, iteratively: (module, its remaining successors)
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            module, successors = work[-1]
            for successor in successors:
                if successor not in index:
                    index[successor] = low[successor] = len(index)
                    stack.append(successor)
                    on_stack.add(successor)
                    work.append((successor, iter(sorted(edges[successor]))))
                    break
                if successor in on_stack:
                    low[module] = min(low[module], index[successor])
            else:
                work.pop()
                if work:
                    parent = work[-1][0]
                    low[parent] = min(low[parent], low[module])
                if low[module] == index[module]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == module:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
    return found


def _named(group: tuple[str, ...]) -> str:
    return "+".join(name or PACKAGE for name in group)


class TestLayers:
    """Every module has its place, and its imports point down."""

    def test_every_module_belongs_to_a_layer(self) -> None:
        """Each module of src/ falls in a group of LAYERS, and each name there exists."""
        placeless = [name or PACKAGE for name in modules() if group_of(name) is None]
        assert not placeless, f"add these modules to LAYERS in {__name__}: {placeless}"
        named = {name for groups in LAYERS for group in groups for name in group}
        stale = sorted(named - set(modules()))
        assert not stale, f"LAYERS names modules that do not exist: {stale}"

    def test_no_import_runs_upward(self) -> None:
        """No module imports one of a higher layer, or of another group of its layer."""
        wrong = []
        for arrow in imports():
            source, target = group_of(arrow.source), group_of(arrow.target)
            assert source is not None and target is not None
            if source[1] == target[1] or target[0] > source[0]:
                continue
            way = "upward" if target[0] < source[0] else "sideways"
            where = "above" if target[0] < source[0] else "beside"
            wrong.append(f"{arrow}, {way}: {_named(target[1])} sits {where} {_named(source[1])}")
        assert not wrong, "imports that run upward or sideways:\n" + "\n".join(wrong)


class TestCycles:
    """No module imports a module that imports it back, however far round."""

    def test_no_import_cycles(self) -> None:
        """The import graph has no strongly connected component of two modules or more."""
        found = cycles()
        lines = []
        for component in found:
            lines.append(f"{len(component)} modules import one another: {', '.join(component)}")
            lines.append("  for one, round this cycle:")
            lines += [f"    {arrow}" for arrow in shortest_cycle(component)]
        assert not found, "import cycles:\n" + "\n".join(lines)


class TestStore:
    """The store knows nothing about effectful."""

    def test_store_never_imports_effectful(self) -> None:
        """No module under store/ imports effectful, nor litellm."""
        wrong = []
        for module, file in modules().items():
            if module != "store" and not module.startswith("store."):
                continue
            for node in ast.walk(ast.parse((SRC / file).read_text("utf-8"), file)):
                names = []
                if isinstance(node, ast.Import):
                    names = [alias.name for alias in node.names]
                elif isinstance(node, ast.ImportFrom) and not node.level:
                    names = [node.module or ""]
                wrong += [
                    f"src/{file}:{node.lineno}: {name}"
                    for name in names
                    if name.split(".")[0] in ("effectful", "litellm")
                ]
        assert not wrong, "store imports effectful:\n" + "\n".join(wrong)


def _module_level_imports(file: str) -> list[tuple[int, str]]:
    """The modules ``file`` imports when it is imported: neither in a function nor
    under ``if TYPE_CHECKING``. Relative imports come back as ``.name``."""
    tree = ast.parse((SRC / file).read_text("utf-8"), file)
    found: list[tuple[int, str]] = []

    def visit(nodes: list[ast.stmt]) -> None:
        for node in nodes:
            if isinstance(node, ast.Import):
                found.extend((node.lineno, alias.name) for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                found.append((node.lineno, "." * node.level + (node.module or "")))
            elif isinstance(node, ast.If):
                if not (isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"):
                    visit(node.body)
                visit(node.orelse)
            elif isinstance(node, ast.Try):
                visit(node.body)
                for clause in node.handlers:
                    visit(clause.body)

    visit(tree.body)
    return found


class TestTracing:
    """OpenTelemetry is an optional extra: only the tracing modules import it, lazily."""

    def test_only_the_tracing_modules_import_opentelemetry(self) -> None:
        """No module but handlers/tracing.py and runner/tracing.py imports it when imported,
        and no module imports those two when imported (but one of the other)."""
        tracing = {"handlers.tracing", "runner.tracing"}
        wrong = []
        for module, file in modules().items():
            for line, name in _module_level_imports(file):
                if name.split(".")[0] == "opentelemetry" and module not in tracing:
                    wrong.append(f"src/{file}:{line}: {name}")
                if name.endswith("tracing") and module not in tracing:
                    wrong.append(f"src/{file}:{line}: {name}")
        assert not wrong, "imported with tracing off:\n" + "\n".join(wrong)


class TestUI:
    """The page is an optional extra over the store: it never loads effectful's LLM layer."""

    def test_the_page_imports_only_the_store_and_the_errors(self) -> None:
        """ui/ imports, of ours, only store/, errors and the upgrade report's types: never
        handlers, agents or runner, so that litellm is never loaded; nor effectful."""
        wrong = [
            str(arrow)
            for arrow in imports()
            if (arrow.source == "ui" or arrow.source.startswith("ui."))
            and group_of(arrow.target) not in (group_of("ui"), None)
            and not arrow.target.startswith("store")
            and arrow.target not in ("errors", "upgrades.report")
        ]
        for module, file in modules().items():
            if module == "ui" or module.startswith("ui."):
                wrong += [
                    f"src/{file}:{line}: {name}"
                    for line, name in _module_level_imports(file)
                    if name.split(".")[0] in ("effectful", "litellm")
                ]
        assert not wrong, "the page imports more than the store:\n" + "\n".join(wrong)

    def test_only_the_page_imports_its_libraries(self) -> None:
        """Starlette, uvicorn and Jinja2 (the ui extra) are imported by ui/ alone, and
        ui/ by no module when it is imported (the command imports it when run)."""
        extra = ("starlette", "uvicorn", "jinja2")
        wrong = []
        for module, file in modules().items():
            if module == "ui" or module.startswith("ui."):
                continue
            for line, name in _module_level_imports(file):
                if name.split(".")[0] in extra or name in (".ui", f"{PACKAGE}.ui"):
                    wrong.append(f"src/{file}:{line}: {name}")
        assert not wrong, "imported without the ui extra:\n" + "\n".join(wrong)


class TestLeaves:
    """What the page and the command line share with the upgrade check loads nothing else."""

    def test_the_report_and_user_code_import_only_the_standard_library(self) -> None:
        """upgrades/report.py and user_code.py import nothing of ours, nor effectful, nor
        any other package: the page reads the report without loading the check."""
        wrong = []
        for module in ("upgrades.report", "upgrades.user_code"):
            file = modules()[module]
            for node in ast.walk(ast.parse((SRC / file).read_text("utf-8"), file)):
                names = []
                if isinstance(node, ast.Import):
                    names = [alias.name for alias in node.names]
                elif isinstance(node, ast.ImportFrom):
                    names = ["." if node.level else node.module or ""]
                wrong += [
                    f"src/{file}:{node.lineno}: {name}"
                    for name in names
                    if name.split(".")[0] not in sys.stdlib_module_names | {"__future__"}
                ]
        assert not wrong, "imports beyond the standard library:\n" + "\n".join(wrong)


class TestCommandLine:
    """The command line loads the user's code, and litellm, only in the commands that run it."""

    def test_the_command_imports_only_the_store_when_imported(self) -> None:
        """cli/ imports, when imported, of ours only itself, store/, errors and the upgrade
        leaves, and never effectful: the commands that run agents (run, check-upgrade, ...)
        and ui import handlers, agents, runner, upgrades and ui inside their functions."""
        allowed = ("cli", "store", "errors", "upgrades.report", "upgrades.user_code")
        wrong = []
        for module, file in modules().items():
            if module != "cli" and not module.startswith("cli."):
                continue
            package = module.split(".") if file.endswith("__init__.py") else module.split(".")[:-1]
            for line, name in _module_level_imports(file):
                level = len(name) - len(name.lstrip("."))
                if level:
                    rest = name[level:]
                    ours: str | None = ".".join(
                        package[: len(package) - (level - 1)] + ([rest] if rest else [])
                    )
                else:
                    ours = _relative(name)
                if ours is None:
                    if name.split(".")[0] in ("effectful", "litellm"):
                        wrong.append(f"src/{file}:{line}: {name}")
                elif not any(ours == a or ours.startswith(a + ".") for a in allowed):
                    wrong.append(f"src/{file}:{line}: {name}")
        assert not wrong, "the command line imports, when imported:\n" + "\n".join(wrong)


#: effectful's private names that ``handlers/effectful_hooks.py`` must use, the one
#: module that knows how effectful 0.4 keeps histories (its docstring says why each).
EFFECTFUL_PRIVATE = {
    "handlers.effectful_hooks": {
        "_add_cache_control_to_history",
        "_get_history",
        "_NoActiveHistoryException",
        "_make_message",
    }
}


#: Reads of a private name that the module's package and another both define, each
#: checked by hand to be of an object of the module's own package. Any other read of
#: such a name fails (``persistence._resuming`` in runner/ did, beside runner's own).
OWN_PRIVATE = {
    ("store/engine/sqlite/database.py", "self._db._start"),  # its SQLiteDatabase
    ("store/store.py", "store._close"),  # a Store
}


def _is_private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _top_package(module: str) -> str:
    """The top-level package (or module) of ours ``module`` belongs to: ``store``, ``cli``."""
    return module.split(".")[0]


@cache
def private_names() -> dict[str, set[str]]:
    """Each private name (one leading underscore) defined in src/, with the top-level
    packages that define it: a function, class, attribute or variable of that name."""
    found: dict[str, set[str]] = {}
    for module, file in modules().items():
        for node in ast.walk(ast.parse((SRC / file).read_text("utf-8"), file)):
            names: list[str] = []
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                names = [node.name]
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                names = [node.attr]
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                names = [node.id]
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                names = [node.target.id]
            for name in names:
                if _is_private(name):
                    found.setdefault(name, set()).add(_top_package(module))
    return found


class TestReachIns:
    """A module uses another package through its public names only (STYLE.md)."""

    def test_no_module_uses_a_private_name_of_another_package(self) -> None:
        """No module imports, or reads an attribute (of anything but self or cls) by, a
        name with one leading underscore that another top-level package defines (one its
        own package defines too only as OWN_PRIVATE lists)."""
        defined = private_names()
        wrong = []
        for module, file in modules().items():
            package = _top_package(module)
            for node in ast.walk(ast.parse((SRC / file).read_text("utf-8"), file)):
                names: list[str] = []
                if isinstance(node, ast.Attribute) and _is_private(node.attr):
                    if not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")):
                        names = [node.attr]
                elif isinstance(node, ast.ImportFrom):
                    names = [alias.name for alias in node.names if _is_private(alias.name)]
                for name in names:
                    others = defined.get(name, set()) - {package}
                    if not others or (file, ast.unparse(node)) in OWN_PRIVATE:
                        continue
                    where = ", ".join(sorted(others))
                    wrong.append(f"src/{file}:{node.lineno}: {name}, private to {where}")
        assert not wrong, "reach-ins into another package's private names:\n" + "\n".join(wrong)

    def test_only_the_hooks_use_private_names_of_effectful(self) -> None:
        """effectful's private names are imported in handlers/effectful_hooks.py alone, and
        only those EFFECTFUL_PRIVATE lists."""
        wrong = []
        for module, file in modules().items():
            allowed = EFFECTFUL_PRIVATE.get(module, set())
            for node in ast.walk(ast.parse((SRC / file).read_text("utf-8"), file)):
                if not (isinstance(node, ast.ImportFrom) and not node.level and node.module):
                    continue
                if node.module.split(".")[0] != "effectful":
                    continue
                wrong += [
                    f"src/{file}:{node.lineno}: {node.module}.{alias.name}"
                    for alias in node.names
                    if _is_private(alias.name) and alias.name not in allowed
                ]
        assert not wrong, "effectful's private names outside effectful_hooks:\n" + "\n".join(wrong)
