"""System metrics: an agent's host and GPU utilisation, sampled while trials run.

These are Determined's system metrics (CPU utilisation averaged across cores, host
memory, network and disk throughput, disk IOPS, and per GPU its utilisation and
memory), recorded per agent and, for GPUs, per GPU index. Host metrics come from
psutil; GPU metrics from NVML through nvidia-ml-py, when the NVML library is present.
Without it (a CPU-only agent) only host metrics are recorded.

Counters (network and disk bytes, disk operations) are turned into per-second rates
over each sampling interval; the arithmetic lives in pure functions
(:func:`rate_per_s`, :func:`counter_rates`, :func:`gpu_metrics`) so it is testable
without hardware.
"""

from __future__ import annotations

import dataclasses
import datetime
import logging
import threading
import time
from collections.abc import Callable, Iterable
from types import TracebackType
from typing import TYPE_CHECKING, Any

import psutil

if TYPE_CHECKING:
    from sqlalchemy.orm import Session

_log = logging.getLogger(__name__)

HOST_METRICS = (
    "cpu_util_percent",
    "memory_used_gb",
    "memory_available_gb",
    "memory_util_percent",
    "net_sent_bytes_s",
    "net_recv_bytes_s",
    "disk_read_bytes_s",
    "disk_write_bytes_s",
    "disk_iops",
)
GPU_METRICS = (
    "gpu_util_percent",
    "gpu_memory_used_gb",
    "gpu_memory_free_gb",
    "gpu_memory_util_percent",
)
# Decimal gigabytes, as disk and memory vendors (and Determined's UI) count them.
_BYTES_PER_GB = 1e9
# At stop, a last sample covers the time since the previous one, so a trial shorter
# than one interval still gets a sample; a shorter window than this says nothing.
_MIN_FINAL_WINDOW_S = 0.1


def detect_gpus() -> list[int]:
    """NVML indices of this host's GPUs; empty when NVML is absent (no GPU or driver).

    NVML sees every GPU of the host whatever ``CUDA_VISIBLE_DEVICES`` says, so these
    are the agent's slots, not the ones a process was given.

    Example:
        >>> gpus = detect_gpus()  # [] on a CPU-only host, [0, 1] on one with two GPUs
        >>> gpus == list(range(len(gpus)))
        True
    """
    import pynvml  # lazy: only agents that look for GPUs pay for it

    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as err:
        _log.debug("NVML is unavailable (%s); no GPUs detected", err)
        return []
    try:
        return list(range(pynvml.nvmlDeviceGetCount()))
    except pynvml.NVMLError as err:
        _log.warning("NVML could not count GPUs (%s); no GPUs detected", err)
        return []
    finally:
        pynvml.nvmlShutdown()


@dataclasses.dataclass(frozen=True)
class HostCounters:
    """Cumulative host counters at one moment; ``None`` where the host has no such counter.

    ``time_s`` is ``time.monotonic()``, so rates are immune to wall-clock changes.
    """

    time_s: float
    net_sent_bytes: int | None
    net_recv_bytes: int | None
    disk_read_bytes: int | None
    disk_write_bytes: int | None
    disk_ops: int | None


def read_host_counters() -> HostCounters:
    """The host's network and disk counters now (psutil handles counter wrap-around)."""
    net = psutil.net_io_counters()
    # Both are None on hosts (some containers) that expose no disks or NICs.
    disk = psutil.disk_io_counters()
    return HostCounters(
        time_s=time.monotonic(),
        net_sent_bytes=net.bytes_sent if net is not None else None,
        net_recv_bytes=net.bytes_recv if net is not None else None,
        disk_read_bytes=disk.read_bytes if disk is not None else None,
        disk_write_bytes=disk.write_bytes if disk is not None else None,
        disk_ops=disk.read_count + disk.write_count if disk is not None else None,
    )


def rate_per_s(before: float | None, after: float | None, elapsed_s: float) -> float | None:
    """How fast a cumulative counter grew, per second; ``None`` when that is unknowable.

    Unknowable: a counter missing from either sample, no time elapsed, or a counter
    that went backwards (reset, e.g. a NIC that came back).

    Example:
        >>> rate_per_s(1_000, 6_000, elapsed_s=2.0)
        2500.0
        >>> rate_per_s(6_000, 1_000, elapsed_s=2.0) is None
        True
    """
    if before is None or after is None or elapsed_s <= 0 or after < before:
        return None
    return (after - before) / elapsed_s


def counter_rates(before: HostCounters, after: HostCounters) -> dict[str, float]:
    """Per-second network and disk rates between two samples, by metric name.

    Rates that cannot be known (see :func:`rate_per_s`) are left out rather than
    recorded as a misleading 0.
    """
    elapsed = after.time_s - before.time_s
    pairs = {
        "net_sent_bytes_s": (before.net_sent_bytes, after.net_sent_bytes),
        "net_recv_bytes_s": (before.net_recv_bytes, after.net_recv_bytes),
        "disk_read_bytes_s": (before.disk_read_bytes, after.disk_read_bytes),
        "disk_write_bytes_s": (before.disk_write_bytes, after.disk_write_bytes),
        "disk_iops": (before.disk_ops, after.disk_ops),
    }
    rates = {}
    for name, (start, end) in pairs.items():
        rate = rate_per_s(start, end, elapsed)
        if rate is not None:
            rates[name] = rate
    return rates


def memory_metrics(total_bytes: int, available_bytes: int) -> dict[str, float]:
    """Host memory metrics; "used" is what is not available, so used / total = util.

    Example:
        >>> memory_metrics(total_bytes=16_000_000_000, available_bytes=12_000_000_000)
        {'memory_used_gb': 4.0, 'memory_available_gb': 12.0, 'memory_util_percent': 25.0}
    """
    used = total_bytes - available_bytes
    return {
        "memory_used_gb": used / _BYTES_PER_GB,
        "memory_available_gb": available_bytes / _BYTES_PER_GB,
        "memory_util_percent": 100.0 * used / total_bytes if total_bytes > 0 else 0.0,
    }


def gpu_metrics(
    util_percent: float | None, memory_used_bytes: int, memory_total_bytes: int
) -> dict[str, float]:
    """One GPU's metrics from NVML's readings; ``util_percent`` is None where unsupported.

    ``gpu_memory_util_percent`` is the share of memory in use (not NVML's memory
    bandwidth utilisation), the figure that says whether a larger batch would fit.

    Example:
        >>> gpu_metrics(87, memory_used_bytes=20_000_000_000, memory_total_bytes=80_000_000_000)
        {'gpu_memory_used_gb': 20.0, 'gpu_memory_free_gb': 60.0, 'gpu_memory_util_percent': 25.0, 'gpu_util_percent': 87.0}
    """
    metrics = {
        "gpu_memory_used_gb": memory_used_bytes / _BYTES_PER_GB,
        "gpu_memory_free_gb": (memory_total_bytes - memory_used_bytes) / _BYTES_PER_GB,
        "gpu_memory_util_percent": (
            100.0 * memory_used_bytes / memory_total_bytes if memory_total_bytes > 0 else 0.0
        ),
    }
    if util_percent is not None:
        metrics["gpu_util_percent"] = float(util_percent)
    return metrics


def host_metrics(before: HostCounters, after: HostCounters) -> dict[str, float]:
    """One sample of the host's metrics: CPU and memory now, counter rates since ``before``.

    CPU utilisation is psutil's since the calling thread's previous call (the first call
    of a thread primes it).
    """
    memory = psutil.virtual_memory()
    return {
        "cpu_util_percent": psutil.cpu_percent(interval=None),
        **memory_metrics(memory.total, memory.available),
        **counter_rates(before, after),
    }


def system_metric_rows(
    trial_id: int | None,
    agent: str,
    recorded_at: datetime.datetime,
    values: Iterable[tuple[int | None, str, float]],
) -> list[dict[str, Any]]:
    """The ``storage.SystemMetric`` rows of one sample: ``(gpu_index, name, value)`` each.

    The sampler writes these; bulk writers (the UI's test and benchmark data) build
    their rows here too, so the two cannot drift apart.

    Example:
        >>> when = datetime.datetime(2025, 1, 1)
        >>> system_metric_rows(7, "agent-0", when, [(None, "cpu_util_percent", 12.5)])[0]["name"]
        'cpu_util_percent'
    """
    return [
        {
            "trial_id": trial_id,
            "agent": agent,
            "gpu_index": gpu_index,
            "name": name,
            "value": value,
            "recorded_at": recorded_at,
        }
        for gpu_index, name, value in values
    ]


class _Nvml:
    """NVML handles for the sampler's thread; empty (host metrics only) without NVML."""

    def __init__(self) -> None:
        import pynvml

        self._pynvml: Any = pynvml
        self.handles: list[tuple[int, Any]] = []
        self._initialized = False
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as err:
            # Tried once per sampler, not per sample: a missing library stays missing.
            _log.info("NVML is unavailable (%s); recording host metrics only", err)
            return
        self._initialized = True
        try:
            self.handles = [
                (index, pynvml.nvmlDeviceGetHandleByIndex(index))
                for index in range(pynvml.nvmlDeviceGetCount())
            ]
        except pynvml.NVMLError as err:
            _log.warning("NVML could not list GPUs (%s); recording host metrics only", err)

    def sample(self) -> list[tuple[int, dict[str, float]]]:
        pynvml = self._pynvml
        samples = []
        for index, handle in self.handles:
            try:
                memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
            except pynvml.NVMLError as err:
                _log.debug("NVML memory of GPU %d unavailable: %s", index, err)
                continue
            try:
                util: float | None = pynvml.nvmlDeviceGetUtilizationRates(handle).gpu
            except pynvml.NVMLError:
                # Some devices (MIG instances) do not report utilisation.
                util = None
            samples.append((index, gpu_metrics(util, memory.used, memory.total)))
        return samples

    def close(self) -> None:
        if self._initialized:
            self._pynvml.nvmlShutdown()
            self._initialized = False


class SystemMetricsSampler:
    """A daemon thread that records the agent's system metrics every ``interval_s``.

    Each sample writes one ``storage.SystemMetric`` row per metric (GPU metrics carry
    their ``gpu_index``), all with the same ``recorded_at``. ``stop()`` takes a last
    sample covering the time since the previous one, so short trials get one too.
    A failed database write is logged and the sampler carries on: system metrics must
    never take a trial down. While the database is unreachable, samples are kept (up to
    :attr:`MAX_PENDING_SAMPLES`) and written once it is back. With an ``attempt``, each
    write is fenced like rank 0's records: once that attempt of the trial has been
    superseded, the sampler records nothing more.

    Example:
        >>> import time
        >>> with SystemMetricsSampler(url, trial_id=1, agent="local", interval_s=0.1):
        ...     time.sleep(0.3)  # the training
    """

    MAX_PENDING_SAMPLES = 1000

    def __init__(
        self,
        db_url: str,
        trial_id: int | None,
        agent: str,
        interval_s: float = 5.0,
        attempt: int | None = None,
    ) -> None:
        if not interval_s > 0:
            raise ValueError(f"interval_s must be > 0; got {interval_s!r}")
        self._db_url = db_url
        self._trial_id = trial_id
        self._attempt = attempt
        self._agent = agent
        self._interval_s = interval_s
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._failing = False
        self._superseded = False
        # Set by :meth:`finish`: the last sample is left for the caller to write.
        self._final_write_to_caller = False
        # Samples not yet written: (recorded_at, [(gpu_index, name, value), ...]).
        self._pending: list[tuple[Any, list[tuple[int | None, str, float]]]] = []

    def start(self) -> None:
        """Start sampling in a daemon thread (it never keeps the process alive)."""
        if self._thread is not None:
            raise RuntimeError("SystemMetricsSampler was already started")
        self._thread = threading.Thread(
            target=self._run, name=f"slotsweep-system-metrics-{self._agent}", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        """Take the last sample and wait for the thread to end; a no-op if not running."""
        self._stopping.set()
        if self._thread is not None:
            self._thread.join()

    def finish(self) -> Callable[[Session], None]:
        """Stop as :meth:`stop` does, but leave the last sample's write to the caller.

        Returns the write of what is still unwritten, for a transaction of the caller's
        that is fenced already (a trial's last, with its end: one commit less between
        two trials of a warm job). Like every write here it never fails the caller: a
        failed write is logged and rolled back alone.
        """
        self._final_write_to_caller = True
        self.stop()
        pending = list(self._pending)

        def write(session: Session) -> None:
            if self._superseded or not pending:
                return
            try:
                with session.begin_nested():
                    self._insert(session, pending)
            except Exception as err:
                _log.warning("could not record system metrics: %s", err)

        return write

    def __enter__(self) -> SystemMetricsSampler:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()

    def _run(self) -> None:
        nvml = _Nvml()
        try:
            # psutil measures CPU time since this thread's previous call; this primes it.
            psutil.cpu_percent(interval=None)
            before = read_host_counters()
            while not self._stopping.wait(self._interval_s):
                before = self._sample(before, nvml)
            if time.monotonic() - before.time_s >= _MIN_FINAL_WINDOW_S:
                self._sample(before, nvml, write=not self._final_write_to_caller)
        finally:
            nvml.close()

    def _sample(self, before: HostCounters, nvml: _Nvml, *, write: bool = True) -> HostCounters:
        """One sample since ``before``, written now (or, ``write`` False, left pending)."""
        from storage import utcnow

        after = read_host_counters()
        host = host_metrics(before, after)
        rows: list[tuple[int | None, str, float]] = [(None, k, v) for k, v in host.items()]
        for index, metrics in nvml.sample():
            rows.extend((index, name, value) for name, value in metrics.items())
        if write:
            self._write(rows)
        elif not self._superseded:
            self._pending.append((utcnow(), rows))
        return after

    def _write(self, rows: list[tuple[int | None, str, float]]) -> None:
        # Lazy: SQLAlchemy stays off the import path of ranks that never sample.
        from storage import (
            AttemptSupersededError,
            DatabaseUnavailableError,
            retry_transient,
            utcnow,
        )

        if self._superseded:
            return
        self._pending.append((utcnow(), rows))
        del self._pending[: -self.MAX_PENDING_SAMPLES]
        try:
            # Waiting longer than an interval would only delay the next sample.
            retry_transient(self._write_pending, deadline_s=self._interval_s)
        except AttemptSupersededError as err:
            _log.warning("%s; system metrics are no longer recorded", err)
            self._superseded = True
            self._pending.clear()
        except Exception as err:
            if not isinstance(err, DatabaseUnavailableError):
                self._pending.clear()  # the same rows would fail the same way again
            # Warn once per run of failures, not every interval.
            if not self._failing:
                _log.warning("could not record system metrics (will retry): %s", err)
            self._failing = True
        else:
            if self._failing:
                _log.info("recording system metrics again")
            self._failing = False

    def _write_pending(self) -> None:
        """One transaction writing every pending sample; safe to re-run after a lost commit."""
        from storage import claim_attempt, session_scope

        with session_scope(self._db_url) as session:
            if self._trial_id is not None and self._attempt is not None:
                claim_attempt(session, self._trial_id, self._attempt, progress=False)
            self._insert(session, self._pending)
        self._pending.clear()

    def _insert(
        self,
        session: Session,
        samples: list[tuple[Any, list[tuple[int | None, str, float]]]],
    ) -> None:
        """The rows of ``samples`` in ``session``; a sample written before is replaced."""
        from sqlalchemy import delete

        from storage import SystemMetric

        for recorded_at, rows in samples:
            # A sample is (trial, agent, time).
            session.execute(
                delete(SystemMetric).where(
                    SystemMetric.trial_id.is_(None)
                    if self._trial_id is None
                    else SystemMetric.trial_id == self._trial_id,
                    SystemMetric.agent == self._agent,
                    SystemMetric.recorded_at == recorded_at,
                )
            )
            session.add_all(
                SystemMetric(**row)
                for row in system_metric_rows(self._trial_id, self._agent, recorded_at, rows)
            )
