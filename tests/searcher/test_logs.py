"""Each experiment's log folder is its own, also with two databases used from one folder."""

from __future__ import annotations

import datetime
import threading
from pathlib import Path

import pytest

from searcher.logs import (
    MARKER,
    experiment_log_dir,
    scratch_root,
    stored_experiment_log_dir,
)
from storage import upgrade_schema
from tests.conftest import add_experiment

CREATED = datetime.datetime(2026, 11, 26, 11, 45, 12, 345678)


def test_an_experiment_keeps_its_folder_and_another_with_its_id_gets_its_own(
    tmp_path: Path,
) -> None:
    first = experiment_log_dir(1, CREATED, root=tmp_path)
    other = experiment_log_dir(1, CREATED + datetime.timedelta(microseconds=1), root=tmp_path)
    assert first == tmp_path / "experiment-1"
    assert other == tmp_path / "experiment-1-20261126T114512345679"
    # Asked again, in either order, each gets the folder it had.
    assert experiment_log_dir(1, CREATED + datetime.timedelta(microseconds=1), tmp_path) == other
    assert experiment_log_dir(1, CREATED, root=tmp_path) == first
    assert experiment_log_dir(2, CREATED, root=tmp_path) == tmp_path / "experiment-2"
    assert (first / MARKER).read_text() == f"1 {CREATED.isoformat()}\n"
    # No draft of a marker is left behind.
    assert sorted(p.name for p in first.iterdir()) == [MARKER]


def test_a_folder_from_before_the_marker_goes_to_the_first_experiment_that_claims_it(
    tmp_path: Path,
) -> None:
    old = tmp_path / "experiment-1"
    old.mkdir()
    (old / "trial-0.log").write_text("[rank 0] from an earlier version\n")
    assert experiment_log_dir(1, CREATED, root=tmp_path) == old
    assert (old / "trial-0.log").read_text() == "[rank 0] from an earlier version\n"
    assert experiment_log_dir(1, CREATED.replace(year=2027), root=tmp_path) != old


def test_experiments_claiming_one_name_at_once_never_share_it(tmp_path: Path) -> None:
    """Eight claimers, two experiments: every claimer of one experiment gets one folder,
    and the two experiments' folders differ."""
    created = [CREATED, CREATED.replace(minute=46)]
    found: list[tuple[int, Path]] = []
    start = threading.Barrier(8)

    def claim(which: int) -> None:
        start.wait()
        found.append((which, experiment_log_dir(7, created[which], root=tmp_path)))

    threads = [threading.Thread(target=claim, args=(i % 2,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    folders = {which: {folder for w, folder in found if w == which} for which in (0, 1)}
    assert all(len(f) == 1 for f in folders.values()), folders
    assert folders[0] != folders[1]
    assert tmp_path / "experiment-7" in folders[0] | folders[1]


def test_two_databases_in_one_folder_get_two_log_and_scratch_folders(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SLOTSWEEP_LOG_DIR", str(tmp_path / "logs"))
    folders = []
    for name in ("a", "b"):
        url = f"sqlite:///{tmp_path / name}.db"
        upgrade_schema(url)
        experiment_id, _ = add_experiment(url)
        assert experiment_id == 1  # ids count from 1 in every database
        folders.append(stored_experiment_log_dir(url, experiment_id))
    assert folders[0] == tmp_path / "logs" / "experiment-1"
    assert folders[1].parent == tmp_path / "logs" and folders[1] != folders[0]
    assert scratch_root(folders[0]) != scratch_root(folders[1])
    with pytest.raises(LookupError, match="no experiment 2"):
        stored_experiment_log_dir(f"sqlite:///{tmp_path / 'a'}.db", 2)
