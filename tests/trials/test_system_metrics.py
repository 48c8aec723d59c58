from __future__ import annotations

import logging
import subprocess
import time
from pathlib import Path

import pynvml
import pytest
import sqlalchemy as sa

from storage import SystemMetric, session_scope
from tests.conftest import add_experiment
from trials._system_metrics import (
    GPU_METRICS,
    HOST_METRICS,
    HostCounters,
    SystemMetricsSampler,
    counter_rates,
    detect_gpus,
    gpu_metrics,
    memory_metrics,
    rate_per_s,
)


def _counters(time_s: float, base: int | None) -> HostCounters:
    def value(offset: int) -> int | None:
        return None if base is None else base + offset

    return HostCounters(
        time_s=time_s,
        net_sent_bytes=value(0),
        net_recv_bytes=value(10),
        disk_read_bytes=value(20),
        disk_write_bytes=value(30),
        disk_ops=value(40),
    )


def test_rate_per_s_divides_growth_by_elapsed_time() -> None:
    assert rate_per_s(100, 600, 0.5) == 1000.0
    assert rate_per_s(100, 100, 2.0) == 0.0


@pytest.mark.parametrize(
    ("before", "after", "elapsed"),
    [(600, 100, 1.0), (None, 100, 1.0), (100, None, 1.0), (100, 200, 0.0), (100, 200, -1.0)],
)
def test_rate_per_s_is_unknown_for_resets_missing_counters_and_no_time(
    before: int | None, after: int | None, elapsed: float
) -> None:
    assert rate_per_s(before, after, elapsed) is None


def test_counter_rates_name_every_counter() -> None:
    rates = counter_rates(_counters(10.0, 1_000), _counters(12.0, 5_000))
    assert rates == {
        "net_sent_bytes_s": 2_000.0,
        "net_recv_bytes_s": 2_000.0,
        "disk_read_bytes_s": 2_000.0,
        "disk_write_bytes_s": 2_000.0,
        "disk_iops": 2_000.0,
    }
    assert set(rates) <= set(HOST_METRICS)


def test_counter_rates_leave_out_what_cannot_be_known() -> None:
    # No disks or NICs (some containers): nothing is recorded rather than a false 0.
    assert counter_rates(_counters(1.0, None), _counters(2.0, None)) == {}
    reset = HostCounters(2.0, 50, 5_000, 5_000, 5_000, 5_000)
    assert set(counter_rates(_counters(1.0, 1_000), reset)) == set(HOST_METRICS[5:]) | {
        "net_recv_bytes_s"
    }


def test_memory_metrics_are_consistent() -> None:
    metrics = memory_metrics(total_bytes=8_000_000_000, available_bytes=2_000_000_000)
    assert metrics == {
        "memory_used_gb": 6.0,
        "memory_available_gb": 2.0,
        "memory_util_percent": 75.0,
    }


def test_gpu_metrics() -> None:
    metrics = gpu_metrics(42, memory_used_bytes=3_000_000_000, memory_total_bytes=12_000_000_000)
    assert metrics == {
        "gpu_util_percent": 42.0,
        "gpu_memory_used_gb": 3.0,
        "gpu_memory_free_gb": 9.0,
        "gpu_memory_util_percent": 25.0,
    }
    assert set(metrics) == set(GPU_METRICS)


def test_gpu_metrics_without_utilisation_reading() -> None:
    metrics = gpu_metrics(None, memory_used_bytes=0, memory_total_bytes=1_000_000_000)
    assert "gpu_util_percent" not in metrics
    assert metrics["gpu_memory_util_percent"] == 0.0


def _nvml_answers() -> bool:
    """Whether NVML starts on this host (a GPU driver is there)."""
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return False
    pynvml.nvmlShutdown()
    return True


def test_detect_gpus_finds_none_where_nvml_cannot_start() -> None:
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as error:
        # NVML itself refuses (no driver, no library): detection must say "no GPU",
        # not fail.
        assert "NVML" in type(error).__name__
    else:
        pynvml.nvmlShutdown()
        pytest.skip(
            "NVML answers on this host: test_detect_gpus_counts_what_nvidia_smi_lists "
            "(marked gpu) checks what it finds"
        )
    assert detect_gpus() == []


@pytest.mark.gpu
def test_detect_gpus_counts_what_nvidia_smi_lists() -> None:
    """Against another program's answer: the GPUs the driver's own tool lists."""
    listed = subprocess.run(
        ["nvidia-smi", "--list-gpus"], capture_output=True, text=True, check=True, timeout=60
    ).stdout.splitlines()
    gpus = [line for line in listed if line.startswith("GPU ")]
    assert gpus
    assert detect_gpus() == list(range(len(gpus)))


def _rows(db_url: str) -> list[SystemMetric]:
    with session_scope(db_url) as session:
        return list(session.scalars(sa.select(SystemMetric).order_by(SystemMetric.id)))


def _wait_for_samples(db_url: str, samples: int) -> list[SystemMetric]:
    # A liveness deadline, not a timing assertion: generous for a loaded 2-core machine.
    deadline = time.monotonic() + 60
    while True:
        rows = _rows(db_url)
        if len({row.recorded_at for row in rows if row.name == "cpu_util_percent"}) >= samples:
            return rows
        assert time.monotonic() < deadline, "the sampler wrote no rows"
        time.sleep(0.05)


def _check_host_rows(rows: list[SystemMetric], trial_id: int | None) -> None:
    names = {row.name for row in rows}
    assert {"cpu_util_percent", "memory_used_gb", "memory_util_percent"} <= names
    assert names <= set(HOST_METRICS) | set(GPU_METRICS)
    assert {row.agent for row in rows} == {"agent-a"}
    assert {row.trial_id for row in rows} == {trial_id}
    by_name: dict[str, list[float]] = {}
    for row in rows:
        by_name.setdefault(row.name, []).append(row.value)
    for name, values in by_name.items():
        assert all(value >= 0 for value in values), name
        if name.endswith("_percent"):
            assert all(value <= 100 for value in values), name
    if not _nvml_answers():
        assert {row.gpu_index for row in rows} == {None}
        assert not names & set(GPU_METRICS)


def test_sampler_records_host_metrics(db_url: str) -> None:
    sampler = SystemMetricsSampler(db_url, trial_id=None, agent="agent-a", interval_s=0.05)
    sampler.start()
    try:
        rows = _wait_for_samples(db_url, samples=2)
    finally:
        sampler.stop()
    _check_host_rows(rows, trial_id=None)
    # One sample's rows share one timestamp, so the UI can line metrics up.
    first = rows[0].recorded_at
    assert {row.name for row in rows if row.recorded_at == first} >= {
        "cpu_util_percent",
        "memory_available_gb",
    }
    # A stopped sampler writes nothing more.
    count = len(_rows(db_url))
    time.sleep(0.2)
    assert len(_rows(db_url)) == count


def test_sampler_as_context_manager_records_for_a_trial(db_url: str) -> None:
    (trial_id,) = add_experiment(db_url)[1]
    with SystemMetricsSampler(db_url, trial_id=trial_id, agent="agent-a", interval_s=0.05):
        rows = _wait_for_samples(db_url, samples=2)
    _check_host_rows(rows, trial_id=trial_id)


def test_stop_records_a_last_sample_for_short_trials(db_url: str) -> None:
    # The interval never elapses; the sample taken at stop covers the whole run.
    with SystemMetricsSampler(db_url, trial_id=None, agent="agent-a", interval_s=3600):
        time.sleep(0.5)
    rows = _rows(db_url)
    assert {"cpu_util_percent", "net_sent_bytes_s"} <= {row.name for row in rows}
    _check_host_rows(rows, trial_id=None)


def test_finish_leaves_the_last_sample_to_the_callers_transaction(
    db_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Rank 0 writes its node's last sample with the trial's end (one commit, not two)."""
    sampler = SystemMetricsSampler(db_url, trial_id=None, agent="agent-a", interval_s=3600)
    sampler.start()
    time.sleep(0.3)
    write = sampler.finish()
    assert _rows(db_url) == []
    with session_scope(db_url) as session:
        write(session)
    rows = _rows(db_url)
    assert {"cpu_util_percent", "net_sent_bytes_s"} <= {row.name for row in rows}
    _check_host_rows(rows, trial_id=None)
    sampler.stop()  # already stopped: writes nothing more
    assert len(_rows(db_url)) == len(rows)
    # Like every write of the sampler's, a failed one never fails the caller's transaction.
    caplog.set_level(logging.WARNING, logger="trials._system_metrics")
    with session_scope(db_url) as session:
        session.execute(sa.text("DROP TABLE slotsweep_system_metrics"))
        write(session)
    assert any("could not record system metrics" in r.message for r in caplog.records)


def test_failed_writes_warn_once_and_do_not_stop_the_sampler(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # A database without the tables: every write fails, the sampler keeps going.
    url = f"sqlite:///{tmp_path / 'no_tables.db'}"
    caplog.set_level(logging.WARNING, logger="trials._system_metrics")
    sampler = SystemMetricsSampler(url, trial_id=None, agent="agent-a", interval_s=0.02)
    sampler.start()
    time.sleep(0.3)
    sampler.stop()
    assert sampler._thread is not None and not sampler._thread.is_alive()
    warnings = [r for r in caplog.records if "could not record system metrics" in r.message]
    assert len(warnings) == 1


def test_sampler_rejects_bad_interval_and_double_start(db_url: str) -> None:
    with pytest.raises(ValueError, match="interval_s must be > 0"):
        SystemMetricsSampler(db_url, trial_id=None, agent="a", interval_s=0)
    sampler = SystemMetricsSampler(db_url, trial_id=None, agent="a", interval_s=3600)
    sampler.stop()  # never started: nothing to do
    with sampler, pytest.raises(RuntimeError, match="already started"):
        sampler.start()
