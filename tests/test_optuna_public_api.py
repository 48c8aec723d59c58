"""No code of the repository uses a private part of Optuna (issue 27).

Optuna may change its private modules and attributes in any release; the range in
``pyproject.toml`` only means something if slotsweep keeps to its public API (reads of
its tables go through ``storage.studies``, gated on their schema revision). Every
module of the packages, the tests and the benchmarks is parsed (not imported), and
each import of a private Optuna module, and each read of a private attribute Optuna's
study and trial objects carry, is reported by file and line.
"""

from __future__ import annotations

import ast
from pathlib import Path

import optuna

REPO_ROOT = Path(__file__).resolve().parents[1]
SCANNED = ("searcher", "trials", "storage", "ui", "tests", "bench", "examples")


def _private_attributes() -> frozenset[str]:
    """The private attribute names of the Optuna objects slotsweep handles."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study()
    trial = study.ask()
    study.tell(trial, 0.0)
    objects = (study, trial, study.trials[0], optuna.storages.InMemoryStorage())
    names = {name for obj in objects for name in vars(obj) if name.startswith("_")}
    return frozenset(name for name in names if not name.startswith("__"))


def _is_private_optuna_module(name: str) -> bool:
    parts = name.split(".")
    return parts[0] == "optuna" and any(part.startswith("_") for part in parts[1:])


def _uses(path: Path, private: frozenset[str]) -> list[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    where = path.relative_to(REPO_ROOT)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = (
                [node.module]
                if _is_private_optuna_module(node.module)
                else [f"{node.module}.{alias.name}" for alias in node.names]
            )
        elif (
            isinstance(node, ast.Attribute)
            and node.attr in private
            # An object's own attribute of the same name is its business, not Optuna's.
            and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"))
        ):
            found.append(f"{where}:{node.lineno}: reads Optuna's private attribute {node.attr}")
            continue
        else:
            continue
        found += [
            f"{where}:{node.lineno}: imports Optuna's private module {name}"
            for name in names
            if _is_private_optuna_module(name)
        ]
    return found


def test_no_private_optuna_module_or_attribute_is_used() -> None:
    private = _private_attributes()
    assert {"_trial_id", "_storage", "_study_id"} <= private
    files = [path for top in SCANNED for path in sorted((REPO_ROOT / top).rglob("*.py"))]
    assert len(files) > 100
    found = [use for path in files for use in _uses(path, private)]
    assert found == []
