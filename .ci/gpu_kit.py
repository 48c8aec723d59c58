"""Gather what the GPU checks need beyond torch into one folder (``.ci/gpu-wheels``).

A GPU machine often has a CUDA build of torch and no package index. This runs on a
machine that has one and writes, into ``DIR``:

- ``wheels/``: a wheel of every distribution the checks need for the GPU machine's
  Python (``--python``) and platform (``--arch``), torch and what only torch needs left
  out (the GPU machine has its own torch);
- ``requirements.txt``: those distributions, pinned (what ``.ci/gpu-check`` installs);
- ``slotsweep.tar.gz``: this repository's files as they are in the working tree;
- ``kit.json``: for which Python and platform, from which commit, when.

What is needed is derived, not listed by hand: ``pyproject.toml``'s dependencies (less
torch), its build requirements (the project is installed editable from the folder), and
of its ``dev`` extra the test tools the GPU checks use (:data:`GPU_CHECK_TOOLS`), each
pinned by ``.ci/constraints.txt`` where it pins it. pip resolves their closure for the
target (``pip install --dry-run --report``, which reads the wheels' metadata only), the
closure is walked from those roots without entering torch, and ``pip download
--no-deps`` fetches exactly that set.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Iterable
from pathlib import Path

import tomllib

try:
    from packaging.markers import default_environment
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name
except ImportError:  # pragma: no cover - pip always carries a copy
    from pip._vendor.packaging.markers import default_environment  # type: ignore[no-redef]
    from pip._vendor.packaging.requirements import Requirement  # type: ignore[no-redef]
    from pip._vendor.packaging.utils import canonicalize_name  # type: ignore[no-redef]

REPO = Path(__file__).resolve().parents[1]
# The GPU checks run pytest on the test files that hold `gpu` tests: pyproject's addopts
# pass --timeout (pytest-timeout), and tests/conftest.py imports hypothesis.
GPU_CHECK_TOOLS = ("pytest", "pytest-timeout", "hypothesis")
# The GPU machine has these already: its torch, with what its wheel requires.
PROVIDED = ("torch",)


def roots(pyproject: dict[str, object]) -> list[Requirement]:
    """The requirements the checks start from (see the module)."""
    project = pyproject["project"]
    assert isinstance(project, dict)
    wanted = [Requirement(r) for r in project["dependencies"]]
    dev = [Requirement(r) for r in project["optional-dependencies"]["dev"]]
    wanted += [r for r in dev if canonicalize_name(r.name) in GPU_CHECK_TOOLS]
    missing = set(GPU_CHECK_TOOLS) - {canonicalize_name(r.name) for r in wanted}
    if missing:
        sys.exit(f"gpu-wheels: pyproject.toml's dev extra has no {', '.join(sorted(missing))}")
    build = pyproject["build-system"]
    assert isinstance(build, dict)
    wanted += [Requirement(r) for r in build["requires"]]
    return [r for r in wanted if canonicalize_name(r.name) not in PROVIDED]


def target_options(python: str, arch: str) -> list[str]:
    """pip's options for wheels of CPython ``python`` (``3.12``) on manylinux ``arch``."""
    nodot = python.replace(".", "")
    platforms = [f"manylinux_2_{minor}_{arch}" for minor in (28, 27, 26, 24, 17, 12, 5)]
    platforms += [f"manylinux2014_{arch}", f"manylinux2010_{arch}", f"manylinux1_{arch}"]
    options = ["--only-binary=:all:", "--python-version", python, "--implementation", "cp"]
    options += ["--abi", f"cp{nodot}", "--abi", "abi3", "--abi", "none"]
    for platform in (*platforms, "any"):
        options += ["--platform", platform]
    return options


def marker_environment(python: str, arch: str) -> dict[str, str]:
    """Where the requirements' markers are evaluated: the GPU machine's Linux CPython."""
    environment = dict(default_environment())
    environment.update(
        python_version=python,
        python_full_version=f"{python}.0",
        implementation_name="cpython",
        implementation_version=f"{python}.0",
        platform_python_implementation="CPython",
        os_name="posix",
        sys_platform="linux",
        platform_system="Linux",
        platform_machine=arch,
    )
    return environment


def resolve(wanted: list[Requirement], options: list[str], constraints: Path | None) -> dict:
    """pip's resolution of ``wanted`` for the target, as its installation report."""
    with tempfile.TemporaryDirectory(prefix="gpu-wheels-") as tmp:
        report = Path(tmp) / "report.json"
        command = [
            sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed",
            "--quiet", "--target", str(Path(tmp) / "target"), "--report", str(report),
            *options,
        ]  # fmt: skip
        if constraints is not None:
            command += ["-c", str(constraints)]
        subprocess.run([*command, *map(str, wanted)], check=True)
        return json.loads(report.read_text())


def needed(
    report: dict, wanted: Iterable[Requirement], environment: dict[str, str]
) -> dict[str, str]:
    """The closure of ``wanted`` in pip's resolution, never entering a provided
    distribution: ``{name: version}``."""
    resolved = {
        canonicalize_name(item["metadata"]["name"]): item["metadata"] for item in report["install"]
    }
    chosen: dict[str, str] = {}
    seen: set[tuple[str, frozenset[str]]] = set()
    queue = [(canonicalize_name(r.name), frozenset(r.extras)) for r in wanted]
    while queue:
        name, extras = queue.pop()
        if name in PROVIDED or (name, extras) in seen:
            continue
        seen.add((name, extras))
        metadata = resolved.get(name)
        if metadata is None:
            sys.exit(f"gpu-wheels: pip's resolution lacks {name}")
        chosen[metadata["name"]] = metadata["version"]
        for text in metadata.get("requires_dist") or []:
            requirement = Requirement(text)
            marker = requirement.marker
            if marker is not None and not any(
                marker.evaluate({**environment, "extra": extra}) for extra in (*extras, "")
            ):
                continue
            queue.append((canonicalize_name(requirement.name), frozenset(requirement.extras)))
    return dict(sorted(chosen.items(), key=lambda item: canonicalize_name(item[0])))


def repository_files() -> list[str]:
    """This working tree's files: tracked and new ones, less what git ignores."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO,
        check=True,
        capture_output=True,
    ).stdout.decode()
    return sorted(name for name in listed.split("\0") if name and (REPO / name).is_file())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path, help="where the kit is written (created)")
    parser.add_argument(
        "--python",
        default=f"{sys.version_info.major}.{sys.version_info.minor}",
        help="the GPU machine's Python, MAJOR.MINOR (default: this one's)",
    )
    parser.add_argument("--arch", default="x86_64", choices=("x86_64", "aarch64"))
    args = parser.parse_args()
    if not args.python.replace(".", "").isdigit() or args.python.count(".") != 1:
        parser.error(f"--python: MAJOR.MINOR, e.g. 3.12, got {args.python!r}")
    folder: Path = args.folder.resolve()
    wheels = folder / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)

    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    wanted = roots(pyproject)
    options = target_options(args.python, args.arch)
    constraints = REPO / ".ci" / "constraints.txt"
    print(
        f"gpu-wheels: resolving {len(wanted)} requirements for CPython {args.python} {args.arch}"
    )
    report = resolve(wanted, options, constraints if constraints.exists() else None)
    pins = needed(report, wanted, marker_environment(args.python, args.arch))
    pinned = [f"{name}=={version}" for name, version in pins.items()]
    print(f"gpu-wheels: downloading {len(pinned)} wheels into {wheels}")
    subprocess.run(
        [
            sys.executable, "-m", "pip", "download", "--no-deps", "--quiet",
            "--dest", str(wheels), *options, *pinned,
        ],
        check=True,
    )  # fmt: skip
    (folder / "requirements.txt").write_text("\n".join(pinned) + "\n")

    files = repository_files()
    with tarfile.open(folder / "slotsweep.tar.gz", "w:gz") as archive:
        for name in files:
            archive.add(REPO / name, arcname=name)
    commit = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout.strip()
    dirty = bool(
        subprocess.run(
            ["git", "status", "--porcelain"], cwd=REPO, capture_output=True, text=True
        ).stdout.strip()
    )
    size = sum(p.stat().st_size for p in wheels.iterdir())
    kit = {
        "python": args.python,
        "arch": args.arch,
        "commit": commit + (" (with uncommitted changes)" if dirty else ""),
        "made": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "wheels": len(pinned),
        "wheels_mb": round(size / 1e6, 1),
        "repository_files": len(files),
    }
    (folder / "kit.json").write_text(json.dumps(kit, indent=2) + "\n")
    print(
        f"gpu-wheels: {folder}: {len(pinned)} wheels ({kit['wheels_mb']} MB), "
        f"requirements.txt, slotsweep.tar.gz ({len(files)} files), kit.json"
    )


if __name__ == "__main__":
    main()
