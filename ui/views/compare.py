"""Compare: 2-5 trials (hyperparameter diff, overlaid curves) or 2-5 experiments (best so far).

Trials arrive as ``?trials=ID,ID`` (from the Experiment page's table or learning-curve
chart) or are picked here; experiments as ``?experiments=ID,ID`` or picked here.
"""

from __future__ import annotations

import pandas as pd
import streamlit as st

from storage import MetricKind
from ui import _charts, _compare, _context, _queries

st.title("Compare")
engine = _context.require_database()

choices = _queries.experiment_choices(engine)
if not choices:
    st.info("No experiments yet. Start one with `slotsweep run CONFIG`.")
    st.stop()
labels = {exp_id: f"{name} (#{exp_id})" for exp_id, name in choices}
ids = list(labels)


def _id_list(name: str) -> list[int]:
    """``?name=1,2,3`` as integers; anything that is not a number is ignored."""
    raw = st.query_params.get(name) or ""
    return [int(part) for part in raw.split(",") if part.strip().isdigit()]


requested_trials = _queries.trials_by_ids(engine, _id_list("trials"))
mode = st.segmented_control(
    "Compare",
    ["Trials", "Experiments"],
    default="Experiments" if _id_list("experiments") and requested_trials.empty else "Trials",
    key="compare_mode",
)


def _trials_mode() -> None:
    default_exp = (
        int(requested_trials["experiment_id"].iloc[0]) if not requested_trials.empty else ids[0]
    )
    if default_exp not in labels:
        labels[default_exp] = str(requested_trials["experiment"].iloc[0])
        ids.insert(0, default_exp)
    pick = st.columns([2, 3])
    experiment_id = pick[0].selectbox(
        "Experiment", ids, index=ids.index(default_exp), format_func=labels.__getitem__
    )
    bounds = _queries.trial_number_range(engine, experiment_id)
    if bounds is None:
        st.info("This experiment has no trials yet.")
        return
    same = requested_trials[requested_trials["experiment_id"] == experiment_id]
    numbers = pick[1].multiselect(
        f"Trial numbers (2 to {_context.MAX_COMPARED})",
        list(range(bounds[0], bounds[1] + 1)),
        default=[int(n) for n in same["number"]][: _context.MAX_COMPARED],
        max_selections=_context.MAX_COMPARED,
        key=f"compare_trials_{experiment_id}",
    )
    if len(numbers) < 2:
        st.info(
            f"Pick 2 to {_context.MAX_COMPARED} trials, here or on the Experiment page "
            "(select rows of the trials table, or click curves of the learning-curve chart)."
        )
        return
    trials = _queries.trials_by_numbers(engine, experiment_id, sorted(numbers))
    st.query_params["trials"] = ",".join(str(int(i)) for i in trials["id"])
    st.markdown("#### Hyperparameters")
    diff = _compare.hparam_diff(trials)
    differing = int(diff["differs"].sum())
    st.dataframe(
        diff,
        hide_index=True,
        width="stretch",
        column_config={"differs": st.column_config.CheckboxColumn("differs")},
    )
    st.caption(f"{differing} of {len(diff)} hyperparameters differ; they are listed first.")
    outcome = trials[["number", "state", "metric", "batches", "slot_seconds"]].assign(
        trial=[_compare.trial_label(int(n)) for n in trials["number"]]
    )
    st.dataframe(
        outcome[["trial", "state", "metric", "batches", "slot_seconds"]],
        hide_index=True,
        column_config={
            "metric": st.column_config.NumberColumn("searcher metric", format="%.6g"),
            "slot_seconds": st.column_config.NumberColumn("slot·s", format="%.1f"),
        },
    )
    by_id = {
        int(i): _compare.trial_label(int(n))
        for i, n in zip(trials["id"], trials["number"], strict=True)
    }
    for kind in (MetricKind.TRAINING, MetricKind.VALIDATION):
        st.markdown(f"#### {kind.value.capitalize()} curves")
        curves = _queries.trials_metric_curves(engine, list(by_id), kind)
        if curves.empty:
            st.caption(f"None of these trials recorded {kind.value} metrics.")
            continue
        curves["trial"] = curves["trial_id"].map(by_id)
        names = sorted(set(curves["name"]))
        columns = st.columns(2)
        for position, name in enumerate(names):
            with columns[position % 2]:
                st.markdown(f"**{name}**")
                spec = _charts.line_spec(
                    x="step", y="value", color="trial", x_title="batch", y_title=name
                )
                # Points too: a trial pruned at its first validation has a single one.
                spec["mark"]["point"] = True
                st.vega_lite_chart(
                    curves.loc[curves["name"] == name, ["trial", "step", "value"]],
                    spec,
                    height=260,
                    width="stretch",
                )


def _experiments_mode() -> None:
    requested = [i for i in _id_list("experiments") if i in labels]
    chosen = st.multiselect(
        f"Experiments (2 to {_context.MAX_COMPARED})",
        ids,
        default=requested[: _context.MAX_COMPARED],
        format_func=labels.__getitem__,
        max_selections=_context.MAX_COMPARED,
        key="compare_experiments",
    )
    if len(chosen) < 2:
        st.info(f"Pick 2 to {_context.MAX_COMPARED} experiments to overlay their searches.")
        return
    st.query_params["experiments"] = ",".join(map(str, chosen))
    frames = []
    metrics = set()
    for experiment_id in chosen:
        summary = _queries.experiment_summary(engine, experiment_id)
        if summary is None:
            continue
        metrics.add(summary.metric)
        best = _queries.best_so_far(
            engine, experiment_id, smaller_is_better=summary.smaller_is_better
        )
        frames.append(best.assign(experiment=labels[experiment_id]))
    curves = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
    if curves.empty:
        st.info("None of these experiments has a completed trial yet.")
        return
    if len(metrics) > 1:
        st.warning(
            f"These experiments optimise different metrics ({', '.join(sorted(metrics))}); "
            "their curves share an axis but not a meaning."
        )
    y_title = f"best {' / '.join(sorted(metrics))} so far"
    columns = st.columns(2)
    for column, (x, x_title) in zip(
        columns, (("trials", "trials ended"), ("slot_seconds", "slot-seconds used")), strict=True
    ):
        with column:
            st.markdown(f"**Best so far vs {x_title}**")
            spec = _charts.line_spec(
                x=x, y="best", color="experiment", x_title=x_title, y_title=y_title
            )
            spec["mark"]["interpolate"] = "step-after"
            spec["mark"]["point"] = True
            st.vega_lite_chart(
                curves[["experiment", x, "best"]], spec, height=320, width="stretch"
            )
    st.caption(
        "Each point is a trial that improved its search's best value; the search whose "
        "curve is lower (or higher, when larger is better) further left reached a value "
        "with fewer trials or less compute."
    )


if mode == "Experiments":
    _experiments_mode()
else:
    _trials_mode()
