"""Trial: hyperparameters, metric curves, checkpoints, restarts, log, profile, system metrics."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd
import streamlit as st

from storage import MetricKind
from trials import queries
from trials.config import ConstHP, format_share
from ui import _charts, _checkpoints, _context, _diagnosis, _format, _logs, _units

st.title("Trial")
engine = _context.require_database()

newest = queries.latest_trial_id(engine)
if newest is None:
    st.info("No trials yet. They appear here as soon as a search starts them.")
    st.stop()


def _requested_trial_id() -> tuple[int | None, str | None]:
    """The trial ``?trial=`` names (``EXPERIMENT.NUMBER``; an old link's database id) or why not."""
    raw = st.query_params.get("trial")
    ref = _context.parse_trial_ref(raw)
    if isinstance(ref, tuple):
        found = queries.trial_id(engine, ref[0], ref[1])
        if found is None:
            return None, f"Trial {raw} does not exist; showing the newest trial."
        return found, None
    if ref is None:
        return None, None if raw is None else f"Trial {raw!r} is not a trial; showing the newest."
    return ref, None  # An old link's database id: redirected below.


requested, missing = _requested_trial_id()
detail = queries.trial_detail(engine, requested if requested is not None else newest)
if detail is None:
    # A bare number is an old link's database id, which a user typing the trial number
    # of the logs (``?trial=0``) did not mean: the message says how trials are named.
    missing = missing or (
        f"Trial {st.query_params.get('trial')} does not exist (a trial is named "
        "EXPERIMENT.NUMBER as in the logs, e.g. ?trial=1.0); showing the newest trial."
    )
    detail = queries.trial_detail(engine, newest)
    if detail is None:  # Deleted between the two reads.
        st.stop()
if missing:
    st.warning(missing)
# Every address names the trial as the logs do; an old ``?trial=DATABASE_ID`` is rewritten.
ref = _context.trial_ref(detail["experiment_id"], detail["optuna_trial_number"])
if st.query_params.get("trial") != ref and not missing:
    st.query_params["trial"] = ref
trial_id: int = detail["id"]
shown: dict[str, Any] = detail

# Picking another trial: experiment, then its trial number.
choices = queries.experiment_choices(engine)
ids = [exp_id for exp_id, _ in choices]
if detail["experiment_id"] not in ids:
    choices.insert(0, (detail["experiment_id"], detail["experiment_name"]))
    ids.insert(0, detail["experiment_id"])
labels = dict(choices)
pick = st.columns([3, 1])
experiment_id = pick[0].selectbox(
    "Experiment",
    ids,
    index=ids.index(detail["experiment_id"]),
    format_func=lambda i: f"{labels[i]} (#{i})",
)
bounds = queries.trial_number_range(engine, experiment_id) or (0, 0)
default_number = (
    detail["optuna_trial_number"] if experiment_id == detail["experiment_id"] else bounds[0]
)
number = int(
    pick[1].number_input(
        "Trial number", min_value=bounds[0], max_value=bounds[1], value=default_number, step=1
    )
)
if (experiment_id, number) != (detail["experiment_id"], detail["optuna_trial_number"]):
    if queries.trial_id(engine, experiment_id, number) is not None:
        st.query_params["trial"] = _context.trial_ref(experiment_id, number)
        st.rerun()
    st.warning(f"Experiment #{experiment_id} has no trial number {number}.")
    st.stop()
st.page_link(
    _context.EXPERIMENT_PAGE,
    label=f"Back to experiment {detail['experiment_name']} (#{detail['experiment_id']})",
    query_params={"experiment": str(detail["experiment_id"])},
)


def _summary() -> None:
    info = queries.trial_detail(engine, trial_id)
    if info is None:
        st.warning(f"Trial {trial_id} no longer exists.")
        return
    metric = queries.metric_name(info["experiment_config"])
    ref = _context.trial_ref(info["experiment_id"], info["optuna_trial_number"])
    st.subheader(f"Trial #{info['optuna_trial_number']} of {info['experiment_name']}")
    # The state and the metric in a row of two, the counts in a row of four: at 1000 px
    # a column of a row of three cut "COMPLETED" short.
    top = st.columns(2)
    top[0].metric("State", info["state"])
    top[1].metric(metric, _format.number(info["searcher_metric_value"]))
    bottom = st.columns(4)
    bottom[0].metric("Slot·seconds", _format.number(info["slot_seconds"]))
    bottom[1].metric("Restarts", info["restarts"])
    bottom[2].metric("Batches", info["total_batches"])
    share = info["slot_share"]
    # A trial on a share of one slot shows its share (1/4); its slot-seconds count at it.
    bottom[3].metric("Slots", format_share(share) if share < 1.0 else info["slots_per_trial"])
    started = info["started_at"]
    ended = info["ended_at"]
    when = f"started {started:%Y-%m-%d %H:%M:%S} UTC" if started else "not started yet"
    st.caption(
        f"Trial {ref} (experiment #{info['experiment_id']}, Optuna trial number "
        f"{info['optuna_trial_number']}, as in the logs) · {when}"
    )
    if ended is not None:
        st.caption(f"Ended {ended:%Y-%m-%d %H:%M:%S} UTC, exit code {info['exit_code']}")
    if info["error"]:
        st.error(f"Error: {info['error']}")
    failure = queries.trial_failure(engine, int(info["id"]))
    if failure is not None:
        with st.expander(
            f"Traceback of {failure.who}, attempt {failure.attempt}: {failure.exception}",
            expanded=bool(info["error"]),
        ):
            st.code(failure.traceback, language=None)

    st.markdown("#### Hyperparameters")
    hparams = info["hparams"] or {}
    if hparams:
        st.dataframe(
            pd.DataFrame(
                {
                    "hyperparameter": list(hparams),
                    "value": [_format.number(v) for v in hparams.values()],
                    "exact value": [_format.full(v) for v in hparams.values()],
                }
            ),
            hide_index=True,
        )
    else:
        st.info("This trial has no hyperparameters recorded.")


def _metrics() -> None:
    st.markdown("#### Metrics")
    names = queries.metric_names(engine, trial_id)
    if names.empty:
        st.info(
            "No metrics recorded for this trial yet. Training metrics appear after the "
            "first reported batch, validation metrics after the first validation."
        )
        return
    axis = st.radio(
        "Step axis", ["batches", "epochs"], horizontal=True, key=f"metric_axis_{trial_id}"
    )
    for kind in (MetricKind.TRAINING, MetricKind.VALIDATION):
        of_kind = names[names["kind"] == kind.value]
        if of_kind.empty:
            st.caption(f"No {kind.value} metrics recorded.")
            continue
        chosen = st.multiselect(
            f"{kind.value.capitalize()} metrics",
            list(of_kind["name"]),
            default=list(of_kind["name"])[:4],
            key=f"metric_names_{trial_id}_{kind.value}",
        )
        curves = queries.metric_curves(engine, trial_id, kind, chosen)
        if curves.empty:
            continue
        use_epochs = axis == "epochs" and bool(curves["epoch"].notna().all())
        if axis == "epochs" and not use_epochs:
            st.caption("This trial did not record epochs for every step; the axis shows batches.")
        x = "epoch" if use_epochs else "step"
        # One chart per metric: loss and learning rate share no scale.
        charts = st.columns(2)
        for position, metric_name in enumerate(chosen):
            curve = curves.loc[curves["name"] == metric_name, [x, "value"]]
            with charts[position % 2]:
                st.markdown(f"**{metric_name}**")
                st.vega_lite_chart(
                    curve,
                    _charts.line_spec(
                        x=x,
                        y="value",
                        x_title="epoch" if use_epochs else "batch",
                        y_title=metric_name,
                    ),
                    height=260,
                    width="stretch",
                )
        st.caption(
            f"{kind.value.capitalize()} metrics averaged across ranks; "
            f"{int(of_kind['rows'].sum())} recorded values, drawn as {len(curves)} points."
        )


def _checkpoints_section() -> None:
    st.markdown("#### Checkpoints")
    frame = queries.checkpoints(engine, trial_id)
    if frame.empty:
        st.info("This trial has no checkpoints recorded.")
        return
    for line in _checkpoints.skipped_lines(frame):
        st.warning(line)
    problems = [
        _checkpoints.checkpoint_problem(path, state)
        for path, state in zip(frame["path"], frame["state"], strict=True)
    ]
    table = frame.assign(
        size_mb=frame["size_bytes"] / 1e6,
        on_disk=[p is None for p in problems],
    )
    metric_names = sorted({k for m in frame["metrics"] for k in (m or {})})
    for name in metric_names:
        table[f"m.{name}"] = [(m or {}).get(name) for m in frame["metrics"]]
    st.dataframe(
        table.drop(columns=["metrics", "size_bytes"]),
        hide_index=True,
        width="stretch",
        column_order=[
            "step",
            "epoch",
            "state",
            *[f"m.{n}" for n in metric_names],
            "size_mb",
            "on_disk",
            "problem",
            "path",
            "created_at",
            "uuid",
        ],
        column_config={
            "size_mb": st.column_config.NumberColumn("size (MB)", format="%.3f"),
            "created_at": st.column_config.DatetimeColumn("created (UTC)"),
        },
    )
    labels = {
        uuid: f"step {step} · {state} · {uuid[:8]}"
        for uuid, step, state in zip(frame["uuid"], frame["step"], frame["state"], strict=True)
    }
    chosen = st.selectbox(
        "Checkpoint to download",
        list(labels),
        format_func=labels.__getitem__,
        key=f"ckpt_{trial_id}",
    )
    row = frame[frame["uuid"] == chosen].iloc[0]
    problem = problems[int(frame.index[frame["uuid"] == chosen][0])]
    if problem is not None:
        st.warning(problem)
        return
    path = str(row["path"])
    st.download_button(
        f"Download checkpoint at step {int(row['step'])}",
        data=lambda: _checkpoints.checkpoint_bytes(path),
        file_name=_checkpoints.download_name(
            path, shown["experiment_name"], shown["optuna_trial_number"], int(row["step"])
        ),
        mime="application/octet-stream",
        on_click="ignore",
        key=f"download_{chosen}",
    )


def _restarts() -> None:
    st.markdown("#### Runs and restarts")
    runs = queries.trial_runs(engine, trial_id)
    if runs.empty:
        st.info("This trial has not been launched yet.")
        return
    restarts = len(runs) - 1
    running = pd.isna(runs["ended_at"].iloc[-1])
    if restarts == 0:
        st.caption(
            "First launch, still running." if running else "No restarts: the trial ran once."
        )
    else:
        st.caption(
            f"Restarted {restarts} time(s); each row is one launch"
            + (" (the last is still running)." if running else ".")
        )
    st.dataframe(
        runs,
        hide_index=True,
        width="stretch",
        column_config={
            "started_at": st.column_config.DatetimeColumn("started (UTC)"),
            "ended_at": st.column_config.DatetimeColumn("ended (UTC)"),
            # A Slurm job step ("JOB.STEP", executor slurm) or job ("JOB", executor
            # sbatch): what squeue and scancel name it.
            "external_id": st.column_config.TextColumn("Slurm job"),
        },
    )


def _log() -> None:
    st.markdown("#### Log")
    info = queries.trial_detail(engine, trial_id)
    log_path = info["log_path"] if info else None
    if not log_path:
        st.info("This trial has no log file recorded yet.")
        return
    if not Path(log_path).is_file():
        st.warning(f"The log file is missing on disk: {log_path}")
        return
    cols = st.columns(2)
    max_lines = cols[0].selectbox("Lines", [100, 500, 2000], key=f"log_lines_{trial_id}")
    lines = _logs.tail_lines(log_path, int(max_lines) * 4)
    ranks = _logs.ranks_in(lines)
    rank = cols[1].selectbox(
        "Rank",
        [None, *ranks],
        format_func=lambda r: "all ranks" if r is None else f"rank {r}",
        key=f"log_rank_{trial_id}",
    )
    shown = _logs.filter_rank(lines, rank)[-int(max_lines) :]
    st.caption(f"Last {len(shown)} lines of `{log_path}`.")
    st.code(
        "\n".join(shown) or "(no lines)",
        language=None,
        height=420 if len(shown) > 20 else "content",
    )


def _profile() -> None:
    st.markdown("#### Profiling timings")
    breakdown = queries.timing_breakdown(engine, trial_id)
    if breakdown.empty:
        st.info(
            "Profiling timings not recorded for this trial (profiling disabled, or no "
            "window of batches has finished yet)."
        )
        return
    # Per-batch phases take milliseconds: shown in ms, totals in seconds.
    per_batch = ["mean_s", "p50_s", "p95_s"]
    breakdown[per_batch] = breakdown[per_batch] * 1e3
    st.dataframe(
        breakdown,
        hide_index=True,
        width="stretch",
        column_config={
            "mean_s": st.column_config.NumberColumn("mean (ms)", format="%.3f"),
            "p50_s": st.column_config.NumberColumn("p50 (ms)", format="%.3f"),
            "p95_s": st.column_config.NumberColumn("p95 (ms, worst window)", format="%.3f"),
            "total_s": st.column_config.NumberColumn("total (s)", format="%.2f"),
            "share": st.column_config.ProgressColumn(
                "share of time", min_value=0.0, max_value=1.0, format="percent"
            ),
        },
    )
    series = queries.timing_series(engine, trial_id)
    if not series.empty:
        series = series.assign(mean_ms=series["mean_s"] * 1e3)
        st.vega_lite_chart(
            series[["name", "end_step", "mean_ms"]],
            _charts.line_spec(
                x="end_step",
                y="mean_ms",
                color="name",
                x_title="batch (window end)",
                y_title="mean per batch (ms)",
                y_format=",.3~f",
            ),
            height=300,
            width="stretch",
        )


def _system() -> None:
    st.markdown("#### System metrics")
    summary = queries.system_metric_summary(engine, trial_id)
    if summary.empty:
        st.info(
            "System metrics not recorded for this trial (no sampler ran on its agents, "
            "or NVML/psutil were unavailable)."
        )
        return
    units = [_units.system_unit(str(name)) for name in summary["name"]]
    scales = [unit.scale for unit in units]
    summary = summary.assign(
        gpu=[("host" if pd.isna(g) else f"GPU {int(g)}") for g in summary["gpu_index"]],
        unit=[unit.label for unit in units],
        mean=summary["mean"] * scales,
        max=summary["max"] * scales,
    ).drop(columns=["gpu_index"])
    st.dataframe(
        summary,
        hide_index=True,
        width="stretch",
        column_order=["agent", "gpu", "name", "samples", "mean", "max", "unit", "last_recorded"],
        column_config={
            "mean": st.column_config.NumberColumn("mean", format=_format.COLUMN),
            "max": st.column_config.NumberColumn("max", format=_format.COLUMN),
            "last_recorded": st.column_config.DatetimeColumn("last (UTC)"),
        },
    )
    metric = st.selectbox(
        "Plot system metric", sorted(set(summary["name"])), key=f"sysmetric_{trial_id}"
    )
    series = queries.system_metric_series(engine, trial_id, str(metric))
    unit = _units.system_unit(str(metric))
    if not series.empty:
        series["value"] = series["value"] * unit.scale
        series["source"] = [
            f"{a} · {'host' if pd.isna(g) else f'GPU {int(g)}'}"
            for a, g in zip(series["agent"], series["gpu_index"], strict=True)
        ]
        spec = _charts.line_spec(
            x="recorded_at",
            y="value",
            color="source",
            x_title="time (UTC)",
            y_title=_units.titled(str(metric), unit),
            x_type="temporal",
            y_format=unit.axis_format,
        )
        # A line needs two samples: a source sampled once is drawn as a point.
        if int(series.groupby("source").size().min()) < 2:
            spec["mark"]["point"] = {"size": 60, "filled": True}
        st.vega_lite_chart(
            series[["recorded_at", "source", "value"]], spec, height=300, width="stretch"
        )


def _diagnose_command() -> None:
    """The command that diagnoses this trial's point of the space, to copy."""
    config = shown["experiment_config"]
    searched = (
        []
        if config is None
        else [name for name, hp in config.hyperparameters.items() if not isinstance(hp, ConstHP)]
    )
    with st.expander("Diagnose this configuration"):
        st.caption(
            "Where this trial's step time goes (communication, input, compute) and what to "
            "change, measured by short probes of it on the configured slots:"
        )
        st.code(
            _diagnosis.diagnose_command(
                shown["experiment_config_path"], shown["hparams"], searched, _context.db_url()
            ),
            language="bash",
        )


def _page() -> None:
    _summary()
    _metrics()
    _checkpoints_section()
    _restarts()
    _log()
    _profile()
    _system()
    _diagnose_command()


_context.live(_page)
