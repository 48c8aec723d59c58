"""The README's dependency rules, checked on every import of the shipped packages.

"Dependencies point one way: ``ui`` and ``searcher`` import ``trials`` and ``storage``;
``trials`` imports ``storage``; ``storage`` imports none of them." And no shipped
package imports the test or benchmark code, which is not installed.

Every module of the four packages is parsed (not imported: no process, no side effect)
and every import in it is checked: at module level, inside functions and
``TYPE_CHECKING`` blocks, ``import x.y``, ``from x import y``, relative imports resolved
against the module's package, and ``importlib.import_module("x")`` with a literal name.
Running a package as a program (``python -m ui``) is not an import and is allowed.

The same imports also make the module graph, which must have no cycle (an import
inside a function hides one, it does not remove it), must not reach into another
package's private module (a sub-package is a package of its own here: re-export the
name from its ``__init__``), and must follow the layers of ``trials``' sub-packages
that their ``__init__`` docstrings state.
"""

from __future__ import annotations

import ast
import itertools
from collections import deque
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("searcher", "trials", "storage", "ui")
NOT_SHIPPED = ("tests", "bench")

# What each package must not import, and the rule that says so.
FORBIDDEN: dict[str, tuple[frozenset[str], str]] = {
    "storage": (frozenset({"searcher", "trials", "ui"}), "storage imports none of them"),
    "trials": (frozenset({"searcher", "ui"}), "trials imports storage only"),
    "searcher": (frozenset({"ui"}), "ui and searcher import trials and storage, not each other"),
    "ui": (frozenset({"searcher"}), "ui and searcher import trials and storage, not each other"),
}
NOT_SHIPPED_RULE = "no shipped package imports the tests or the benchmarks (not installed)"


@dataclass(frozen=True)
class Import:
    """One imported module (its full dotted name) and where the import is.

    ``names`` are what a ``from module import a, b`` takes (a name may be a submodule).
    """

    module: str
    line: int
    names: tuple[str, ...] = field(default=(), compare=False)

    @property
    def top(self) -> str:
        return self.module.partition(".")[0]


def module_name(path: Path) -> str:
    """The dotted name of the module at ``path`` (a package's ``__init__`` is the package).

    Example:
        >>> module_name(REPO_ROOT / "storage" / "_records.py")
        'storage._records'
    """
    parts = list(path.relative_to(REPO_ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _resolve_relative(node: ast.ImportFrom, module: str, is_package: bool) -> str:
    """The absolute module a ``from .x import y`` (``level`` dots) names, from ``module``."""
    package = module.split(".") if is_package else module.split(".")[:-1]
    if node.level - 1 > len(package) - 1:
        raise ValueError(f"line {node.lineno}: relative import beyond the top-level package")
    base = package[: len(package) - (node.level - 1)]
    return ".".join([*base, node.module] if node.module else base)


def _literal_import(node: ast.Call) -> str | None:
    """The name of ``importlib.import_module("x")`` or ``__import__("x")``, if literal."""
    func = node.func
    name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
    if name not in ("import_module", "__import__") or not node.args:
        return None
    first = node.args[0]
    if isinstance(first, ast.Constant) and isinstance(first.value, str):
        return first.value
    return None


def imports_of(source: str, module: str, *, is_package: bool = False) -> Iterator[Import]:
    """Every module that ``source`` (the code of ``module``) imports, wherever it does.

    Example:
        >>> [i.module for i in imports_of("def f():\\n    from ..b import c", "p.q.r")]
        ['p.b']
    """
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            yield from (Import(alias.name, node.lineno) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            names = tuple(alias.name for alias in node.names)
            if node.level:
                yield Import(_resolve_relative(node, module, is_package), node.lineno, names)
            else:
                yield Import(node.module or "", node.lineno, names)
        elif isinstance(node, ast.Call):
            name = _literal_import(node)
            if name is not None and not name.startswith("."):
                yield Import(name, node.lineno)


def package_modules(package: str) -> list[Path]:
    """Every Python file of ``package`` (sub-packages and migrations included)."""
    return sorted((REPO_ROOT / package).rglob("*.py"))


def violations(source: str, where: str, module: str, *, is_package: bool = False) -> list[str]:
    """Each import in ``source`` (module ``module``, file ``where``) that breaks a rule.

    Example:
        >>> violations("import ui", "searcher/x.py", "searcher.x")
        ['searcher/x.py:1: searcher imports ui (ui and searcher import trials and storage, not each other)']
    """
    package = module.partition(".")[0]
    forbidden, rule = FORBIDDEN[package]
    found = []
    for imported in imports_of(source, module, is_package=is_package):
        broken = rule if imported.top in forbidden else None
        if imported.top in NOT_SHIPPED:
            broken = NOT_SHIPPED_RULE
        if broken is not None:
            found.append(
                f"{where}:{imported.line}: {package} imports {imported.module} ({broken})"
            )
    return found


def file_violations(path: Path) -> list[str]:
    """:func:`violations` of the module at ``path`` inside the repository."""
    return violations(
        path.read_text(encoding="utf-8"),
        str(path.relative_to(REPO_ROOT)),
        module_name(path),
        is_package=path.name == "__init__.py",
    )


@pytest.mark.parametrize("package", PACKAGES)
def test_package_imports_follow_the_dependency_rules(package: str) -> None:
    modules = package_modules(package)
    assert len(modules) > 3, f"{package}: no modules found under {REPO_ROOT / package}"
    broken = [line for path in modules for line in file_violations(path)]
    assert not broken, "imports that break the README's dependency rules:\n" + "\n".join(broken)


@pytest.mark.parametrize(
    ("source", "module", "is_package", "expected"),
    [
        ("import ui", "searcher.cli", False, ["ui"]),
        ("import ui.app as app", "searcher.cli", False, ["ui.app"]),
        ("from ui import launch", "searcher.cli", False, ["ui"]),
        ("def f():\n    import ui\n", "searcher.cli", False, ["ui"]),
        ("if TYPE_CHECKING:\n    from tests import x\n", "trials.a", False, ["tests"]),
        ("from . import _x", "storage._records", False, ["storage"]),
        ("from .._models import M", "storage.migrations.env", False, ["storage._models"]),
        ("from .views import page", "ui", True, ["ui.views"]),
        ("importlib.import_module('searcher.cli')", "ui.app", False, ["searcher.cli"]),
        ("subprocess.run([sys.executable, '-m', 'ui'])", "searcher.cli", False, []),
    ],
)
def test_every_kind_of_import_is_seen(
    source: str, module: str, is_package: bool, expected: list[str]
) -> None:
    assert [i.module for i in imports_of(source, module, is_package=is_package)] == expected


def test_a_broken_rule_is_named_with_its_file_and_line() -> None:
    source = (
        "import os\n\ndef later():\n    from trials import RuntimeSpec\n    import bench._common\n"
    )
    assert violations(source, "storage/mod.py", "storage.mod") == [
        "storage/mod.py:4: storage imports trials (storage imports none of them)",
        f"storage/mod.py:5: storage imports bench._common ({NOT_SHIPPED_RULE})",
    ]


# Layers of trials' sub-packages: what each may import besides ``storage`` and itself.
# "trials" is the package's own top-level modules (the experiment config, YAML and
# validation helpers, timings, labels, checkpoint retention, GPU detection), which
# every sub-package builds on. Each sub-package's ``__init__`` docstring says the same.
TRIALS_LAYERS: dict[str, frozenset[str]] = {
    "trials.config": frozenset(),
    "trials": frozenset({"trials.config"}),
    "trials.scheduler": frozenset({"trials", "trials.config"}),
    "trials.launch": frozenset({"trials", "trials.config", "trials.scheduler"}),
    "trials.pruning": frozenset({"trials", "trials.config"}),
    "trials.runtime": frozenset({"trials", "trials.config", "trials.launch", "trials.pruning"}),
    "trials.node": frozenset({"trials", "trials.config", "trials.launch", "trials.runtime"}),
    "trials.executors": frozenset(
        {"trials", "trials.config", "trials.scheduler", "trials.launch", "trials.node"}
    ),
    "trials.coordination": frozenset(
        {"trials", "trials.config", "trials.scheduler", "trials.launch", "trials.executors"}
    ),
    # The read model: what the CLI, the API and the UI ask of the database.
    "trials.queries": frozenset(
        {"trials", "trials.config", "trials.scheduler", "trials.coordination", "trials.pruning"}
    ),
}

# Layers of searcher: what each may import besides ``trials``, ``storage`` and itself.
# "searcher" is the package's own modules below its sub-packages (an experiment found
# by id or name and the user's error, the experiments' log folders); ``searcher.api``
# (the Python API) is a layer of its own, under the CLI; the package's ``__init__``
# re-exports the public names of all of them. Each sub-package's docstring says the same.
_SEARCHER_BELOW_DRIVER = frozenset({"searcher", "searcher.integrations", "searcher.submit"})
SEARCHER_LAYERS: dict[str, frozenset[str]] = {
    "searcher": frozenset(),
    "searcher.integrations": frozenset({"searcher"}),
    "searcher.submit": frozenset({"searcher", "searcher.integrations"}),
    "searcher.driver": _SEARCHER_BELOW_DRIVER,
    "searcher.diagnose": _SEARCHER_BELOW_DRIVER | {"searcher.driver"},
    "searcher.api": _SEARCHER_BELOW_DRIVER | {"searcher.driver"},
    "searcher.cli": _SEARCHER_BELOW_DRIVER
    | {"searcher.driver", "searcher.diagnose", "searcher.api"},
}

# Known exceptions; each entry fails the test once it is gone, so the lists only shrink.
KNOWN_PRIVATE_IMPORTS: frozenset[tuple[str, str]] = frozenset()
KNOWN_CYCLES: frozenset[frozenset[str]] = frozenset()


@dataclass(frozen=True)
class Edge:
    """``importer`` imports ``imported`` at ``where`` (``file:line``)."""

    importer: str
    imported: str
    where: str


def _target(modules: Mapping[str, Path], name: str) -> str | None:
    """The product module that importing ``name`` runs: itself, else its nearest package."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def edges_of(modules: Mapping[str, Path], module: str, source: str, where: str) -> list[Edge]:
    """The product modules ``module`` imports; ``from p import m`` of a submodule is ``p.m``.

    A package's ``__init__`` runs before any of its submodules, so it is an edge only
    where a name is taken from the package itself.

    Example:
        >>> mods = {m: Path() for m in ("p", "p.a", "p.b", "p._c")}
        >>> [e.imported for e in edges_of(mods, "p.a", "from p import b, X\\nimport p._c", "a.py")]
        ['p.b', 'p', 'p._c']
    """
    found: list[Edge] = []
    is_package = modules[module].name == "__init__.py"
    for imported in imports_of(source, module, is_package=is_package):
        candidates = [f"{imported.module}.{name}" for name in imported.names]
        targets = [
            _target(modules, name) if name in modules else _target(modules, imported.module)
            for name in candidates
        ] or [_target(modules, imported.module)]
        for target in dict.fromkeys(targets):
            if target is not None and target != module:
                found.append(Edge(module, target, f"{where}:{imported.line}"))
    return found


def product_modules() -> dict[str, Path]:
    """Every module of the four packages, by dotted name."""
    return {module_name(path): path for package in PACKAGES for path in package_modules(package)}


def product_edges(modules: Mapping[str, Path]) -> list[Edge]:
    """Every import between product modules, wherever it is in the importing module."""
    return [
        edge
        for module, path in modules.items()
        for edge in edges_of(
            modules,
            module,
            path.read_text(encoding="utf-8"),
            str(path.relative_to(REPO_ROOT)),
        )
    ]


def strongly_connected(nodes: Iterable[str], edges: Iterable[Edge]) -> list[frozenset[str]]:
    """The groups of two or more modules that import each other, directly or not (Tarjan)."""
    graph: dict[str, set[str]] = {node: set() for node in nodes}
    for edge in edges:
        graph.setdefault(edge.importer, set()).add(edge.imported)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[frozenset[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        # Iterative depth-first search: (node, its successors still to visit).
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, successors = work[-1]
            step = next(successors, None)
            if step is not None:
                if step not in index:
                    index[step] = low[step] = len(index)
                    stack.append(step)
                    on_stack.add(step)
                    work.append((step, iter(sorted(graph.get(step, ())))))
                elif step in on_stack:
                    low[node] = min(low[node], index[step])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                group = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    group.add(member)
                    if member == node:
                        break
                if len(group) > 1:
                    groups.append(frozenset(group))
    return groups


def describe_cycle(group: frozenset[str], edges: Iterable[Edge]) -> str:
    """One shortest cycle through ``group``: ``a (file:line) -> b (file:line) -> ... -> a``.

    Each ``file:line`` is where that module imports the next one.

    Example:
        >>> e = [Edge("a", "b", "a.py:3"), Edge("b", "a", "b.py:9")]
        >>> describe_cycle(frozenset({"a", "b"}), e)
        'a (a.py:3) -> b (b.py:9) -> a'
    """
    inside: dict[str, dict[str, str]] = {}
    for edge in edges:
        if edge.importer in group and edge.imported in group:
            inside.setdefault(edge.importer, {}).setdefault(edge.imported, edge.where)
    start = min(group)
    came_from: dict[str, str] = {}
    queue = deque([start])
    while queue:
        node = queue.popleft()
        if start in inside.get(node, {}):
            path = [node]
            while path[-1] != start:
                path.append(came_from[path[-1]])
            path.reverse()
            path.append(start)
            return " -> ".join(
                [f"{a} ({inside[a][b]})" for a, b in itertools.pairwise(path)] + [start]
            )
        for successor in sorted(inside.get(node, {})):
            if successor not in came_from and successor != start:
                came_from[successor] = node
                queue.append(successor)
    raise AssertionError(f"no cycle through {sorted(group)}")


def private_owner(imported: str) -> str | None:
    """The package whose private module ``imported`` is (None: nothing private in it).

    Example:
        >>> private_owner("trials.scheduler._cluster"), private_owner("trials.scheduler")
        ('trials.scheduler', None)
    """
    parts = imported.split(".")
    for at, part in enumerate(parts):
        if part.startswith("_") and not part.startswith("__"):
            return ".".join(parts[:at])
    return None


def private_imports(edges: Iterable[Edge]) -> list[str]:
    """Each import of another package's private module, with its file and line."""
    found = []
    for edge in edges:
        owner = private_owner(edge.imported)
        if owner is None or edge.importer == owner or edge.importer.startswith(owner + "."):
            continue
        if (edge.importer, edge.imported) not in KNOWN_PRIVATE_IMPORTS:
            found.append(
                f"{edge.where}: {edge.importer} imports {edge.imported}, private to {owner} "
                f"(re-export the name from {owner.replace('.', '/')}/__init__.py)"
            )
    return found


def layer_of(module: str, package: str, layers: Iterable[str]) -> str | None:
    """The layer of ``package`` that ``module`` belongs to, or None outside ``package``.

    A layer is a sub-package or a single module (``searcher.api``); the longest that
    contains ``module`` wins, and the package's other modules are the layer ``package``.

    Example:
        >>> layer_of("searcher.driver.running", "searcher", ["searcher", "searcher.driver"])
        'searcher.driver'
        >>> layer_of("searcher.logs", "searcher", ["searcher", "searcher.driver"])
        'searcher'
    """
    if module != package and not module.startswith(package + "."):
        return None
    inside = sorted((name for name in layers if name != package), key=len, reverse=True)
    return next((sub for sub in inside if module == sub or module.startswith(sub + ".")), package)


def layer_violations(
    edges: Iterable[Edge], layers: Mapping[str, frozenset[str]], package: str = "trials"
) -> list[str]:
    """Each import between ``package``'s layers that its layer may not make.

    Example:
        >>> layer_violations([Edge("trials.scheduler._core", "trials.launch.launcher", "x.py:4")],
        ...                  {"trials": frozenset(), "trials.scheduler": frozenset({"trials"}),
        ...                   "trials.launch": frozenset({"trials", "trials.scheduler"})})
        ['x.py:4: trials.scheduler imports trials.launch (it may import trials)']
    """
    found = []
    for edge in edges:
        if edge.importer == package:
            continue  # The package's __init__: its public names, re-exported from every layer.
        source = layer_of(edge.importer, package, layers)
        target = layer_of(edge.imported, package, layers)
        if source is None or target is None or source == target:
            continue
        if target not in layers[source]:
            allowed = ", ".join(sorted(layers[source])) or f"nothing else of {package}"
            found.append(f"{edge.where}: {source} imports {target} (it may import {allowed})")
    return found


def test_no_import_cycle_between_product_modules() -> None:
    modules = product_modules()
    edges = product_edges(modules)
    groups = strongly_connected(modules, edges)
    new = [describe_cycle(group, edges) for group in groups if group not in KNOWN_CYCLES]
    assert not new, "import cycles (imports inside functions included):\n" + "\n".join(new)
    gone = [sorted(group) for group in KNOWN_CYCLES if group not in groups]
    assert not gone, f"cycles no longer there: drop them from KNOWN_CYCLES: {gone}"


def test_no_import_of_another_packages_private_module() -> None:
    edges = product_edges(product_modules())
    broken = private_imports(edges)
    assert not broken, "imports of another package's private module:\n" + "\n".join(broken)
    seen = {(edge.importer, edge.imported) for edge in edges}
    gone = sorted(KNOWN_PRIVATE_IMPORTS - seen)
    assert not gone, f"no longer imported: drop them from KNOWN_PRIVATE_IMPORTS: {gone}"


@pytest.mark.parametrize(
    ("package", "layers"), [("trials", TRIALS_LAYERS), ("searcher", SEARCHER_LAYERS)]
)
def test_subpackages_follow_their_layers(
    package: str, layers: Mapping[str, frozenset[str]]
) -> None:
    subpackages = {
        module_name(path.parent) for path in (REPO_ROOT / package).glob("*/__init__.py")
    }
    modules = {module_name(path) for path in (REPO_ROOT / package).glob("*.py")}
    assert subpackages == set(layers) - {package} - modules, "every sub-package needs a layer"
    for subpackage in subpackages:
        init = REPO_ROOT / subpackage.replace(".", "/") / "__init__.py"
        docstring = ast.get_docstring(ast.parse(init.read_text(encoding="utf-8"))) or ""
        assert "May import" in docstring or "may import" in docstring, (
            f"{init}: the docstring must say what it may import"
        )
    broken = layer_violations(product_edges(product_modules()), layers, package)
    assert not broken, f"imports across {package}' layers:\n" + "\n".join(broken)


def test_a_cycle_is_named_with_every_import_on_it() -> None:
    modules = {name: Path(f"{name}.py") for name in ("a", "b", "c", "d")}
    sources = {
        "a": "import b\n",
        "b": "def later():\n    from c import x\n",
        "c": "if TYPE_CHECKING:\n    import a\n",
        "d": "import a\n",
    }
    edges = [
        edge
        for name, source in sources.items()
        for edge in edges_of(modules, name, source, f"{name}.py")
    ]
    (group,) = strongly_connected(modules, edges)
    assert describe_cycle(group, edges) == "a (a.py:1) -> b (b.py:2) -> c (c.py:2) -> a"


def test_a_private_import_is_named_with_its_file_and_line() -> None:
    edges = [
        Edge(
            "trials.executors._slurm", "trials.scheduler._cluster", "trials/executors/_slurm.py:48"
        ),
        Edge(
            "trials.scheduler._core", "trials.scheduler._cluster", "trials/scheduler/_core.py:63"
        ),
        Edge(
            "trials.scheduler._cluster_file", "trials._yaml", "trials/scheduler/_cluster_file.py:9"
        ),
    ]
    assert private_imports(edges) == [
        "trials/executors/_slurm.py:48: trials.executors._slurm imports "
        "trials.scheduler._cluster, private to trials.scheduler "
        "(re-export the name from trials/scheduler/__init__.py)"
    ]


# Issue 27's limits: a function longer than this does several jobs; a class longer than
# this holds several parts (split along them, as SlotScheduler and RunningTrials were).
MAX_FUNCTION_LINES = 100
MAX_CLASS_LINES = 400


def test_no_function_or_class_outgrows_its_job() -> None:
    too_long: list[str] = []
    for package in PACKAGES:
        for path in sorted((REPO_ROOT / package).rglob("*.py")):
            if "migrations" in path.parts:
                continue
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    limit = MAX_FUNCTION_LINES
                elif isinstance(node, ast.ClassDef):
                    limit = MAX_CLASS_LINES
                else:
                    continue
                lines = (node.end_lineno or node.lineno) - node.lineno + 1
                if lines > limit:
                    where = f"{path.relative_to(REPO_ROOT)}:{node.lineno}"
                    too_long.append(f"{where} {node.name}: {lines} lines (at most {limit})")
    assert not too_long, "\n".join(too_long)
