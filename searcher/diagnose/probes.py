"""``slotsweep diagnose CONFIG``: why a distributed trial is slow, measured, with what to change.

Determined's guides tell users to find a bottleneck by hand (run with a large
``aggregation_frequency``, swap in synthetic data, compare one machine with two). This
runs those experiments for them: short probes of the experiment's own trial at one point
of its space (the first point, or ``--hparams``), each a real trial placed by the
scheduler on the configured slots and executor, driven by :class:`SearchDriver` as in
``slotsweep run --test`` (a temporary database and folders, removed afterwards; so
run it when the slots are free; on an executor whose ranks run on other hosts, the
temporary database is a schema of ``--db``'s PostgreSQL database and the temporary
folder, under ``$TMPDIR``, must be one the nodes share). The probes
(:func:`probe_plan`):

- ``configured``: as configured;
- ``no_exchange``: ``aggregation_frequency`` :data:`NO_EXCHANGE_AGGREGATION`;
- ``synthetic``: ``profiling.synthetic_data`` (the first batch again, on the device);
- ``one_slot``: one slot at the same per-slot batch; ``one_agent``: one agent's slots,
  where the configured size spans agents;
- ``buckets``: ``auto_tune_tensor_fusion`` (the bucket-size sweep, the parameter count
  and gradient bytes of a step);
- ``compression``: ``gradient_compression`` :data:`COMPRESSION` where none is
  configured, run last and only when the other probes found the trial
  communication-bound (the gain of the compression the verdict suggests).

Each throughput probe trains :data:`PROBE_BATCHES` batches (``--batches``, at least
:data:`MIN_PROBE_BATCHES`) timed in windows of :data:`WINDOW_BATCHES` (the first
window is warm-up and left out); every number is given as the median over the windows
and their range. ``--probes`` runs only some of the optional probes (``configured``
always runs). The conclusions are :mod:`searcher.diagnose.diagnosis`'s pure functions. The
diagnosis is stored in ``--db`` (``storage.Diagnosis``), linked to the latest
experiment of the same name if any.

Exit codes: 0 with a diagnosis, 1 when a probe failed (its trial's own error in one
line), 2 for bad input or a size the cluster cannot place (as ``run`` refuses it).
"""

from __future__ import annotations

import contextlib
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from rich import box
from rich.console import Console
from rich.table import Table
from sqlalchemy import func, make_url, select, text

import searcher.submit.samplers as samplers
import searcher.submit.space as space
from searcher.diagnose.diagnosis import (
    NO_EXCHANGE_AGGREGATION,
    Exchange,
    Probe,
    Report,
    Spread,
    Verdict,
    Window,
    efficiency,
    judge,
    share_removed,
    suggest,
)
from searcher.diagnose.smoke import failure_line, first_point, temporary_places
from searcher.driver.driver import SearchDriver
from searcher.experiments import UsageError
from searcher.submit.creation import create_experiment
from searcher.submit.submission import open_database, validate_run
from storage import (
    Diagnosis,
    Experiment,
    FusionChoice,
    SystemMetric,
    Timing,
    Trial,
    TrialState,
    get_engine,
    session_scope,
    upgrade_schema,
)
from trials.config import ConstHP, ExperimentConfig, load_config, parse_config
from trials.executors import Executor, database_problem, load_cluster

PROBE_BATCHES = 60
WINDOW_BATCHES = 10
# A warm-up window and three measured ones: fewer give no spread worth the name.
MIN_PROBE_BATCHES = 4 * WINDOW_BATCHES
# Every diagnosis runs these; the others may be chosen (``--probes``).
REQUIRED_PROBES = ("configured",)
OPTIONAL_PROBES = (
    "synthetic",
    "no_exchange",
    "one_slot",
    "one_agent",
    "buckets",
    "compression",
)
# The compression the ``compression`` probe measures: torch's fp16 hook, on every backend.
COMPRESSION = "fp16"
# The bucket sweep happens before the first batch; a couple of batches end the trial.
BUCKET_PROBE_BATCHES = 2
# The loop's phases that are the input pipeline (trials.runtime._timing.PHASES).
INPUT_PHASES = ("dataloader_next", "to_device")
SYSTEM_METRICS = ("cpu_util_percent", "gpu_util_percent", "gpu_memory_used_gb")
# Sampled often enough that a probe of a few seconds gets samples.
PROBE_SAMPLE_INTERVAL_S = 1.0


class ProbeFailed(RuntimeError):
    """A probe's trial failed; the message is its own error, in one line."""


@dataclass(frozen=True)
class PlannedProbe:
    """One probe to run: its name, what it changes, and the config it runs."""

    name: str
    description: str
    slots: int
    samples_per_step: int
    config: ExperimentConfig


def point_of(config: ExperimentConfig, assignments: Sequence[str]) -> dict[str, Any]:
    """Every hyperparameter's value at the probed point: constants, the first point of
    the space, then ``assignments`` (``key=value``, checked as ``enqueue`` checks them)."""

    words = dict(first_point(config))
    for word in assignments:
        key, sep, text = word.partition("=")
        if not sep or not key.strip():
            raise UsageError(f"--hparams: {word!r}: expected key=value")
        words[key.strip()] = text
    try:
        searched = (
            space.parse_enqueue_params(
                config.hyperparameters, [f"{k}={v}" for k, v in words.items()]
            )
            if words
            else {}
        )
    except ValueError as exc:
        raise UsageError(f"--hparams: {exc}") from None
    point = {
        name: hp.val for name, hp in config.hyperparameters.items() if isinstance(hp, ConstHP)
    }
    point.update(searched)
    return point


def probe_plan(
    config: ExperimentConfig,
    point: dict[str, Any],
    folder: Path,
    agent_slots: int,
    batches: int = PROBE_BATCHES,
) -> list[PlannedProbe]:
    """The probes for ``config`` at ``point`` (see the module); ``agent_slots`` is the
    largest agent's slot count in the pool, ``batches`` each throughput probe's length.
    Configs only: nothing runs."""
    slots = int(point.get("slots_per_trial", config.resources.slots))
    per_slot = int(point["global_batch_size"]) // slots

    def variant(
        probe_slots: int, length: int = batches, **changes: dict[str, Any]
    ) -> ExperimentConfig:
        values = {**point, "global_batch_size": per_slot * probe_slots}
        return _probe_config(config, values, probe_slots, length, folder, changes)

    def planned(
        name: str, description: str, probe_slots: int, cfg: ExperimentConfig
    ) -> PlannedProbe:
        return PlannedProbe(name, description, probe_slots, per_slot * probe_slots, cfg)

    plan = [
        planned("configured", "as configured", slots, variant(slots)),
        planned(
            "synthetic",
            "synthetic batches on the device",
            slots,
            variant(slots, profiling={"synthetic_data": True}),
        ),
    ]
    if slots > 1:
        plan.append(
            planned(
                "no_exchange",
                f"aggregation_frequency {NO_EXCHANGE_AGGREGATION}",
                slots,
                variant(slots, optimizations={"aggregation_frequency": NO_EXCHANGE_AGGREGATION}),
            )
        )
        plan.append(planned("one_slot", "1 slot, same per-slot batch", 1, variant(1)))
        if slots > agent_slots:
            plan.append(
                planned(
                    "one_agent",
                    f"{agent_slots} slots on one agent, same per-slot batch",
                    agent_slots,
                    variant(agent_slots),
                )
            )
        plan.append(
            planned(
                "buckets",
                "DDP bucket-size sweep",
                slots,
                variant(
                    slots, BUCKET_PROBE_BATCHES, optimizations={"auto_tune_tensor_fusion": True}
                ),
            )
        )
        if config.optimizations.gradient_compression == "none":
            plan.append(
                planned(
                    "compression",
                    f"gradient_compression {COMPRESSION}",
                    slots,
                    variant(slots, optimizations={"gradient_compression": COMPRESSION}),
                )
            )
    return plan


def _probe_config(
    config: ExperimentConfig,
    values: dict[str, Any],
    slots: int,
    batches: int,
    folder: Path,
    changes: dict[str, dict[str, Any]],
) -> ExperimentConfig:
    """``config`` as one probe: one trial of ``batches`` at the point ``values`` on
    ``slots``, profiled every batch, its checkpoints in ``folder``, the sections'
    ``changes`` applied."""
    raw: dict[str, Any] = config.model_dump(mode="json")
    if "slots_per_trial" in raw["hyperparameters"]:
        values = {**values, "slots_per_trial": slots}
    raw["hyperparameters"] = {
        name: {"type": "const", "val": value} for name, value in values.items()
    }
    raw["resources"].update(slots_per_trial=slots, reuse_workers=False)
    raw["searcher"].update(
        name="random",
        max_trials=1,
        max_concurrent_trials=1,
        max_length={"batches": batches},
        pruner={"name": "none"},
    )
    raw.update(
        min_validation_period={"batches": batches},
        min_checkpoint_period={"batches": batches},
        max_restarts=0,
    )
    raw["checkpoint_storage"]["path"] = str(folder / "checkpoints")
    raw["profiling"].update(
        enabled=True,
        window_batches=WINDOW_BATCHES,
        sync_every=1,
        system_metrics_interval_s=PROBE_SAMPLE_INTERVAL_S,
    )
    for section, fields in changes.items():
        raw[section].update(fields)
    return parse_config(raw)


def diagnose(
    config_path: Path,
    *,
    hparams: Sequence[str],
    only: Sequence[str] = (),
    batches: int = PROBE_BATCHES,
    cluster: str | Path | None,
    slots: int | None,
    db: str | None,
    out: TextIO | None = None,
) -> Report:
    """Run the probes and return the report (stored in ``db``); raises :class:`ProbeFailed`.

    ``only``: of the optional probes (:data:`OPTIONAL_PROBES`), run just these (all
    when empty); ``configured`` always runs, ``compression`` only after a
    communication-bound verdict. ``batches``: each throughput probe's length
    (:data:`MIN_PROBE_BATCHES` at least).

    Every probe config is validated against the cluster before the first one runs, so
    an unplaceable size is refused (``Unschedulable``) with nothing started.
    """

    out = out or sys.stderr
    unknown = sorted(set(only) - {*REQUIRED_PROBES, *OPTIONAL_PROBES})
    if unknown:
        raise UsageError(
            f"--probes: unknown probe {', '.join(unknown)}; allowed: "
            f"{', '.join((*REQUIRED_PROBES, *OPTIONAL_PROBES))}"
        )
    if batches < MIN_PROBE_BATCHES:
        raise UsageError(
            f"--batches: at least {MIN_PROBE_BATCHES} (a warm-up window and three measured "
            f"windows of {WINDOW_BATCHES}), got {batches}"
        )
    config_path = Path(config_path)
    config = load_config(config_path)
    point = point_of(config, hparams)
    loaded = load_cluster(cluster, slots=slots)
    db_url = open_database(db)
    # The configured size and the database are checked first, as `run` checks them.
    checked = validate_run(config, loaded, db_url)
    # resources.shrink_to_fit: the probes measure the size the run would have.
    config = checked.config
    for note in checked.notes:
        print(f"slotsweep diagnose: {note}", file=out, flush=True)
    with (
        tempfile.TemporaryDirectory(prefix="slotsweep-diagnose-") as tmp,
        probe_database(db_url, Path(tmp), checked.executor) as probe_db,
    ):
        folder = Path(tmp)
        pool = checked.pool
        agent_slots = max(agent.size for agent in pool.agents)
        plan = [
            p
            for p in probe_plan(config, point, folder, agent_slots, batches)
            if not only or p.name in only or p.name in REQUIRED_PROBES
        ]
        runs = [(p, validate_run(p.config, loaded, probe_db)) for p in plan]
        probes: list[Probe] = []
        exchange: Exchange | None = None
        with temporary_places(folder):
            for planned, validated in runs:
                # The plan's last: compression is what the verdict suggests when
                # exchanging is the bottleneck, so its gain is measured then only.
                if planned.name == "compression" and (
                    build_report(config, probes, exchange).verdict
                    is not Verdict.COMMUNICATION_BOUND
                ):
                    continue
                started = time.monotonic()
                out.write(f"slotsweep diagnose: probe {planned.name} ({planned.description}) ...")
                out.flush()
                try:
                    trial_id = _run_probe(planned, validated, config_path)
                finally:
                    out.write(f" {time.monotonic() - started:.1f} s\n")
                if planned.name == "buckets":
                    exchange = _exchange(probe_db, trial_id, config)
                else:
                    probes.append(_probe(planned, probe_db, trial_id))
    report = build_report(config, probes, exchange)
    _store(db_url, config, config_path, report)
    return report


@contextlib.contextmanager
def probe_database(db_url: str, folder: Path, executor: Executor) -> Iterator[str]:
    """Where the probes record, gone afterwards: an SQLite file in ``folder``; where the
    executor's ranks run on other hosts (they cannot share SQLite), a schema of its own
    in ``--db``'s PostgreSQL database, dropped at the end (on SQLite, refused as ``run``
    refuses it)."""
    local = f"sqlite:///{folder / 'probes.db'}"
    if database_problem(executor, local) is None:
        yield local
        return
    problem = database_problem(executor, db_url)
    if problem is not None:
        raise UsageError(problem)
    schema = f"slotsweep_diagnose_{uuid.uuid4().hex[:12]}"
    admin = get_engine(db_url)
    with admin.begin() as connection:
        connection.execute(text(f'CREATE SCHEMA "{schema}"'))
    # Every connection of the probes (the driver's, Optuna's, the ranks') finds its
    # tables there first.
    url = make_url(db_url).update_query_dict({"options": f"-csearch_path={schema}"})
    try:
        yield url.render_as_string(hide_password=False)
    finally:
        get_engine(url.render_as_string(hide_password=False)).dispose()
        with admin.begin() as connection:
            connection.execute(text(f'DROP SCHEMA "{schema}" CASCADE'))


def build_report(
    config: ExperimentConfig, probes: Sequence[Probe], exchange: Exchange | None
) -> Report:
    """The conclusions from measured probes (pure: :mod:`searcher.diagnose.diagnosis`)."""
    by_name = {p.name: p for p in probes}
    configured, synthetic = by_name["configured"], by_name.get("synthetic")
    no_exchange = by_name.get("no_exchange")
    one_slot, one_agent = by_name.get("one_slot"), by_name.get("one_agent")
    comm = None if no_exchange is None else share_removed(configured.step_s, no_exchange.step_s)
    inputs = None if synthetic is None else share_removed(configured.step_s, synthetic.step_s)
    scaling = (
        None
        if one_slot is None
        else efficiency(configured.samples_per_s, configured.slots, one_slot.samples_per_s)
    )
    agents = (
        None
        if one_agent is None
        else efficiency(
            configured.samples_per_s, configured.slots, one_agent.samples_per_s, one_agent.slots
        )
    )
    verdict = judge(
        communication_share=comm.median if comm else 0.0,
        input_share=inputs.median if inputs else 0.0,
        # Slots across agents that add little fall short of scaling well as slots do.
        efficiency=min((e.median for e in (scaling, agents) if e is not None), default=None),
    )
    tips = suggest(
        verdict,
        configured=configured,
        no_exchange=no_exchange,
        synthetic=synthetic,
        exchange=exchange,
        aggregation_frequency=config.optimizations.aggregation_frequency,
        compression=config.optimizations.gradient_compression,
        compressed=by_name.get("compression"),
    )
    return Report(
        name=config.name,
        slots=configured.slots,
        probes=tuple(probes),
        communication_share=comm,
        input_share=inputs,
        scaling_efficiency=scaling,
        agent_efficiency=agents,
        exchange=exchange,
        verdict=verdict,
        suggestions=tuple(tips),
    )


def _run_probe(planned: PlannedProbe, validated: Any, config_path: Path) -> int:
    """Drive the probe's one-trial search to its end; the trial's id (or ProbeFailed)."""

    experiment_id = create_experiment(
        planned.config,
        config_path=config_path,
        db_url=validated.db_url,
        directions=samplers.study_directions(planned.config),
    )
    SearchDriver(experiment_id, validated, show_progress=False).run()
    with session_scope(validated.db_url) as session:
        trial = session.scalars(select(Trial).where(Trial.experiment_id == experiment_id)).first()
        if trial is None:
            raise ProbeFailed(f"probe {planned.name}: the driver started no trial")
        if trial.state != TrialState.COMPLETED:
            raise ProbeFailed(f"probe {planned.name}: {failure_line(session, trial)}")
        return int(trial.id)


def _probe(planned: PlannedProbe, db_url: str, trial_id: int) -> Probe:
    """A probe's windows (the first left out as warm-up) and mean system metrics."""

    with session_scope(db_url) as session:
        rows = session.scalars(select(Timing).where(Timing.trial_id == trial_id)).all()
        system = {
            name: float(value)
            for name, value in session.execute(
                select(SystemMetric.name, func.avg(SystemMetric.value))
                .where(SystemMetric.trial_id == trial_id, SystemMetric.name.in_(SYSTEM_METRICS))
                .group_by(SystemMetric.name)
            )
        }
    grouped: dict[tuple[int, int], list[Any]] = {}
    for row in rows:
        if not row.name.startswith("tensor_fusion_"):
            grouped.setdefault((row.start_step, row.end_step), []).append(row)
    windows = []
    for (start, _), phases in sorted(grouped.items()):
        batches = max((r.count for r in phases if r.name == "train_batch"), default=0)
        warm_up = start == 0 and len(grouped) > 2
        if warm_up or batches == 0:
            continue
        input_s = sum(r.total_s for r in phases if r.name in INPUT_PHASES)
        train_s = sum(r.total_s for r in phases if r.name == "train_batch")
        other_s = sum(r.total_s for r in phases) - input_s - train_s
        windows.append(Window(batches, input_s, train_s, other_s))
    if not windows:
        raise ProbeFailed(f"probe {planned.name}: its trial recorded no timings")
    return Probe(
        planned.name,
        planned.description,
        planned.slots,
        planned.samples_per_step,
        tuple(windows),
        system,
    )


def _exchange(db_url: str, trial_id: int, config: ExperimentConfig) -> Exchange | None:
    """The bucket sweep's medians and what a step exchanges (the fusion choice's row)."""

    with session_scope(db_url) as session:
        choice = session.scalars(
            select(FusionChoice).where(FusionChoice.trial_id == trial_id)
        ).first()
        rows = session.scalars(
            select(Timing).where(Timing.trial_id == trial_id, Timing.name.like("tensor_fusion_%"))
        ).all()
        if choice is None or not rows:
            return None
        sweep = {
            # A size's passes are not windowed: its range is median to 95th percentile.
            float(r.name.removeprefix("tensor_fusion_").removesuffix("mb")): Spread(
                r.p50_s, r.p50_s, r.p95_s
            )
            for r in rows
        }
        return Exchange(
            parameters=choice.parameters,
            gradient_bytes=choice.gradient_bytes,
            world_size=choice.world_size,
            configured_bucket_mb=config.optimizations.tensor_fusion_threshold,
            sweep=sweep,
        )


def _store(db_url: str, config: ExperimentConfig, config_path: Path, report: Report) -> int:
    """Record the diagnosis, linked to the latest experiment of the same name; its id."""

    upgrade_schema(db_url)
    with session_scope(db_url) as session:
        experiment_id = session.scalar(
            select(Experiment.id)
            .where(Experiment.name == config.name)
            .order_by(Experiment.id.desc())
            .limit(1)
        )
        row = Diagnosis(
            experiment_id=experiment_id,
            name=config.name,
            config_path=str(config_path.resolve()),
            verdict=report.verdict.value,
            report=report.as_json(),
        )
        session.add(row)
        session.flush()
        return int(row.id)


def print_report(report: Report, console: Console) -> None:
    """The probe table, the exchange, the verdict in plain words and the settings to try.

    The table fits an 80-column terminal with the GPU columns: each probe's median on
    its row and, for the two per-window measures, the range over the windows on the
    line below it (the whole precision is in ``--json``).
    """
    table = Table(
        title=f"diagnose {report.name}: {report.slots} slot(s)",
        title_justify="left",
        caption="under each median: its range over the windows",
        caption_justify="left",
        box=box.SIMPLE_HEAD,
        show_edge=False,
        pad_edge=False,
        collapse_padding=True,
    )
    with_gpu = any("gpu_util_percent" in p.system for p in report.probes)
    # Units under the names: the headers are no wider than the numbers.
    columns = ["\nprobe", "\nslots", "\nsamples/s", "step\nms", "input\nms", "train\nms"]
    columns += ["cpu\n%", "gpu\n%", "gpu\nGB"] if with_gpu else ["cpu\n%"]
    for column in columns:
        table.add_column(column, justify="left" if column == "\nprobe" else "right", no_wrap=True)

    def metric(p: Probe, name: str) -> str:
        value = p.system.get(name)
        return "-" if value is None else f"{value:.3g}"

    for p in report.probes:
        split = p.split()
        samples, step = p.samples_per_s, p.step_s
        cells = [
            p.name,
            str(p.slots),
            f"{_grouped(samples.median)}\n{_short(samples.low)}-{_short(samples.high)}",
            f"{step.median * 1e3:.3g}\n{_short(step.low * 1e3)}-{_short(step.high * 1e3)}",
            f"{split['input_s'] * 1e3:.3g}",
            f"{split['train_batch_s'] * 1e3:.3g}",
            metric(p, "cpu_util_percent"),
        ]
        if with_gpu:
            cells += [metric(p, "gpu_util_percent"), metric(p, "gpu_memory_used_gb")]
        table.add_row(*cells)
    console.print(table)

    def pct(value: Spread | None) -> str:
        if value is None:
            return "not measured"
        return f"{value.median:.0%} ({value.low:.0%}-{value.high:.0%} over the windows)"

    console.print(f"communication share of a step: {pct(report.communication_share)}")
    console.print(f"input share of a step:         {pct(report.input_share)}")
    console.print(f"weak-scaling efficiency:       {pct(report.scaling_efficiency)}")
    if report.agent_efficiency is not None:
        console.print(f"several agents against one:    {pct(report.agent_efficiency)}")
    exchange = report.exchange
    if exchange is not None:
        sweep = ", ".join(
            f"{k:g} MB {v.median * 1e3:.3g} ms" for k, v in sorted(exchange.sweep.items())
        )
        console.print(
            f"exchange: {exchange.parameters:,} parameters, {exchange.gradient_bytes / 1e6:.3g} MB "
            f"of gradients per step over {exchange.world_size} ranks, all-reduce "
            f"{exchange.bandwidth_bytes_s / 1e6:.3g} MB/s at the best bucket size"
        )
        console.print(
            f"bucket sweep (exchange time): {sweep}; best {exchange.best_bucket_mb:g} MB "
            f"(configured {exchange.configured_bucket_mb:g} MB)"
        )
    console.print(f"verdict: {report.verdict.value}: {_VERDICT_WORDS[report.verdict.value]}")
    for tip in report.suggestions:
        gain = "gain not measured" if tip.gain is None else f"measured {tip.gain:.2f}x"
        console.print(f"  try {tip.setting} ({gain}): {tip.why}")


_VERDICT_WORDS = {
    "communication-bound": "exchanging gradients takes a large share of each step",
    "input-bound": "the step waits for its data",
    "compute-bound": "the step is spent computing, yet slots add less than they cost",
    "scaling well": "neither data nor gradient exchange holds the step back",
}


def _grouped(value: float) -> str:
    """A whole number with thousands separators, or :func:`_short`'s three digits from a
    million (``1,234,567`` is wider than the column).

    Example:
        >>> [_grouped(v) for v in (7441.4, 999_999.0, 13_653_333.0)]
        ['7,441', '999,999', '13.7M']
    """
    return f"{value:,.0f}" if abs(value) < 1e6 else _short(value, digits=3)


def _short(value: float, digits: int = 2) -> str:
    """``digits`` significant digits, thousands as ``k`` and millions as ``M``: a range's
    ends.

    Example:
        >>> [_short(v) for v in (0.00174, 13.2, 999.6, 1362.0, 150_000.0, 2.5e6)]
        ['0.0017', '13', '1000', '1.4k', '150k', '2.5M']
    """
    scaled, suffix = value, ""
    for scale, name in ((1e6, "M"), (1e3, "k")):
        if abs(value) >= scale:
            scaled, suffix = value / scale, name
            break
    # ``g`` with two digits writes 150 as 1.5e+02.
    whole = abs(scaled) >= 10**digits - 0.5
    return (f"{scaled:.0f}" if whole else f"{scaled:.{digits}g}") + suffix
