"""A warm job's processes going on as its next run's: the rows that say whose they are."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from storage._models import TrialProcess, TrialRun, WarmJob, utcnow


def end_earlier_processes(session: Session, job: WarmJob, run: TrialRun) -> list[TrialProcess]:
    """End the open process rows of ``job``'s runs but ``run``: the same processes are
    ``run``'s from here on, one trial's at a time. The rows ended, for a caller that
    records some of them again under ``run`` (rank 0 starting a trial decided ahead).

    Both hand-overs use it: the driver's (``trials.coordination.warm_jobs.hand_over``)
    and rank 0's (``trials.runtime``'s start of the trial decided ahead).
    """
    earlier = select(TrialRun.id).where(
        TrialRun.launch_token == job.launch_token, TrialRun.id != run.id
    )
    rows = list(
        session.scalars(
            select(TrialProcess).where(
                TrialProcess.run_id.in_(earlier), TrialProcess.ended_at.is_(None)
            )
        )
    )
    now = utcnow()
    for row in rows:
        row.ended_at = now
    return rows
