"""Experiment: progress, failures, learning curves, best trials, Optuna's plots, trials table."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pandas as pd
import streamlit as st

from storage import (
    OptunaSchemaError,
    StudySignature,
    TrialState,
    redact_url,
    study_signature,
)
from trials import pruning, queries
from trials.config import ExperimentConfig
from ui import (
    _actions,
    _charts,
    _context,
    _curves,
    _format,
    _logs,
    _pareto,
    _plots,
    _tables,
    _units,
)

st.title("Experiment")
engine = _context.require_database()
url = _context.db_url()

choices = queries.experiment_choices(engine)
if not choices:
    st.info("No experiments yet. Start one with `slotsweep run CONFIG`.")
    st.stop()
requested = _context.query_int("experiment")
ids = [exp_id for exp_id, _ in choices]
if requested is not None and requested not in ids:
    summary_for_choice = queries.experiment_summary(engine, requested)
    if summary_for_choice is None:
        st.warning(f"Experiment {requested} does not exist; showing the newest one.")
        requested = None
    else:
        choices.insert(0, (requested, summary_for_choice.name))
        ids.insert(0, requested)
labels = {exp_id: f"{name} (#{exp_id})" for exp_id, name in choices}
experiment_id = st.selectbox(
    "Experiment",
    ids,
    index=ids.index(requested) if requested is not None else 0,
    format_func=labels.__getitem__,
)
if experiment_id != requested:
    st.query_params["experiment"] = str(experiment_id)


@st.cache_resource(show_spinner=False)
def _preload_importances() -> threading.Thread:
    # Once per server process, off the page's thread (see preload_importance_backend).
    thread = threading.Thread(
        target=_plots.preload_importance_backend, name="slotsweep-preload", daemon=True
    )
    thread.start()
    return thread


_preload_importances()


@st.cache_resource(ttl=3600, max_entries=4, show_spinner="Reading the Optuna study…")
def _study(db: str, study_name: str, signature: StudySignature) -> Any:
    # ``signature`` is in the key only: a study that changed gets a fresh copy.
    return _plots.snapshot_study(db, study_name)


@st.cache_resource(ttl=3600, max_entries=32, show_spinner=False)
def _plot(
    db: str,
    study_name: str,
    changes: tuple[Any, ...],
    kind: str,
    names: tuple[str, ...],
    params: tuple[str, ...] | None,
    _signature: StudySignature,
) -> tuple[Any, str | None, str | None]:
    # Keyed on what this plot depends on (``changes``), so e.g. parameter importances
    # are not recomputed each time a running trial reports; ``_signature`` (not hashed)
    # picks the study copy to draw from.
    study = _study(db, study_name, _signature)
    figure, reason = _plots.make_plot(study, kind, names, params)
    return figure, reason, _plots.plot_caption(study, kind) if figure is not None else None


# Up to this many trials the Experiment page draws Optuna's history straight away.
_EAGER_PLOT_TRIALS = 2000
_STATE_BADGE = {"COMPLETED": "green", "ACTIVE": "blue", "PAUSED": "orange", "ERROR": "red"}


def _failures(summary: queries.ExperimentSummary, failures: queries.FailureSummary) -> None:
    if failures.failed == 0:
        return
    total = summary.finished
    headline = (
        f"All {failures.failed} finished trials failed."
        if failures.all_failed
        else f"{failures.failed} of {total} finished trials failed."
    )
    if failures.reason is None:
        st.error(headline + " They recorded no reason.")
        return
    traceback = queries.failure_traceback(engine, experiment_id, failures.reason)
    log_path = queries.failed_trial_log(engine, experiment_id, failures.reason)
    detail = (
        _logs.last_exception_line(_logs.tail_lines(log_path, 400))
        if traceback is None and log_path is not None and Path(log_path).is_file()
        else None
    )
    if detail is not None and detail in failures.reason:
        detail = None  # The recorded reason says it already.
    message = (
        f"{headline} Commonest reason ({failures.reason_count} of {failures.failed}): "
        f"**{failures.reason}**" + (f"\n\nFrom the trial's log: `{detail}`" if detail else "")
    )
    (st.error if failures.all_failed else st.warning)(message)
    if traceback is not None:
        with st.expander("Traceback of the latest trial that failed this way"):
            st.code(traceback, language=None)


def _header() -> None:
    summary = queries.experiment_summary(engine, experiment_id)
    if summary is None:
        st.warning(f"Experiment {experiment_id} no longer exists.")
        return
    failures = queries.failure_summary(engine, experiment_id, summary.trials)
    _headline(summary, failures)
    if summary.counts[TrialState.QUEUED.value]:
        _waiting_trials()
    try:
        signature, unreadable = study_signature(engine, summary.study_name), None
    except OptunaSchemaError as exc:
        # The rest of the page is slotsweep's own tables; only Optuna's plots are lost.
        signature, unreadable = StudySignature(None), str(exc)
    multi = signature.objectives > 1
    # Reading a study into Optuna costs about 0.2 s per 1,000 trials: a large study is
    # read only once a plot is asked for (or its Pareto front is needed).
    eager = signature.exists and (multi or signature.trials <= _EAGER_PLOT_TRIALS)
    study = _study(url, summary.study_name, signature) if eager else None
    _best_trials(summary, failures, study if multi else None)
    if multi:
        _pruned_trials(summary, signature)
    _learning_curves(summary, failures)
    st.markdown("#### Optuna plots")
    if unreadable is not None:
        st.error(unreadable)
        return
    if not signature.exists:
        st.info(f"The Optuna study `{summary.study_name}` is not in this database yet.")
        return
    _optuna_plot(summary, signature, study, eager=eager)


def _headline(summary: queries.ExperimentSummary, failures: queries.FailureSummary) -> None:
    """Name and state, why it stopped or failed, the counts, the description, the driver."""
    state = queries.shown_state(summary.state, summary.counts)
    st.subheader(
        f"{summary.name} (#{summary.id}) :{_STATE_BADGE.get(state, 'gray')}-badge[{state}]"
    )
    if summary.config is not None and summary.config.description.strip():
        st.markdown(summary.config.description)
    stopped = queries.fail_fast_stop(engine, experiment_id, summary.config)
    if stopped is not None:
        st.error(f"The driver stopped the experiment early (fail-fast): {stopped}.")
    _failures(summary, failures)
    # Pairs, then the counts: at 1000 px a column of a row of four cut "COMPLETED"
    # short, and "9000/10000" needs a column of a row of two.
    first = st.columns(2)
    first[0].metric("State", state)
    first[1].metric(f"Best {summary.metric}", _format.number(summary.best_value))
    second = st.columns(2)
    second[0].metric("Trials done", f"{summary.finished}/{summary.max_trials}")
    second[1].metric("Slots in use", summary.slots_in_use)
    counts = st.columns(4)
    counts[0].metric("Running", summary.counts[TrialState.RUNNING.value])
    counts[1].metric("Queued", summary.counts[TrialState.QUEUED.value])
    counts[2].metric("Pruned", summary.counts[TrialState.PRUNED.value])
    counts[3].metric("Failed", summary.counts[TrialState.ERROR.value])
    if summary.counts[TrialState.NOT_RUN.value]:
        # Asked, never started: the experiment was killed or stopped first (no failure).
        st.caption(f"Not run: {summary.counts[TrialState.NOT_RUN.value]}")
    st.caption(_driver_caption(summary))


def _driver_caption(summary: queries.ExperimentSummary) -> str:
    if summary.driver_pid is not None:
        driver = (
            f"driver {summary.driver_host}:{summary.driver_pid}, heartbeat "
            f"{_context.age(summary.driver_heartbeat_at)}"
        )
    elif summary.state == "ACTIVE":
        driver = (
            "no driver recorded: nothing runs it (created with `--detach`?); "
            f"`slotsweep resume {summary.id}` or the Resume action above starts one"
        )
    else:
        driver = "no driver recorded"
    direction = "smaller is better" if summary.smaller_is_better else "larger is better"
    action = (
        f" · requested action: **{summary.requested_action}**" if summary.requested_action else ""
    )
    return (
        f"Study `{summary.study_name}` · searcher metric `{summary.metric}` ({direction}) · "
        f"started {summary.created_at:%Y-%m-%d %H:%M:%S} UTC · {driver}{action}"
    )


def _best_trials(
    summary: queries.ExperimentSummary, failures: queries.FailureSummary, pareto: Any
) -> None:
    """The best trials table; with several objectives (``pareto`` is the study), Optuna's
    Pareto-optimal ones."""
    if pareto is not None:
        st.markdown("#### Best trials (Pareto front)")
        numbers = [t.number for t in pareto.best_trials]
        best = queries.trials_by_numbers(engine, experiment_id, numbers)
    else:
        st.markdown("#### Best trials")
        best = queries.trial_frame(
            queries.best_trials(
                engine, experiment_id, smaller_is_better=summary.smaller_is_better, limit=10
            )
        )
    if best.empty:
        st.info(
            f"No trial completed: all {failures.failed} failed."
            if failures.all_failed
            else "No trial has completed with a searcher metric yet."
        )
    else:
        _trials_table(best, key="best_trials", config=summary.config)


@st.cache_data(ttl=3600, max_entries=8, show_spinner=False)
def _stops(db: str, study_name: str, changes: tuple[Any, ...]) -> list[pruning.RungDecision]:
    # ``changes`` in the key only: a new rung decision comes with a change to the study.
    return queries.pruned_stops(db, study_name)


def _pruned_trials(summary: queries.ExperimentSummary, signature: StudySignature) -> None:
    """A multi-objective search's pruned trials: where each stopped, and what it had there."""
    if summary.config is None or summary.config.searcher.pruner.name == "none":
        return
    searcher = summary.config.searcher
    stops = _stops(url, summary.study_name, signature.everything)
    st.markdown("#### Pruned trials: where they stopped")
    if not stops:
        st.info("No trial has been pruned yet.")
        return
    st.caption(
        "Each rung ranks the trials that reached it over "
        + ", ".join(f"`{name}`" for name in searcher.objective_names)
        + " (the costs: what each had spent by then) by Pareto front, then crowding "
        f"distance, and keeps the top 1/{searcher.pruner.reduction_factor}; these stopped "
        "at the rung below, with the values they had there."
    )
    rows = _pareto.stops_frame(
        stops, searcher.objective_names, searcher.resource_unit, experiment_id
    )
    rows.insert(0, "open", [_context.link("trial", trial=str(t)) for t in rows["trial"]])
    st.dataframe(
        rows,
        hide_index=True,
        width="stretch",
        column_config={"open": st.column_config.LinkColumn("open", display_text="open")},
    )


def _optuna_plot(
    summary: queries.ExperimentSummary, signature: StudySignature, study: Any, *, eager: bool
) -> None:
    """One of Optuna's plots, picked above it; a large study waits until one is picked."""
    multi = signature.objectives > 1
    default = _plots.PARETO if multi else _plots.HISTORY if eager else None
    kind = st.segmented_control(
        "Plot",
        _plots.available_plots(signature.objectives),
        default=default,
        key=f"plot_kind_{experiment_id}",
    )
    kind = kind or default
    if kind is None:
        st.info(
            f"This study has {signature.trials:,} trials: pick a plot above. Reading them "
            "into Optuna takes a few seconds at this size, so it waits until asked."
        )
        return
    study = study if study is not None else _study(url, summary.study_name, signature)
    objectives = (
        [] if summary.config is None else [o.name for o in summary.config.searcher.objectives]
    )
    names = tuple(_plots.objective_names(study, summary.metric, objectives))
    params: tuple[str, ...] | None = None
    if kind in (_plots.CONTOUR, _plots.RANK, _plots.SLICE):
        searched = _plots.searched_params(study)
        # Contour and rank draw every pair: a few parameters keep the grid readable.
        params = tuple(
            st.multiselect(
                "Parameters",
                searched,
                default=searched[: 2 if kind != _plots.SLICE else 4],
                key=f"plot_params_{experiment_id}_{kind}",
            )
        )
    changes = signature.completed if kind in _plots.COMPLETED_ONLY_PLOTS else signature.everything
    figure, reason, caption = _plot(
        url, summary.study_name, changes, kind, names, params, signature
    )
    if figure is None:
        st.info(reason)
    else:
        st.plotly_chart(figure, width="stretch", key=f"plot_{kind}")
        if caption:
            st.caption(caption)


def _waiting_trials() -> None:
    """The experiment's QUEUED trials and, in the scheduler's words, why each waits."""
    st.markdown("#### Waiting trials")
    page = queries.waiting_trials(engine, experiment_id)
    if page.rows.empty:
        return  # Started between the two reads.
    rows = page.rows.assign(
        # Unknown (None) until the trial enters the cluster's queue.
        waiting=[None if pd.isna(s) else _units.duration_words(s) for s in page.rows["waiting_s"]],
        open=[_context.link("trial", trial=str(t)) for t in page.rows["trial"]],
    )
    st.dataframe(
        rows,
        hide_index=True,
        width="stretch",
        column_order=["open", "trial", "slots", "priority", "waiting", "reason"],
        column_config={
            "open": st.column_config.LinkColumn("open", display_text="open"),
            "priority": st.column_config.NumberColumn("priority", help="Lower runs first."),
            "waiting": st.column_config.TextColumn("waiting", help="Time in the cluster's queue."),
            "reason": st.column_config.TextColumn("why it waits", width="large"),
        },
    )
    st.caption(
        "In the order they would start. The reason is the scheduler's, from its latest "
        "placement decision (the Cluster page shows the whole queue)."
        + (f" The first {len(rows)} of {page.total} are shown." if page.total > len(rows) else "")
    )


def _learning_curves(summary: queries.ExperimentSummary, failures: queries.FailureSummary) -> None:
    st.markdown("#### Learning curves")
    curves = queries.learning_curves(
        engine, experiment_id, summary.metric, smaller_is_better=summary.smaller_is_better
    )
    if curves.points.empty:
        st.info(
            f"No trial recorded `{summary.metric}`: all {failures.failed} failed."
            if failures.all_failed
            else f"No trial has recorded `{summary.metric}` yet."
        )
        return
    searcher = None if summary.config is None else summary.config.searcher
    axis = _curves.curve_axis(searcher)
    if axis == "epoch" and curves.points["epoch"].isna().any():
        axis = "step"  # Epochs were not recorded for every point: batches always are.
    rungs = _curves.asha_rungs(searcher)
    x_title = "epoch" if axis == "epoch" else "batch"
    # A log scale needs positive values; a metric that reaches 0 or below stays linear.
    positive = bool((curves.points["value"].dropna() > 0).all())
    log_y = st.toggle(
        "Log scale",
        value=False,
        disabled=not positive,
        key=f"curves_log_{experiment_id}",
        help="Spread out good curves a few bad ones squeeze into the bottom of the chart."
        + ("" if positive else " (Off: the metric is not positive everywhere.)"),
    )
    states = sorted(set(curves.points["state"]))
    event = st.vega_lite_chart(
        _curves.with_hparams_text(curves, _tables.constant_hparams(summary.config)),
        _charts.learning_curve_spec(
            x=axis,
            x_title=x_title,
            y_title=summary.metric,
            rungs=rungs,
            states=states,
            log_y=log_y and positive,
        ),
        height=380,
        width="stretch",
        on_select="rerun",
        selection_mode=_charts.PICK,
        key=f"learning_curves_{experiment_id}",
    )
    sample = (
        f"one trial in {curves.stride} by number (plus the best): "
        f"{curves.trials_shown} of {curves.trials_total}"
        if curves.stride > 1
        else f"all {curves.trials_shown} trials that recorded it"
    )
    best = f"trial {curves.best_number} (black)" if curves.best_number is not None else "none yet"
    st.caption(
        f"`{summary.metric}` ({curves.kind} metric) against the {x_title} for {sample}. "
        f"Best: {best}. Crosses: where pruned trials stopped (pruned trials are faint, "
        "so many stopped at one rung do not hide the rest)"
        + (
            f"; dashed lines: ASHA rungs at {', '.join(_format.number(r) for r in rungs)}."
            if rungs
            else "."
        )
        + " Hover a curve for its hyperparameters; click curves (shift-click for more) "
        "to compare them."
    )
    picked = _picked_numbers(event)
    if picked:
        _compare_link(picked)


def _picked_numbers(event: Any) -> list[int]:
    selection = getattr(event, "selection", None) or {}
    return sorted({int(p["number"]) for p in selection.get(_charts.PICK, []) if "number" in p})


def _compare_link(numbers: list[int]) -> None:
    """A link to the Compare page for 2-5 picked trial numbers, or why there is none."""
    if not 2 <= len(numbers) <= _context.MAX_COMPARED:
        st.caption(
            f"Picked trial(s) {', '.join(map(str, numbers))}: pick 2 to "
            f"{_context.MAX_COMPARED} to compare."
        )
        return
    st.page_link(
        _context.COMPARE_PAGE,
        label=f"Compare trials {', '.join(f'#{n}' for n in numbers)}",
        icon=":material/compare_arrows:",
        query_params={"trials": ",".join(_context.trial_ref(experiment_id, n) for n in numbers)},
    )


def _trials_table(rows: Any, key: str, config: ExperimentConfig | None) -> None:
    rows = _tables.shown_hparams(rows).assign(
        open=[
            _context.link("trial", trial=_context.trial_ref(experiment_id, int(n)))
            for n in rows["number"]
        ]
    )
    columns = _tables.trial_columns(rows, _tables.constant_hparams(config))
    event = st.dataframe(
        rows,
        hide_index=True,
        width="stretch",
        on_select="rerun",
        selection_mode="multi-row",
        key=key,
        column_order=columns,
        column_config=_tables.trial_column_config(rows),
    )
    selected = event.selection.rows if event is not None else []
    numbers = sorted(int(rows.iloc[i]["number"]) for i in selected)
    if len(numbers) == 1:
        st.page_link(
            _context.TRIAL_PAGE,
            label=f"Open trial #{numbers[0]}",
            icon=":material/open_in_new:",
            query_params={"trial": _context.trial_ref(experiment_id, numbers[0])},
        )
    elif numbers:
        _compare_link(numbers)


def _trials() -> None:
    st.markdown("#### Trials")
    controls = st.columns([3, 2, 1])
    states = controls[0].multiselect(
        "State", [s.value for s in TrialState], key=f"trial_states_{experiment_id}"
    )
    sort_by = controls[1].selectbox(
        "Sort by", list(queries.TRIAL_SORT_COLUMNS), key=f"trial_sort_{experiment_id}"
    )
    descending = controls[2].toggle("Descending", key=f"trial_desc_{experiment_id}")
    total = queries.list_trials(engine, experiment_id, states=states, limit=1).total
    offset = _context.pager(total, key=f"trials_page_{experiment_id}")
    page = queries.list_trials(
        engine,
        experiment_id,
        states=states,
        sort_by=sort_by,
        descending=descending,
        limit=_context.PAGE_SIZE,
        offset=offset,
    )
    if page.rows.empty:
        st.info("No trials yet." if not states else "No trial is in the selected states.")
        return
    summary = queries.experiment_summary(engine, experiment_id)
    _trials_table(
        page.rows,
        key=f"trials_table_{experiment_id}",
        config=summary.config if summary is not None else None,
    )
    st.caption(
        _context.rows_caption(page.offset, len(page.rows), page.total)
        + " Follow 'open' to see a trial; select 2 to 5 rows to compare them."
    )

    bounds = queries.trial_number_range(engine, experiment_id)
    if bounds is not None:
        number = st.number_input(
            "Open trial number",
            min_value=bounds[0],
            max_value=bounds[1],
            value=bounds[0],
            step=1,
            key=f"open_trial_{experiment_id}",
        )
        if queries.trial_id(engine, experiment_id, int(number)) is not None:
            st.page_link(
                _context.TRIAL_PAGE,
                label=f"Open trial #{int(number)}",
                icon=":material/open_in_new:",
                query_params={"trial": _context.trial_ref(experiment_id, int(number))},
            )


def _send_request(action_key: str, confirm_key: str, result_key: str) -> None:
    # A callback, so the confirmation can be consumed: each request needs its own tick.
    st.session_state[confirm_key] = False
    if not _context.controls_allowed():  # Checked again: the panel is not the only gate.
        st.session_state[result_key] = "Not sent: this page was not opened with the UI's token."
        return
    action = str(st.session_state[action_key])
    st.session_state[result_key] = (
        _actions.start_resume(url, experiment_id)
        if action == _actions.RESUME
        else _actions.request_action(url, experiment_id, action)
    )


def _actions_panel() -> None:
    """Pause, kill, activate and resume, at the top of the page, behind a confirmation."""
    summary = queries.experiment_summary(engine, experiment_id)
    if summary is None or summary.state in ("COMPLETED", "CANCELED", "ERROR"):
        return
    if not _context.controls_allowed():
        st.caption(
            "Pause, kill and resume are hidden: this server is reachable from other "
            "machines, and only pages opened with the address `slotsweep ui` printed "
            "(with its token) may use them. `slotsweep pause|kill|resume` work from a terminal."
        )
        return
    choices = dict(_actions.ACTIONS)
    if _actions.resumable(url, experiment_id):
        choices[_actions.RESUME] = _actions.RESUME_TEXT
    action_key, confirm_key = f"action_{experiment_id}", f"action_confirmed_{experiment_id}"
    result_key = f"action_result_{experiment_id}"
    row = st.columns([4, 3, 2], vertical_alignment="bottom")
    action = row[0].radio(
        "Action", list(choices), format_func=str.capitalize, horizontal=True, key=action_key
    )
    confirmed = row[1].checkbox(f"Yes, {action} {summary.name} (#{summary.id})", key=confirm_key)
    row[2].button(
        "Send request",
        disabled=not confirmed,
        type="primary",
        on_click=_send_request,
        args=(action_key, confirm_key, result_key),
    )
    st.caption(choices.get(str(action), ""))
    if result_key in st.session_state:
        st.success(st.session_state.pop(result_key))


def _config() -> None:
    summary = queries.experiment_summary(engine, experiment_id)
    if summary is not None:
        with st.expander("Configuration"):
            st.caption(f"Database: `{redact_url(url)}`")
            st.json(summary.stored_config, expanded=False)


_actions_panel()
_context.live(_header)
_context.live(_trials)
_config()
