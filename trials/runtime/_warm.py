"""The ranks' side of a warm job: hand the slots back after a trial, wait for the next one.

With ``resources.reuse_workers`` a trial that finished or was pruned does not end its
``torchrun`` job. Rank 0 marks the job idle in its ``storage.WarmJob`` row (the driver
sees the trial ended there, as it would see an exit code), then polls the row until
the driver writes the next trial's spec or asks the job to end, and broadcasts what it
found to every rank over the process group that stays formed. When the driver decided
the job's next trial ahead, rank 0 starts it in the hand-back's own transaction
(:mod:`trials.runtime._warm_ahead`) and waits for nothing. The hand-back is written in
the finished trial's last transaction, with its last records and its end
(:meth:`WarmChannel.hand_back_write`): one commit between two trials. Only rank 0
touches the database, as in a cold trial.

While rank 0 waits it broadcasts a keep-alive every second, so no rank sits in one
collective long enough for the group's timeout. An idle job whose driver stopped
heartbeating ends itself: nobody would hand it a trial, and its slots stay held until
its processes are gone.

The ranks of a warm job use it so (every rank of the job's process group takes part,
and ``next_trial`` waits for the driver, so no example runs it here)::

    channel = WarmChannel(spec, info)
    next_spec = channel.next_trial(spec.trial_id)
"""

from __future__ import annotations

import enum
import json
import os
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from trials.config import RuntimeSpec
from trials.launch.launcher import DB_URL_ENV_VAR
from trials.runtime._distributed import DistributedInfo, broadcast_object
from trials.runtime._warm_ahead import take_ahead

if TYPE_CHECKING:
    from sqlalchemy.orm import Session

# How often rank 0 looks for the next trial right after a hand-back, when the driver
# usually writes it (within tens of milliseconds): the warm hand-over's latency floor.
# One indexed read of the job's row each time, for a fraction of a second.
POLL_INTERVAL_S = 0.005
# For how long rank 0 looks that often; then every IDLE_POLL_INTERVAL_S (an idle job
# waiting for a trial of its shape should not keep a core busy).
FAST_POLL_FOR_S = 0.5
IDLE_POLL_INTERVAL_S = 0.02
# How often, while idle, rank 0 tells the other ranks to keep waiting.
KEEPALIVE_S = 1.0
# How often, while idle, rank 0 checks that the driver still heartbeats.
DRIVER_CHECK_S = 2.0


class _Message(enum.Enum):
    """What rank 0 tells the other ranks of a warm job, with a payload beside it."""

    WAIT = "wait"  # no trial yet: keep waiting (payload None)
    RUN = "run"  # the next trial (payload: its spec as JSON)
    END = "end"  # the job ends (payload: why)


class WarmChannel:
    """One warm job as its ranks see it; every rank makes one, only rank 0 uses the database."""

    def __init__(self, spec: RuntimeSpec, info: DistributedInfo) -> None:
        assert spec.warm is not None, "a warm channel needs a spec with `warm`"
        self.job_id = spec.warm.job_id
        self.driver_lease_s = spec.warm.driver_lease_s
        self.experiment_id = spec.experiment_id
        self.db_url = spec.db_url
        self.info = info
        self.end_reason: str | None = None
        # Set when the trial handed over was refused at its start (``storage.start_ranks``).
        self.fenced = False
        # (trial id, what the hand-back found), written in that trial's last transaction.
        self._handed_back: tuple[int, tuple[bool, str | None]] | None = None

    # ----------------------------------------------------------------- rank 0
    def hand_back(self, trial_id: int) -> tuple[bool, str | None]:
        """Rank 0: end trial ``trial_id`` on the job; whether it stays warm, and what runs next.

        In one transaction: the job's trial is over, and the trial its driver decided
        ahead starts on it if that decision still stands (:func:`take_ahead`): its spec,
        as JSON, comes back with True. Otherwise the job is idle (True, None) and waits
        for its driver. (False, None) when the job was asked to end meanwhile or no
        longer runs that trial (a driver ended it): the ranks then exit as a cold
        trial's would. A trial's runner writes it in the trial's last transaction
        instead (:meth:`hand_back_write`).
        """
        from storage import retry_transient, session_scope

        def write() -> tuple[bool, str | None]:
            with session_scope(self.db_url) as session:
                return self._hand_back_in(session, trial_id)

        return retry_transient(write)

    def hand_back_write(self, trial_id: int) -> Callable[[Session], object]:
        """Rank 0: the hand-back of trial ``trial_id`` as a write for the trial's runner.

        :func:`~trials.runtime.run_trial` runs it in the transaction that records the
        trial's end (``hand_back``), so the last records, the end and the next trial's
        start are one commit; :meth:`next_trial` then takes what it found.
        """
        self._handed_back = None

        def write(session: Session) -> None:
            self._handed_back = (trial_id, self._hand_back_in(session, trial_id))

        return write

    def _hand_back_in(self, session: Session, trial_id: int) -> tuple[bool, str | None]:
        """:meth:`hand_back`'s work, in the caller's transaction."""
        from sqlalchemy import select

        from storage import WarmJob, utcnow

        job = session.scalars(
            select(WarmJob).where(WarmJob.id == self.job_id).with_for_update()
        ).one_or_none()
        if (
            job is None
            or job.current_trial_id != trial_id
            or job.end_requested_at is not None
            or job.ended_at is not None
        ):
            return False, None
        spec = take_ahead(
            session,
            job,
            finished_trial_id=trial_id,
            driver_lease_s=self.driver_lease_s,
        )
        if spec is not None:
            return True, json.dumps(spec)
        job.current_run_id = job.current_trial_id = None
        job.idle_since = utcnow()
        job.trials_run = job.trials_run + 1
        return True, None

    def _poll(self) -> tuple[_Message, Any]:
        """Rank 0: one look at the job's row; the message for the other ranks.

        The look only reads; the job's next trial is taken, if there is one, in a
        transaction of its own that reads the row again.
        """
        from sqlalchemy import select, update

        from storage import (
            RanksFencedError,
            WarmJob,
            get_engine,
            retry_transient,
            session_scope,
            start_ranks,
        )

        def look() -> bool:
            # A deferred transaction: rank 0 looks every few milliseconds while its job is
            # idle, and the driver's writes that hand it the next trial must not queue
            # behind those looks for SQLite's write lock.
            with session_scope(get_engine(self.db_url, read_only=True)) as session:
                row = session.execute(
                    select(WarmJob.next_run_id, WarmJob.end_requested_at, WarmJob.ended_at).where(
                        WarmJob.id == self.job_id
                    )
                ).one_or_none()
            return (
                row is None
                or row.ended_at is not None
                or row.end_requested_at is not None
                or row.next_run_id is not None
            )

        if not retry_transient(look):
            return _Message.WAIT, None

        def read() -> tuple[_Message, Any]:
            with session_scope(self.db_url) as session:
                row = session.execute(
                    select(
                        WarmJob.next_run_id,
                        WarmJob.next_spec,
                        WarmJob.end_requested_at,
                        WarmJob.end_reason,
                        WarmJob.ended_at,
                    ).where(WarmJob.id == self.job_id)
                ).one_or_none()
                if row is None or row.ended_at is not None:
                    return _Message.END, "its warm job is over"
                if row.end_requested_at is not None:
                    return _Message.END, row.end_reason or "its driver ended the warm job"
                if row.next_run_id is None or row.next_spec is None:
                    return _Message.WAIT, None
                session.execute(
                    update(WarmJob)
                    .where(WarmJob.id == self.job_id, WarmJob.next_run_id == row.next_run_id)
                    .values(next_run_id=None, next_spec=None)
                )
                # The hand-over is a start like a cold launch's: fenced the same way.
                try:
                    with session.begin_nested():
                        start_ranks(session, row.next_spec["trial_id"], row.next_spec["attempt"])
                except RanksFencedError as fenced:
                    self.fenced = True
                    return _Message.END, str(fenced)
                return _Message.RUN, json.dumps(row.next_spec)

        return retry_transient(read)

    def _driver_alive(self) -> bool:
        import datetime as _dt

        from sqlalchemy import select

        from storage import Experiment, ExperimentState, session_scope, utcnow

        with session_scope(self.db_url) as session:
            row = session.execute(
                select(Experiment.state, Experiment.driver_heartbeat_at).where(
                    Experiment.id == self.experiment_id
                )
            ).one_or_none()
        if row is None or row.state != ExperimentState.ACTIVE or row.driver_heartbeat_at is None:
            return False
        return utcnow() - row.driver_heartbeat_at < _dt.timedelta(seconds=self.driver_lease_s)

    def _next_message(self) -> tuple[_Message, Any]:
        """Rank 0: wait for the next trial or the end, telling the others to wait meanwhile."""
        began = last_keepalive = last_driver_check = time.monotonic()
        while True:
            kind, payload = self._poll()
            if kind is not _Message.WAIT:
                return kind, payload
            now = time.monotonic()
            if now - last_driver_check >= DRIVER_CHECK_S:
                last_driver_check = now
                if not self._driver_alive():
                    return _Message.END, "its driver stopped heartbeating"
            if now - last_keepalive >= KEEPALIVE_S and self.info.distributed:
                broadcast_object((_Message.WAIT, None))
                last_keepalive = now
            time.sleep(POLL_INTERVAL_S if now - began < FAST_POLL_FOR_S else IDLE_POLL_INTERVAL_S)

    # ----------------------------------------------------------------- every rank
    def next_trial(
        self, trial_id: int, *, meanwhile: Callable[[], object] | None = None
    ) -> RuntimeSpec | None:
        """The next trial's spec on every rank, or None when the job must end.

        Collective: every rank of the job calls it once trial ``trial_id`` finished or
        was pruned; rank 0 hands the job back first, unless the trial's runner did in its
        last transaction (:meth:`hand_back_write`). ``meanwhile`` (the reset between
        trials) runs on every rank after that and before the ranks wait, so it overlaps
        the driver's turn-around instead of delaying the next trial's start.
        """
        if self.info.is_chief:
            handed, self._handed_back = self._handed_back, None
            if handed is not None and handed[0] == trial_id:
                staying, started = handed[1]
            else:
                staying, started = self.hand_back(trial_id)
            if meanwhile is not None:
                meanwhile()
            if started is not None:
                message: tuple[_Message, Any] = (_Message.RUN, started)
            elif staying:
                message = self._next_message()
            else:
                message = (_Message.END, "its driver ended the warm job")
            if self.info.distributed:
                broadcast_object(message)
        else:
            if meanwhile is not None:
                meanwhile()
            while True:
                message = broadcast_object(None)
                if message[0] is not _Message.WAIT:
                    break
        kind, payload = message
        if kind is _Message.END:
            self.end_reason = str(payload)
            return None
        fields = json.loads(payload)
        fields["db_url"] = os.environ.get(DB_URL_ENV_VAR, self.db_url)
        return RuntimeSpec.model_validate(fields)
