"""The rows of an attempt's processes, as its executor writes and ends them.

Every process of an attempt has a ``storage.TrialProcess`` row: the executor writes the
``torchrun`` rows at launch (:func:`record_launch`), rank 0 writes one row per rank once
the process group has formed. A row's ``ended_at`` is set only when a process is
confirmed gone: by the local executor, which checks pids against their kernel start
time and the run's launch token on this machine, or by an executor that confirmed the
whole run gone its own way (:func:`mark_processes_ended`). Ending a whole run through
the executor that started it is :mod:`trials.coordination.attempts`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from sqlalchemy import select

from storage import ProcessRole, TrialProcess, TrialRun, utcnow
from trials.launch.processes import (
    ProcessRef,
    end_processes,
    is_alive,
    is_local_host,
    processes_with_token,
)

if TYPE_CHECKING:
    from sqlalchemy.orm import Session

    from trials.launch.launcher import TrialProcesses


def record_launch(session: Session, run: TrialRun, processes: TrialProcesses) -> None:
    """Add a TORCHRUN row for each agent's ``torchrun`` of ``run``."""
    for command, ref in zip(processes.commands, processes.refs, strict=True):
        add_torchrun_row(
            session,
            run,
            agent=command.agent,
            host=command.host,
            slots=command.slots,
            pid=ref.pid,
            create_time=ref.create_time,
        )


def add_torchrun_row(
    session: Session,
    run: TrialRun,
    *,
    agent: str,
    host: str,
    slots: Sequence[int],
    pid: int,
    create_time: float,
) -> None:
    """Add the TORCHRUN row of one agent's ``torchrun`` of ``run``."""
    session.add(
        TrialProcess(
            run_id=run.id,
            trial_id=run.trial_id,
            attempt=run.attempt,
            role=ProcessRole.TORCHRUN,
            agent=agent,
            host=host,
            slots=list(slots),
            pid=pid,
            create_time=create_time,
        )
    )


def _open_rows(session: Session, run_ids: Sequence[int]) -> list[TrialProcess]:
    if not run_ids:
        return []
    return list(
        session.scalars(
            select(TrialProcess).where(
                TrialProcess.run_id.in_(run_ids), TrialProcess.ended_at.is_(None)
            )
        )
    )


def _ref(row: TrialProcess) -> ProcessRef:
    return ProcessRef(row.host, row.pid, row.create_time)


def end_local_processes(session: Session, run: TrialRun, *, grace_s: float = 0.0) -> bool:
    """The local executor's way to end ``run``: its recorded processes and its launch token.

    Marks the confirmed-gone process rows. A process on another host cannot be ended
    here: False is returned for it.
    """
    rows = _open_rows(session, [run.id])
    remote = [row for row in rows if not is_local_host(row.host)]
    survivors = end_processes(
        [_ref(row) for row in rows if is_local_host(row.host)],
        token=run.launch_token,
        grace_s=grace_s,
    )
    now = utcnow()
    still = {p.pid for p in survivors}
    for row in rows:
        if is_local_host(row.host) and row.pid not in still:
            row.ended_at = now
    return not survivors and not remote


def local_processes_gone(session: Session, run: TrialRun) -> bool:
    """Whether no recorded process of ``run`` and none with its launch token runs here.

    Process rows found dead are marked ended. A process on another host counts as
    running: this machine cannot see it.
    """
    now = utcnow()
    gone = True
    for row in _open_rows(session, [run.id]):
        alive = is_alive(_ref(row))
        if alive is False:
            row.ended_at = now
        else:
            gone = False
    if gone and run.ended_at is None and run.launch_token:
        gone = not processes_with_token(run.launch_token)
    return gone


def mark_processes_ended(session: Session, run: TrialRun) -> None:
    """Mark every process row of ``run`` ended (its executor confirmed the whole run gone)."""
    now = utcnow()
    for row in _open_rows(session, [run.id]):
        row.ended_at = now
