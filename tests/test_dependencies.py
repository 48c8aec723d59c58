"""The README's dependency rules, checked on every import of the shipped packages.

"Dependencies point one way: ``ui`` and ``searcher`` import ``trials`` and ``storage``;
``trials`` imports ``storage``; ``storage`` imports none of them." And no shipped
package imports the test or benchmark code, which is not installed.

Every module of the four packages is parsed (not imported: no process, no side effect)
and every import in it is checked: at module level, inside functions and
``TYPE_CHECKING`` blocks, ``import x.y``, ``from x import y``, relative imports resolved
against the module's package, and ``importlib.import_module("x")`` with a literal name.
Running a package as a program (``python -m ui``) is not an import and is allowed.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
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
    """One imported module (its full dotted name) and where the import is."""

    module: str
    line: int

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
            if node.level:
                yield Import(_resolve_relative(node, module, is_package), node.lineno)
            else:
                yield Import(node.module or "", node.lineno)
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
