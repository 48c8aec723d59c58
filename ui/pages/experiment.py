"""Experiment: progress, best trials, Optuna's plots of the study and the trials table."""

from __future__ import annotations

import threading
from typing import Any

import streamlit as st

from storage import TrialState, redact_url
from ui import _actions, _context, _plots, _queries

st.title("Experiment")
engine = _context.require_database()
url = _context.db_url()

choices = _queries.experiment_choices(engine)
if not choices:
    st.info("No experiments yet. Start one with `slotsweep run CONFIG`.")
    st.stop()
requested = _context.query_int("experiment")
ids = [exp_id for exp_id, _ in choices]
if requested is not None and requested not in ids:
    summary_for_choice = _queries.experiment_summary(engine, requested)
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
def _study(db: str, study_name: str, signature: _queries.StudySignature) -> Any:
    # ``signature`` is in the key only: a study that changed gets a fresh copy.
    return _plots.snapshot_study(db, study_name)


@st.cache_resource(ttl=3600, max_entries=32, show_spinner=False)
def _plot(
    db: str,
    study_name: str,
    changes: tuple[Any, ...],
    kind: str,
    names: tuple[str, ...],
    _signature: _queries.StudySignature,
) -> tuple[Any, str | None]:
    # Keyed on what this plot depends on (``changes``), so e.g. parameter importances
    # are not recomputed each time a running trial reports; ``_signature`` (not hashed)
    # picks the study copy to draw from.
    return _plots.make_plot(_study(db, study_name, _signature), kind, names)


def _header() -> None:
    summary = _queries.experiment_summary(engine, experiment_id)
    if summary is None:
        st.warning(f"Experiment {experiment_id} no longer exists.")
        return
    st.subheader(f"{summary.name} (#{summary.id})")
    counts = summary.counts
    cols = st.columns([3, 3, 1, 1, 1, 2, 1])
    cols[0].metric("State", summary.state)
    cols[1].metric("Trials done", f"{summary.finished}/{summary.max_trials}")
    cols[2].metric("Running", counts[TrialState.RUNNING.value])
    cols[3].metric("Pruned", counts[TrialState.PRUNED.value])
    cols[4].metric("Failed", counts[TrialState.ERROR.value])
    cols[5].metric(f"Best {summary.metric}", _context.fmt_value(summary.best_value))
    cols[6].metric("Slots in use", summary.slots_in_use)
    driver = (
        f"driver {summary.driver_host}:{summary.driver_pid}, heartbeat "
        f"{_context.age(summary.driver_heartbeat_at)}"
        if summary.driver_pid is not None
        else "no driver recorded"
    )
    direction = "smaller is better" if summary.smaller_is_better else "larger is better"
    st.caption(
        f"Study `{summary.study_name}` · searcher metric `{summary.metric}` ({direction}) · "
        f"started {summary.created_at:%Y-%m-%d %H:%M:%S} UTC · {driver}"
        + (
            f" · requested action: **{summary.requested_action}**"
            if summary.requested_action
            else ""
        )
    )

    signature = _queries.optuna_study_signature(engine, summary.study_name)
    study = _study(url, summary.study_name, signature) if signature.exists else None
    multi = study is not None and len(study.directions) > 1

    if study is not None and multi:
        # Several objectives: the best trials are Optuna's Pareto-optimal ones.
        st.markdown("#### Best trials (Pareto front)")
        numbers = [t.number for t in study.best_trials]
        best = _queries.trials_by_numbers(engine, experiment_id, numbers)
    else:
        st.markdown("#### Best trials")
        best = _queries.best_trials(
            engine, experiment_id, smaller_is_better=summary.smaller_is_better, limit=10
        )
    if best.empty:
        st.info("No trial has completed with a searcher metric yet.")
    else:
        _trials_table(best, key="best_trials")

    st.markdown("#### Optuna plots")
    if study is None:
        st.info(f"The Optuna study `{summary.study_name}` is not in this database yet.")
        return
    objectives = [
        o.get("name", "") for o in summary.config.get("searcher", {}).get("objectives", [])
    ]
    names = tuple(_plots.objective_names(study, summary.metric, objectives))
    default = _plots.PARETO if multi else _plots.HISTORY
    kind = st.segmented_control(
        "Plot",
        _plots.available_plots(len(study.directions)),
        default=default,
        key=f"plot_kind_{experiment_id}",
    )
    kind = kind or default
    changes = signature.everything if kind == _plots.INTERMEDIATE else signature.completed
    figure, reason = _plot(url, summary.study_name, changes, kind, names, signature)
    if figure is None:
        st.info(reason)
    else:
        st.plotly_chart(figure, width="stretch", key=f"plot_{kind}")


def _trials_table(rows: Any, key: str) -> None:
    rows = rows.assign(open=[_context.link("trial", trial=int(i)) for i in rows["id"]])
    columns = [
        "open",
        "number",
        "state",
        "metric",
        *[c for c in rows.columns if c.startswith("hp.")],
    ]
    columns += ["restarts", "batches", "slot_seconds", "slots", "started", "duration_s", "id"]
    event = st.dataframe(
        rows,
        hide_index=True,
        width="stretch",
        on_select="rerun",
        selection_mode="single-row",
        key=key,
        column_order=columns,
        column_config={
            "open": st.column_config.LinkColumn("open", display_text="open"),
            "number": st.column_config.NumberColumn("trial #"),
            "metric": st.column_config.NumberColumn("metric", format="%.6g"),
            "slot_seconds": st.column_config.NumberColumn("slot·s", format="%.1f"),
            "duration_s": st.column_config.NumberColumn("duration (s)", format="%.1f"),
            "started": st.column_config.DatetimeColumn("started (UTC)"),
            "id": st.column_config.NumberColumn("trial id"),
        },
    )
    selected = event.selection.rows if event is not None else []
    if selected:
        st.switch_page(
            _context.TRIAL_PAGE, query_params={"trial": str(int(rows.iloc[selected[0]]["id"]))}
        )


def _trials() -> None:
    st.markdown("#### Trials")
    controls = st.columns([3, 2, 1])
    states = controls[0].multiselect(
        "State", [s.value for s in TrialState], key=f"trial_states_{experiment_id}"
    )
    sort_by = controls[1].selectbox(
        "Sort by", list(_queries.TRIAL_SORT_COLUMNS), key=f"trial_sort_{experiment_id}"
    )
    descending = controls[2].toggle("Descending", key=f"trial_desc_{experiment_id}")
    total = _queries.list_trials(engine, experiment_id, states=states, limit=1).total
    offset = _context.pager(total, key=f"trials_page_{experiment_id}")
    page = _queries.list_trials(
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
    _trials_table(page.rows, key=f"trials_table_{experiment_id}")
    st.caption(
        _context.rows_caption(page.offset, len(page.rows), page.total)
        + " Select a row (or follow 'open') to see the trial."
    )

    bounds = _queries.trial_number_range(engine, experiment_id)
    if bounds is not None:
        number = st.number_input(
            "Open trial number",
            min_value=bounds[0],
            max_value=bounds[1],
            value=bounds[0],
            step=1,
            key=f"open_trial_{experiment_id}",
        )
        picked = _queries.trials_by_numbers(engine, experiment_id, [int(number)])
        if not picked.empty:
            st.page_link(
                _context.TRIAL_PAGE,
                label=f"Open trial #{int(number)}",
                query_params={"trial": str(int(picked["id"].iloc[0]))},
            )


def _send_request(action_key: str, confirm_key: str, result_key: str) -> None:
    # A callback, so the confirmation can be consumed: each request needs its own tick.
    action = str(st.session_state[action_key])
    st.session_state[result_key] = _actions.request_action(url, experiment_id, action)
    st.session_state[confirm_key] = False


def _actions_panel() -> None:
    summary = _queries.experiment_summary(engine, experiment_id)
    if summary is None or summary.state in ("COMPLETED", "CANCELED", "ERROR"):
        return
    action_key, confirm_key = f"action_{experiment_id}", f"action_confirmed_{experiment_id}"
    result_key = f"action_result_{experiment_id}"
    with st.expander("Actions (pause or kill this experiment)"):
        action = st.radio(
            "Action",
            list(_actions.ACTIONS),
            format_func=_actions.ACTIONS.__getitem__,
            key=action_key,
        )
        confirmed = st.checkbox(
            f"Yes, {action} experiment {summary.name} (#{summary.id})", key=confirm_key
        )
        st.button(
            "Send request",
            disabled=not confirmed,
            type="primary",
            on_click=_send_request,
            args=(action_key, confirm_key, result_key),
        )
        if result_key in st.session_state:
            st.success(st.session_state.pop(result_key))


def _config() -> None:
    summary = _queries.experiment_summary(engine, experiment_id)
    if summary is not None:
        with st.expander("Configuration"):
            st.caption(f"Database: `{redact_url(url)}`")
            st.json(summary.config, expanded=False)


_context.live(_header)
_context.live(_trials)
_actions_panel()
_config()
