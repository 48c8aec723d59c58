"""Whether a recorded checkpoint can still be downloaded, and its bytes when it can.

A checkpoint is one file or a directory of files (zipped for download). Retention
deletes old checkpoints and marks them DELETED; a file can also vanish by hand. The
page says which, instead of failing.

Example:
    >>> checkpoint_problem("/no/such/ckpt.pt", "COMPLETED")
    'The checkpoint file is missing on disk: /no/such/ckpt.pt'
"""

from __future__ import annotations

import io
import zipfile
from pathlib import Path


def checkpoint_problem(path: str, state: str) -> str | None:
    """Why the checkpoint at ``path`` cannot be downloaded, or ``None`` if it can."""
    if state == "DELETED":
        return f"This checkpoint was deleted by the retention policy: {path}"
    if not Path(path).exists():
        return f"The checkpoint file is missing on disk: {path}"
    return None


def download_name(path: str, experiment: str, number: int, step: int) -> str:
    """The file name offered to the browser: ``<experiment>-<trial number>-step<N>``.

    The checkpoint's own name is a UUID, which says nothing once it sits among
    downloads; its suffix is kept (directories download as ``.zip``).

    Example:
        >>> download_name("/no/such/3f2a9c.pt", "mnist asha", 13, 400)
        'mnist-asha-13-step400.pt'
    """
    target = Path(path)
    suffix = ".zip" if target.is_dir() else "".join(target.suffixes)
    stem = "-".join(experiment.split()) or "experiment"
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in stem)
    return f"{safe}-{number}-step{step}{suffix}"


def checkpoint_bytes(path: str) -> bytes:
    """The checkpoint's file, or a zip of its directory."""
    target = Path(path)
    if not target.is_dir():
        return target.read_bytes()
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_STORED) as archive:
        for file in sorted(target.rglob("*")):
            if file.is_file():
                archive.write(file, file.relative_to(target))
    return buffer.getvalue()
