"""Whether a recorded checkpoint can still be downloaded, and its bytes when it can.

A checkpoint is one file or a directory of files (zipped for download), in a folder or
on object storage (``checkpoint_storage.path`` an ``s3://`` URL: read through
:func:`trials.store_for`, with the provider's credentials from the environment).
Retention deletes old checkpoints and marks them DELETED; a file can also vanish by
hand. The page says which, instead of failing.

Example:
    >>> checkpoint_problem("/no/such/ckpt.pt", "COMPLETED")
    'The checkpoint file is missing on disk: /no/such/ckpt.pt'
"""

from __future__ import annotations

import io
import zipfile
from pathlib import Path

import pandas as pd

from trials import is_url, store_for
from trials.labels import checkpoint_label


def checkpoint_problem(path: str, state: str) -> str | None:
    """Why the checkpoint at ``path`` cannot be downloaded, or ``None`` if it can."""
    if state == "DELETED":
        return f"This checkpoint was deleted by the retention policy: {path}"
    if is_url(path):
        try:
            complete = store_for(path).is_complete(path)
        except Exception as error:  # the provider's reason, on the page
            return f"The checkpoint cannot be read: {path}: {' '.join(str(error).split())}"
        return None if complete else f"The checkpoint is missing from storage: {path}"
    if not Path(path).exists():
        return f"The checkpoint file is missing on disk: {path}"
    return None


def skipped_lines(checkpoints: pd.DataFrame) -> list[str]:
    """One line per CORRUPTED checkpoint of ``checkpoints`` (a trial's, newest first, as
    :func:`trials.queries.checkpoints` reads them): which a restore skipped, and why.

    Example:
        >>> frame = pd.DataFrame({"uuid": ["635301b5-9c2e"], "step": [9], "state": ["CORRUPTED"],
        ...                       "problem": ["state.pt is missing"], "path": ["/c/635301b5-9c2e"]})
        >>> skipped_lines(frame)
        ['The checkpoint of step 9 (635301b5) was skipped as damaged: state.pt is missing. Its files are kept for inspection (/c/635301b5-9c2e); no restore uses it again.']
    """
    lines = []
    for row in checkpoints.itertuples():
        if row.state != "CORRUPTED":
            continue
        name = checkpoint_label(str(row.uuid), int(row.step))
        lines.append(
            f"{name[0].upper()}{name[1:]} was skipped as damaged: "
            f"{row.problem or 'no reason recorded'}. Its files are kept for inspection "
            f"({row.path}); no restore uses it again."
        )
    return lines


def download_name(path: str, experiment: str, number: int, step: int) -> str:
    """The file name offered to the browser: ``<experiment>-<trial number>-step<N>``.

    The checkpoint's own name is a UUID, which says nothing once it sits among
    downloads; its suffix is kept (directories and bucket prefixes download as ``.zip``).

    Example:
        >>> download_name("/no/such/3f2a9c.pt", "mnist asha", 13, 400)
        'mnist-asha-13-step400.pt'
        >>> download_name("s3://bucket/ckpts/3f2a9c", "mnist", 13, 400)
        'mnist-13-step400.zip'
    """
    target = Path(path)
    suffix = ".zip" if is_url(path) or target.is_dir() else "".join(target.suffixes)
    stem = "-".join(experiment.split()) or "experiment"
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in stem)
    return f"{safe}-{number}-step{step}{suffix}"


def checkpoint_bytes(path: str) -> bytes:
    """The checkpoint's file, or a zip of its files (a folder's or a bucket's, without the
    manifest the store keeps beside them)."""
    if not is_url(path) and not Path(path).is_dir():
        return Path(path).read_bytes()
    buffer = io.BytesIO()
    store = store_for(path)
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_STORED) as archive:
        for name in store.names(path):
            with store.read(path, name) as f:
                archive.writestr(name, f.read())
    return buffer.getvalue()
