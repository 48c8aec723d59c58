"""``.ci/gpu-wheels``' choice of what to carry to a GPU machine, on hand-made resolutions.

The gathering itself (pip resolving and downloading for another Python) and the
installation from the folder only are run by hand (README, "GPU checks"): they need
the index and a few minutes, which the suite does not spend.
"""

from __future__ import annotations

import importlib.util
from types import ModuleType
from typing import Any

import tomllib

from tests.conftest import REPO_ROOT


def load_kit() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gpu_kit", REPO_ROOT / ".ci" / "gpu_kit.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


KIT = load_kit()


def dist(name: str, version: str, *requires: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "version": version, "requires_dist": list(requires)}}


def test_the_roots_are_the_dependencies_build_requirements_and_test_tools_less_torch() -> None:
    pyproject = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())
    names = {r.name for r in KIT.roots(pyproject)}
    assert "torch" not in names
    assert {"optuna", "pytorch-optimizer", "nvidia-ml-py", "scikit-learn"} <= names
    assert {"pytest", "pytest-timeout", "hypothesis", "setuptools"} <= names
    assert not names & {"ray", "selenium", "moto", "mypy", "ruff", "mlflow-skinny"}


def test_the_closure_never_enters_torch_and_follows_markers_and_extras() -> None:
    report = {
        "install": [
            dist("pytorch_optimizer", "4.1", "torch>=2.1", "numpy"),
            dist("torch", "2.9", "sympy", "nvidia-nccl-cu12; platform_machine == 'x86_64'"),
            dist("sympy", "1.14", "mpmath"),
            dist("mpmath", "1.3"),
            dist("nvidia-nccl-cu12", "2.2"),
            dist("numpy", "2.4"),
            dist(
                "psycopg",
                "3.2",
                "psycopg-binary; extra == 'binary'",
                "tzdata; sys_platform == 'win32'",
            ),
            dist("psycopg-binary", "3.2"),
            dist("tzdata", "2025.1"),
            dist("optuna", "5.0", "sqlalchemy>=2", "colorlog", "tqdm; python_version < '3.0'"),
            dist("SQLAlchemy", "2.1", "typing-extensions"),
            dist("typing_extensions", "4.16"),
            dist("colorlog", "6.1"),
            dist("tqdm", "4.7"),
        ]
    }
    wanted = [KIT.Requirement(r) for r in ("pytorch-optimizer", "psycopg[binary]", "optuna")]
    chosen = KIT.needed(report, wanted, KIT.marker_environment("3.12", "x86_64"))
    assert chosen == {
        "colorlog": "6.1",
        "numpy": "2.4",
        "optuna": "5.0",
        "psycopg": "3.2",
        "psycopg-binary": "3.2",
        "pytorch_optimizer": "4.1",
        "SQLAlchemy": "2.1",
        "typing_extensions": "4.16",
    }


def test_the_target_asks_for_that_pythons_manylinux_wheels_only() -> None:
    options = KIT.target_options("3.12", "aarch64")
    assert options[:5] == [
        "--only-binary=:all:",
        "--python-version",
        "3.12",
        "--implementation",
        "cp",
    ]
    assert "cp312" in options and "manylinux_2_17_aarch64" in options and "any" in options
    assert not any("x86_64" in option for option in options)
