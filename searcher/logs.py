"""Where an experiment's logs go: a folder of its own, never shared with another database's.

``<SLOTSWEEP_LOG_DIR or ./slotsweep_logs>/experiment-<id>`` holds the driver's log, each
trial's log and TensorBoard's event files. Experiment ids count from 1 in every
database, so two databases used from one folder (``--db sqlite:///a.db`` and
``sqlite:///b.db``) both have an experiment 1, and their trials' lines would be appended
to the same files. The folder carries a marker naming the experiment it belongs to (its
id and creation time); an experiment that finds the plain name taken by another uses
``experiment-<id>-<created>`` instead. A folder without a marker (written before the
marker existed) goes to the first experiment that claims it.

Example:
    >>> import datetime
    >>> created = datetime.datetime(2026, 11, 26, 11, 45, 12, 345678)
    >>> experiment_log_dir(1, created, root=folder).name
    'experiment-1'
    >>> experiment_log_dir(1, created.replace(hour=12), root=folder).name
    'experiment-1-20261126T124512345678'
    >>> experiment_log_dir(1, created, root=folder).name
    'experiment-1'
"""

from __future__ import annotations

import datetime
import hashlib
import os
import tempfile
from pathlib import Path

from storage import Experiment, session_scope

#: The file in an experiment's log folder that names the experiment it belongs to.
MARKER = ".experiment"


def logs_root() -> Path:
    """``$SLOTSWEEP_LOG_DIR``, else ``./slotsweep_logs``, as an absolute path."""
    return Path(os.environ.get("SLOTSWEEP_LOG_DIR", "slotsweep_logs")).resolve()


def experiment_log_dir(
    experiment_id: int, created_at: datetime.datetime, root: Path | None = None
) -> Path:
    """The experiment's log folder under ``root`` (:func:`logs_root`), created and claimed.

    The same experiment gets the same folder on every call, also from another process.
    """
    root = logs_root() if root is None else root
    identity = f"{experiment_id} {created_at.isoformat()}"
    plain = root / f"experiment-{experiment_id}"
    if _claim(plain, identity):
        return plain
    # The creation time to the microsecond tells two databases' experiments apart.
    own = root / f"experiment-{experiment_id}-{created_at:%Y%m%dT%H%M%S%f}"
    _claim(own, identity)
    return own


def scratch_root(run_dir: Path) -> Path:
    """The experiment's scratch folder on every host, beside no other experiment's.

    Under the system's temporary folder, named by the experiment's log folder
    (:func:`experiment_log_dir`) and a digest of its path: two databases' experiment 1,
    or two log roots', never share one.

    Example:
        >>> scratch_root(Path("/runs/slotsweep_logs/experiment-3")).name
        'experiment-3-be44e422'
    """
    digest = hashlib.sha256(str(run_dir).encode()).hexdigest()[:8]
    return Path(tempfile.gettempdir()) / "slotsweep" / f"{run_dir.name}-{digest}"


def stored_experiment_log_dir(db_url: str, experiment_id: int) -> Path:
    """:func:`experiment_log_dir` of experiment ``experiment_id`` in ``db_url``."""
    with session_scope(db_url) as session:
        experiment = session.get(Experiment, experiment_id)
        if experiment is None:
            raise LookupError(f"no experiment {experiment_id} in the database")
        return experiment_log_dir(experiment.id, experiment.created_at)


def _claim(folder: Path, identity: str) -> bool:
    """Whether ``folder`` is the experiment's: its marker names it, or it had none and now
    does. The marker appears whole or not at all (a link to a written file), so another
    process never reads it half written."""
    folder.mkdir(parents=True, exist_ok=True)
    marker = folder / MARKER
    with tempfile.NamedTemporaryFile("w", dir=folder, prefix=".claim-", delete=False) as draft:
        draft.write(identity + "\n")
    try:
        os.link(draft.name, marker)
    except FileExistsError:
        return marker.read_text().strip() == identity
    finally:
        os.unlink(draft.name)
    return True
