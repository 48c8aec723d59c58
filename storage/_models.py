"""SQLAlchemy models of everything slotsweep records.

Table names carry a ``slotsweep_`` prefix because Optuna's own tables (``studies``,
``trials``, ...) live in the same database: one URL opens both, and any Optuna tool
(optuna-dashboard included) can read the study that a search created.
"""

from __future__ import annotations

import datetime as _dt
import enum
import uuid as _uuid
from typing import Any, ClassVar

from sqlalchemy import (
    JSON,
    BigInteger,
    DateTime,
    Enum,
    Float,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    UniqueConstraint,
    text,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship


def utcnow() -> _dt.datetime:
    """Timezone-naive UTC now; every timestamp in the database is naive UTC."""
    return _dt.datetime.now(_dt.timezone.utc).replace(tzinfo=None)


def utc_from_timestamp(seconds: float) -> _dt.datetime:
    """A POSIX timestamp (psutil's ``create_time``) as the database stores time: naive UTC.

    Example:
        >>> utc_from_timestamp(0.0)
        datetime.datetime(1970, 1, 1, 0, 0)
    """
    return _dt.datetime.fromtimestamp(seconds, _dt.timezone.utc).replace(tzinfo=None)


def _kernel_start_time(context: Any) -> _dt.datetime:
    """``TrialProcess.started_at`` unless given: the process's own start, from the kernel.

    Not the insert's time: a process may be recorded long after it started (rank 0
    records the ranks once the process group formed; a driver stopped by SIGSTOP
    records a ``torchrun`` that may have exited meanwhile), and the consistency check
    compares these times across trials.
    """
    return utc_from_timestamp(float(context.get_current_parameters()["create_time"]))


class Base(DeclarativeBase):
    """Declarative base of slotsweep's tables (never Optuna's)."""


class ExperimentState(str, enum.Enum):
    ACTIVE = "ACTIVE"
    PAUSED = "PAUSED"
    COMPLETED = "COMPLETED"
    CANCELED = "CANCELED"
    ERROR = "ERROR"

    @property
    def is_terminal(self) -> bool:
        return self in (ExperimentState.COMPLETED, ExperimentState.CANCELED, ExperimentState.ERROR)


class TrialState(str, enum.Enum):
    """A trial's life; COMPLETED, PRUNED and ERROR mirror Optuna's COMPLETE, PRUNED and FAIL.

    NOT_RUN ends a trial that was asked and never started (the experiment was killed or
    stopped first): no failure of the search. Optuna, which has no such state, hears
    FAIL for it (its samplers learn nothing from a FAIL).
    """

    QUEUED = "QUEUED"
    RUNNING = "RUNNING"
    COMPLETED = "COMPLETED"
    PRUNED = "PRUNED"
    ERROR = "ERROR"
    NOT_RUN = "NOT_RUN"

    @property
    def is_terminal(self) -> bool:
        return self in (
            TrialState.COMPLETED,
            TrialState.PRUNED,
            TrialState.ERROR,
            TrialState.NOT_RUN,
        )


class MetricKind(str, enum.Enum):
    TRAINING = "training"
    VALIDATION = "validation"


class CheckpointState(str, enum.Enum):
    """A checkpoint's life: written whole (COMPLETED), collected by retention (DELETED),
    or found damaged when a restore or retention verified it (CORRUPTED).

    A CORRUPTED checkpoint's files stay where they are, for inspection (its row's
    ``problem`` says what was wrong): retention never deletes it, and no restore,
    resume or download of a trial's newest checkpoint picks it again.
    """

    COMPLETED = "COMPLETED"
    DELETED = "DELETED"
    CORRUPTED = "CORRUPTED"


def _new_checkpoint_key() -> str:
    """A fresh random part of an experiment's checkpoint folder name (48 bits, hex).

    Example:
        >>> len(_new_checkpoint_key()), _new_checkpoint_key() != _new_checkpoint_key()
        (12, True)
    """
    return _uuid.uuid4().hex[:12]


def _enum(cls: type[enum.Enum]) -> Enum:
    # Stored as plain strings (no native ENUM type) so migrations stay simple on PostgreSQL.
    return Enum(cls, native_enum=False, length=16, validate_strings=True)


class Experiment(Base):
    __tablename__ = "slotsweep_experiments"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(255), index=True)
    study_name: Mapped[str] = mapped_column(String(512), unique=True)
    state: Mapped[ExperimentState] = mapped_column(_enum(ExperimentState), index=True)
    config: Mapped[dict[str, Any]] = mapped_column(JSON)
    config_path: Mapped[str | None] = mapped_column(Text)
    model_dir: Mapped[str] = mapped_column(Text)
    max_trials: Mapped[int] = mapped_column(Integer)
    created_at: Mapped[_dt.datetime] = mapped_column(DateTime, default=utcnow)
    ended_at: Mapped[_dt.datetime | None] = mapped_column(DateTime)
    # The driver that owns the search; a stale heartbeat means it died.
    driver_host: Mapped[str | None] = mapped_column(String(255))
    driver_pid: Mapped[int | None] = mapped_column(Integer)
    driver_heartbeat_at: Mapped[_dt.datetime | None] = mapped_column(DateTime)
    # Set by `slotsweep pause|kill` from another terminal; the driver polls it.
    requested_action: Mapped[str | None] = mapped_column(String(16))
    # Decided once, at creation: experiment ids count from 1 in every database, so the
    # id alone would give two databases' experiments one checkpoint folder. None for an
    # experiment created before revision 0013 (its folder stays ``<id>``).
    checkpoint_key: Mapped[str | None] = mapped_column(String(32), default=_new_checkpoint_key)

    trials: Mapped[list[Trial]] = relationship(back_populates="experiment")

    @property
    def checkpoint_folder(self) -> str:
        """The experiment's folder under ``checkpoint_storage.path``: ``<id>-<key>``.

        No other database's experiment has it (the key is random), so whatever is in it
        is this experiment's. An experiment from before revision 0013 keeps ``<id>``,
        a folder every database's experiment of that id may write to.
        """
        if self.checkpoint_key is None:
            return str(self.id)
        return f"{self.id}-{self.checkpoint_key}"

    @property
    def owns_checkpoint_folder(self) -> bool:
        """Whether nothing but this experiment writes in :attr:`checkpoint_folder`."""
        return self.checkpoint_key is not None


class Trial(Base):
    __tablename__ = "slotsweep_trials"
    __table_args__ = (UniqueConstraint("experiment_id", "optuna_trial_number"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    experiment_id: Mapped[int] = mapped_column(
        ForeignKey("slotsweep_experiments.id", ondelete="CASCADE"), index=True
    )
    optuna_trial_id: Mapped[int] = mapped_column(Integer)
    optuna_trial_number: Mapped[int] = mapped_column(Integer)
    state: Mapped[TrialState] = mapped_column(_enum(TrialState), index=True)
    hparams: Mapped[dict[str, Any]] = mapped_column(JSON)
    slots_per_trial: Mapped[int] = mapped_column(Integer)
    restarts: Mapped[int] = mapped_column(Integer, default=0)
    log_path: Mapped[str | None] = mapped_column(Text)
    searcher_metric_value: Mapped[float | None] = mapped_column(Float)
    total_batches: Mapped[int] = mapped_column(Integer, default=0)
    slot_seconds: Mapped[float] = mapped_column(Float, default=0.0)
    exit_code: Mapped[int | None] = mapped_column(Integer)
    error: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[_dt.datetime] = mapped_column(DateTime, default=utcnow)
    started_at: Mapped[_dt.datetime | None] = mapped_column(DateTime)
    ended_at: Mapped[_dt.datetime | None] = mapped_column(DateTime)
    # Written by rank 0 when the user's training finished normally, so that the outcome
    # does not depend on torchrun's exit code (gloo teardown can abort a finished rank).
    finished_at: Mapped[_dt.datetime | None] = mapped_column(DateTime)
    pruned_at: Mapped[_dt.datetime | None] = mapped_column(DateTime)

    experiment: Mapped[Experiment] = relationship(back_populates="trials")
    runs: Mapped[list[TrialRun]] = relationship(
        back_populates="trial", order_by="TrialRun.attempt"
    )


class TrialRun(Base):
    """One launch of a trial: the first run is attempt 0, each restart adds one."""

    __tablename__ = "slotsweep_trial_runs"
    __table_args__ = (UniqueConstraint("trial_id", "attempt"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    trial_id: Mapped[int] = mapped_column(
        ForeignKey("slotsweep_trials.id", ondelete="CASCADE"), index=True
    )
    attempt: Mapped[int] = mapped_column(Integer)
    started_at: Mapped[_dt.datetime] = mapped_column(DateTime, default=utcnow)
    ended_at: Mapped[_dt.datetime | None] = mapped_column(DateTime)
    exit_code: Mapped[int | None] = mapped_column(Integer)
    restored_from_checkpoint: Mapped[str | None] = mapped_column(String(64))
    restored_from_step: Mapped[int | None] = mapped_column(Integer)
    # One entry per agent of the launch: agent, host, slots, torchrun pid, spec path.
    agents: Mapped[list[dict[str, Any]]] = mapped_column(JSON, default=list)
    reason: Mapped[str | None] = mapped_column(Text)
    # Written by rank 0 with every record it commits; the driver ends a run whose
    # progress stops for longer than the experiment's ``hang_timeout_s``.
    progress_at: Mapped[_dt.datetime | None] = mapped_column(DateTime)
    # In the environment of every process of the run, so that a later driver finds
    # them even when it never learnt their pids (a crash right after the launch).
    launch_token: Mapped[str | None] = mapped_column(String(64))
    # Which executor started the run ("local", "slurm") and its own id for it (a
    # Slurm job or job step): a later driver ends leftovers through the same executor.
    executor: Mapped[str] = mapped_column(String(32), default="local", server_default="local")
    external_id: Mapped[str | None] = mapped_column(String(255))
    # Set by the driver to ask the run to checkpoint and stop (pause, preemption); rank
    # 0 reads it with its records, on whichever node it runs.
    stop_requested_at: Mapped[_dt.datetime | None] = mapped_column(DateTime)
    # The RuntimeSpec the run was launched with, without the database URL.
    spec: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    # Why the stop was asked for when it was not the owning driver's own pause, e.g.
    # "preempted by trial 4.0 (priority 1)": the owner requeues the trial without
    # counting a restart.
    stop_reason: Mapped[str | None] = mapped_column(Text)
    # The token of the slot claim the run was launched on (None: the cluster engine
    # placed it, or a claim made before claims had tokens). Every rank checks it before
    # it touches a device (``storage.start_ranks``).
    claim_token: Mapped[str | None] = mapped_column(String(64))
    # Set by the first rank that passed that check. A run with it set has processes
    # that may use its slots: whoever judges whether the run is gone must find them
    # gone; one without it can no longer start once its claim is gone or it is ended.
    ranks_started_at: Mapped[_dt.datetime | None] = mapped_column(DateTime)
    # Written by rank 0 just before the run's first batch (its start-up done): a
    # trial's compute (slot-seconds) counts each run from here to its last progress.
    training_started_at: Mapped[_dt.datetime | None] = mapped_column(DateTime)

    trial: Mapped[Trial] = relationship(back_populates="runs")
    processes: Mapped[list[TrialProcess]] = relationship(
        back_populates="run", order_by="TrialProcess.id"
    )


class TrialFailure(Base):
    """How one rank of a run failed: the exception, where, and how far the run had got.

    Written by each failing rank itself (before it exits), so the reason reaches the
    driver, ``slotsweep describe`` and the UI instead of staying in a log under
    torchrun's tracebacks. The driver reads them to tell a deterministic failure (the
    same error on every rank before any step completed: a bug, not bad luck) from one
    worth a restart.
    """

    __tablename__ = "slotsweep_trial_failures"

    #: The ``rank`` of a failure that a node's ``torchrun`` recorded itself, before it
    #: started any rank (its rendezvous port was taken, say).
    TORCHRUN_RANK: ClassVar[int] = -1

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    run_id: Mapped[int] = mapped_column(
        ForeignKey("slotsweep_trial_runs.id", ondelete="CASCADE"), index=True
    )
    trial_id: Mapped[int] = mapped_column(
        ForeignKey("slotsweep_trials.id", ondelete="CASCADE"), index=True
    )
    # The failing rank, or TORCHRUN_RANK.
    rank: Mapped[int] = mapped_column(Integer)
    # The exception's class name and first line, e.g. "ValueError", "bad shape".
    exception_type: Mapped[str] = mapped_column(String(255))
    message: Mapped[str] = mapped_column(Text)
    # The last frames of the traceback, as Python prints them.
    traceback: Mapped[str] = mapped_column(Text)
    # Optimizer steps this run had completed when the rank failed (0: failed at start).
    steps_completed: Mapped[int] = mapped_column(Integer, default=0)
    recorded_at: Mapped[_dt.datetime] = mapped_column(DateTime, default=utcnow)


class ProcessRole(str, enum.Enum):
    TORCHRUN = "torchrun"
    RANK = "rank"


class TrialProcess(Base):
    """One operating-system process of a trial run: a ``torchrun`` or one of its ranks.

    ``pid`` with ``create_time`` (the kernel's start time, as psutil reports it) names a
    process uniquely even after the pid is reused, so a later driver can tell whether a
    process of a dead driver's trial still runs. ``ended_at`` is when the process was
    last seen gone (its own exit, or a driver that confirmed it dead); an unset
    ``ended_at`` means "maybe still running".
    """

    __tablename__ = "slotsweep_trial_processes"
    __table_args__ = (Index("ix_trial_process_trial", "trial_id", "attempt"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    run_id: Mapped[int] = mapped_column(
        ForeignKey("slotsweep_trial_runs.id", ondelete="CASCADE"), index=True
    )
    trial_id: Mapped[int] = mapped_column(ForeignKey("slotsweep_trials.id", ondelete="CASCADE"))
    attempt: Mapped[int] = mapped_column(Integer)
    role: Mapped[ProcessRole] = mapped_column(_enum(ProcessRole))
    agent: Mapped[str] = mapped_column(String(255))
    host: Mapped[str] = mapped_column(String(255))
    # The slot ids the process uses: all of the agent's for torchrun, one for a rank.
    slots: Mapped[list[int]] = mapped_column(JSON, default=list)
    rank: Mapped[int | None] = mapped_column(Integer)
    local_rank: Mapped[int | None] = mapped_column(Integer)
    pid: Mapped[int] = mapped_column(Integer)
    create_time: Mapped[float] = mapped_column(Float)
    # The kernel's start time of the process (``create_time``), whenever it is recorded.
    started_at: Mapped[_dt.datetime] = mapped_column(DateTime, default=_kernel_start_time)
    ended_at: Mapped[_dt.datetime | None] = mapped_column(DateTime)

    run: Mapped[TrialRun] = relationship(back_populates="processes")


class Metric(Base):
    """One averaged metric value; re-recording the same key replaces it (see ``record_metrics``)."""

    __tablename__ = "slotsweep_metrics"
    __table_args__ = (
        UniqueConstraint("trial_id", "step", "kind", "name", name="uq_metric_key"),
        Index("ix_metric_trial_kind_name", "trial_id", "kind", "name", "step"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    trial_id: Mapped[int] = mapped_column(ForeignKey("slotsweep_trials.id", ondelete="CASCADE"))
    step: Mapped[int] = mapped_column(Integer)
    epoch: Mapped[float | None] = mapped_column(Float)
    kind: Mapped[MetricKind] = mapped_column(_enum(MetricKind))
    name: Mapped[str] = mapped_column(String(255))
    # NULL is NaN (a diverged loss): SQLite cannot store NaN, so it means one thing on
    # every backend. Infinities are stored as they are.
    value: Mapped[float | None] = mapped_column(Float)
    recorded_at: Mapped[_dt.datetime] = mapped_column(DateTime, default=utcnow)


class Checkpoint(Base):
    __tablename__ = "slotsweep_checkpoints"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    uuid: Mapped[str] = mapped_column(String(64), unique=True)
    trial_id: Mapped[int] = mapped_column(
        ForeignKey("slotsweep_trials.id", ondelete="CASCADE"), index=True
    )
    step: Mapped[int] = mapped_column(Integer)
    epoch: Mapped[float | None] = mapped_column(Float)
    path: Mapped[str] = mapped_column(Text)
    size_bytes: Mapped[int] = mapped_column(BigInteger, default=0)
    metrics: Mapped[dict[str, float]] = mapped_column(JSON, default=dict)
    state: Mapped[CheckpointState] = mapped_column(_enum(CheckpointState))
    created_at: Mapped[_dt.datetime] = mapped_column(DateTime, default=utcnow)
    # Why the checkpoint is CORRUPTED, in one line naming the file and what is wrong with
    # it ("state.pt: 64 bytes, its manifest says 6221"); None for any other state.
    problem: Mapped[str | None] = mapped_column(Text)


# A whole slot in the ledger's unit: a claim holds a whole number of eighths of its slot
# (``trials.config.EIGHTHS_PER_SLOT``; storage imports no other slotsweep package).
SLOT_EIGHTHS = 8


class Allocation(Base):
    """A slot, or a share of one, held by a trial.

    A whole-slot claim (``eighths`` 8) is unique per slot: that key is what stops two
    drivers holding one slot. Shares of one slot (``eighths`` 4, 2 or 1: a half, a
    quarter, an eighth) are rows of their own on the same slot; the ledger admits one
    only while the slot's rows add up to at most 8 eighths and none of them is whole,
    checked in the claiming transaction under the ledger's lock
    (``trials.coordination.allocations.claim``).
    """

    __tablename__ = "slotsweep_allocations"
    __table_args__ = (
        Index(
            "uq_slot_whole",
            "resource_pool",
            "agent",
            "slot",
            unique=True,
            sqlite_where=text(f"eighths = {SLOT_EIGHTHS}"),
            postgresql_where=text(f"eighths = {SLOT_EIGHTHS}"),
        ),
        Index("ix_slotsweep_allocations_slot", "resource_pool", "agent", "slot"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    resource_pool: Mapped[str] = mapped_column(String(255))
    agent: Mapped[str] = mapped_column(String(255))
    host: Mapped[str] = mapped_column(String(255))
    slot: Mapped[int] = mapped_column(Integer)
    # How much of the slot the claim holds, in eighths: 8 the whole slot (every row
    # before revision 0015), 4, 2 or 1 a share (``resources.slots_per_trial`` 0.5,
    # 0.25, 0.125). Integers, so the ledger's sums are exact.
    eighths: Mapped[int] = mapped_column(
        Integer, default=SLOT_EIGHTHS, server_default=str(SLOT_EIGHTHS)
    )
    trial_id: Mapped[int] = mapped_column(
        ForeignKey("slotsweep_trials.id", ondelete="CASCADE"), index=True
    )
    experiment_id: Mapped[int] = mapped_column(Integer, index=True)
    allocated_at: Mapped[_dt.datetime] = mapped_column(DateTime, default=utcnow)
    # Renewed by the owning driver; past it, another driver may reclaim the slot.
    lease_expires_at: Mapped[_dt.datetime] = mapped_column(DateTime, index=True)
    # Fences the claim: written by the decision (or warm reservation) that made it, and
    # checked by the launch in the transaction that records the trial's run. A launch
    # whose claim was reclaimed, or taken over by a later claim, finds no row with its
    # token and starts nothing (``trials.coordination.allocations.confirm_claim``).
    claim_token: Mapped[str | None] = mapped_column(String(64))
    # The warm job whose processes hold the slot (``resources.reuse_workers``). While
    # the job is idle ``trial_id`` is the last trial it ran; when a decision hands it
    # the next trial, the rows move to that trial, so the slot is never free between.
    warm_job_id: Mapped[int | None] = mapped_column(Integer, index=True)


class WarmJob(Base):
    """A trial's ``torchrun`` job kept alive to run the next trials of its shape.

    With ``resources.reuse_workers`` a trial that finished or was pruned hands its ranks
    back instead of exiting: rank 0 clears ``current_run_id`` (the job is idle). A
    placement decision reserves an idle job for the next waiting trial of the same shape
    (``reserved_trial_id``; the slot rows move to it) or asks it to end
    (``end_requested_at``) when no such trial waits or its slots are needed by another;
    the owning driver then writes the next run and spec (``next_run_id``,
    ``next_spec``), which rank 0 takes and broadcasts to every rank. While the job
    runs a trial its driver may decide its next ones ahead (``ahead_trial_id``, the
    first of them, and ``ahead``, their prepared starts in order): rank 0 then starts
    the first itself in its hand-back's transaction if the queue still gives it the
    job, and the next moves up. ``launch_token``
    is the token every process of the job carries (the first run's), so a later driver
    finds the job's processes after a crash.
    """

    __tablename__ = "slotsweep_warm_jobs"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    experiment_id: Mapped[int] = mapped_column(
        ForeignKey("slotsweep_experiments.id", ondelete="CASCADE"), index=True
    )
    resource_pool: Mapped[str] = mapped_column(String(255))
    slots: Mapped[int] = mapped_column(Integer)
    # One entry per agent ({"agent", "host", "slots"}), as a queue row's placement.
    placement: Mapped[list[dict[str, Any]]] = mapped_column(JSON)
    launch_token: Mapped[str] = mapped_column(String(64))
    started_at: Mapped[_dt.datetime] = mapped_column(DateTime, default=utcnow)
    current_trial_id: Mapped[int | None] = mapped_column(Integer)
    current_run_id: Mapped[int | None] = mapped_column(Integer)
    reserved_trial_id: Mapped[int | None] = mapped_column(Integer)
    next_run_id: Mapped[int | None] = mapped_column(Integer)
    next_spec: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    idle_since: Mapped[_dt.datetime | None] = mapped_column(DateTime)
    # The trials decided ahead to run next on the job, in order: the first one's id, and
    # every one's prepared start ([{"trial_id", "priority", "claim_token", "log_path",
    # "spec"}, ...]). Rank 0 starts the first at the hand-back and moves the next up.
    ahead_trial_id: Mapped[int | None] = mapped_column(Integer)
    ahead: Mapped[list[dict[str, Any]] | None] = mapped_column(JSON)
    trials_run: Mapped[int] = mapped_column(Integer, default=0)
    end_requested_at: Mapped[_dt.datetime | None] = mapped_column(DateTime)
    end_reason: Mapped[str | None] = mapped_column(Text)
    ended_at: Mapped[_dt.datetime | None] = mapped_column(DateTime, index=True)


class QueuedTrial(Base):
    """A trial waiting for slots, in the one queue every driver of the database shares.

    The owning driver writes the row when it queues the trial; a placement decision
    (made by whichever driver needs one, under the queue lock) claims the slots of the
    trials it places, whichever experiment they belong to, and writes ``placement``;
    the owning driver then deletes the row and starts the trial. ``reason`` says why a
    trial still waits, in plain words, as of the latest decision.
    """

    __tablename__ = "slotsweep_queue"
    # A decision rewrites the reason of a whole class of trials at once (one
    # experiment's trials of one size and priority wait alike).
    __table_args__ = (Index("ix_slotsweep_queue_class", "experiment_id", "slots", "priority"),)

    trial_id: Mapped[int] = mapped_column(
        ForeignKey("slotsweep_trials.id", ondelete="CASCADE"), primary_key=True
    )
    experiment_id: Mapped[int] = mapped_column(
        ForeignKey("slotsweep_experiments.id", ondelete="CASCADE")
    )
    resource_pool: Mapped[str] = mapped_column(String(255), index=True)
    slots: Mapped[int] = mapped_column(Integer)
    # Of each of those slots, in eighths: 8 whole slots; 4, 2 or 1 a share of one slot.
    eighths: Mapped[int] = mapped_column(
        Integer, default=SLOT_EIGHTHS, server_default=str(SLOT_EIGHTHS)
    )
    # Determined's convention: a lower number runs first.
    priority: Mapped[int] = mapped_column(Integer)
    # The experiment's fair-share weight (``resources.weight``).
    weight: Mapped[float] = mapped_column(Float, default=1.0)
    queued_at: Mapped[_dt.datetime] = mapped_column(DateTime, default=utcnow)
    # One entry per agent ({"agent", "host", "slots"}) once a decision placed it.
    placement: Mapped[list[dict[str, Any]] | None] = mapped_column(JSON)
    # The token of the slot claim behind ``placement`` (set and cleared with it).
    claim_token: Mapped[str | None] = mapped_column(String(64))
    reason: Mapped[str | None] = mapped_column(Text)
    decided_at: Mapped[_dt.datetime | None] = mapped_column(DateTime)


class Timing(Base):
    """A windowed aggregate of one profiled phase of the training loop (not one row per batch)."""

    __tablename__ = "slotsweep_timings"
    __table_args__ = (Index("ix_timing_trial_name", "trial_id", "name", "end_step"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    trial_id: Mapped[int] = mapped_column(ForeignKey("slotsweep_trials.id", ondelete="CASCADE"))
    name: Mapped[str] = mapped_column(String(64))
    start_step: Mapped[int] = mapped_column(Integer)
    end_step: Mapped[int] = mapped_column(Integer)
    count: Mapped[int] = mapped_column(Integer)
    mean_s: Mapped[float] = mapped_column(Float)
    p50_s: Mapped[float] = mapped_column(Float)
    p95_s: Mapped[float] = mapped_column(Float)
    total_s: Mapped[float] = mapped_column(Float)
    recorded_at: Mapped[_dt.datetime] = mapped_column(DateTime, default=utcnow)


class SystemMetric(Base):
    """Host or GPU utilisation sampled on an agent while a trial runs."""

    __tablename__ = "slotsweep_system_metrics"
    __table_args__ = (Index("ix_sysmetric_trial", "trial_id", "agent", "name", "recorded_at"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    trial_id: Mapped[int | None] = mapped_column(
        ForeignKey("slotsweep_trials.id", ondelete="CASCADE")
    )
    agent: Mapped[str] = mapped_column(String(255))
    gpu_index: Mapped[int | None] = mapped_column(Integer)
    name: Mapped[str] = mapped_column(String(64))
    value: Mapped[float] = mapped_column(Float)
    recorded_at: Mapped[_dt.datetime] = mapped_column(DateTime, default=utcnow)


class FusionChoice(Base):
    """The DDP bucket size ``optimizations.auto_tune_tensor_fusion`` chose for one model shape.

    One row per experiment, model shape (a digest of its parameters' shapes and dtypes)
    and world size: a later trial of the same search with the same shape and world size
    uses ``bucket_mb`` instead of probing again. The step times of each size tried are
    the measuring trial's ``Timing`` rows named ``tensor_fusion_<size>mb``.
    """

    __tablename__ = "slotsweep_fusion_choices"
    __table_args__ = (
        UniqueConstraint("experiment_id", "shape_key", "world_size", name="uq_fusion_choice"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    experiment_id: Mapped[int] = mapped_column(
        ForeignKey("slotsweep_experiments.id", ondelete="CASCADE")
    )
    shape_key: Mapped[str] = mapped_column(String(64))
    world_size: Mapped[int] = mapped_column(Integer)
    bucket_mb: Mapped[float] = mapped_column(Float)
    # What the exchange moves per optimizer step: the trained parameters and their
    # gradients' bytes before compression.
    parameters: Mapped[int] = mapped_column(BigInteger)
    gradient_bytes: Mapped[int] = mapped_column(BigInteger)
    # The trial whose probes chose it (its timings hold the step times).
    trial_id: Mapped[int | None] = mapped_column(
        ForeignKey("slotsweep_trials.id", ondelete="SET NULL")
    )
    recorded_at: Mapped[_dt.datetime] = mapped_column(DateTime, default=utcnow)


class Diagnosis(Base):
    """What ``slotsweep diagnose`` measured for one configuration, and its verdict.

    Linked to the experiment of the same configuration when one is named or found by
    name, else standalone. ``report`` is the whole ``--json`` document (probes, shares,
    scaling, the bucket sweep, the settings to try): its shape is
    ``searcher.diagnose.diagnosis.Report``, versioned by its ``format`` key.
    """

    __tablename__ = "slotsweep_diagnoses"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    experiment_id: Mapped[int | None] = mapped_column(
        ForeignKey("slotsweep_experiments.id", ondelete="SET NULL"), index=True
    )
    name: Mapped[str] = mapped_column(String(255))
    config_path: Mapped[str | None] = mapped_column(Text)
    # communication-bound, input-bound, compute-bound or scaling well.
    verdict: Mapped[str] = mapped_column(String(32))
    report: Mapped[dict[str, Any]] = mapped_column(JSON)
    created_at: Mapped[_dt.datetime] = mapped_column(DateTime, default=utcnow)
