"""Compare: 2-5 trials (hyperparameter diff, overlaid curves) or 2-5 experiments (best so far).

Trials arrive as ``?trials=3.1,3.4`` (``EXPERIMENT.NUMBER``, from the Experiment page's
table or learning-curve chart; an old link's database ids are rewritten) or are picked
here; experiments as ``?experiments=ID,ID`` or picked here. Opened bare (the sidebar,
``/compare``), the page offers the pickers.
"""

from __future__ import annotations

import pandas as pd
import streamlit as st

from storage import MetricKind
from trials import queries
from ui import _charts, _compare, _context, _format

st.title("Compare")
engine = _context.require_database()

choices = queries.experiment_choices(engine)
if not choices:
    st.info("No experiments yet. Start one with `slotsweep run CONFIG`.")
    st.stop()
labels = {exp_id: f"{name} (#{exp_id})" for exp_id, name in choices}
ids = list(labels)


def _id_list(name: str) -> list[int]:
    """``?name=1,2,3`` as integers; anything that is not a number is ignored."""
    raw = st.query_params.get(name) or ""
    return [int(part) for part in raw.split(",") if part.strip().isdigit()]


def _requested_trials() -> tuple[int | None, list[int]]:
    """The experiment and trial numbers ``?trials=`` names (old database ids rewritten)."""
    parts = [_context.parse_trial_ref(p) for p in (st.query_params.get("trials") or "").split(",")]
    refs = [p for p in parts if isinstance(p, tuple)]
    legacy = [p for p in parts if isinstance(p, int)]
    if legacy:
        found = queries.trials_by_ids(engine, legacy)
        refs += [
            (int(e), int(n)) for e, n in zip(found["experiment_id"], found["number"], strict=True)
        ]
    if not refs:
        return None, []
    experiment_id = refs[0][0]
    numbers = sorted({n for e, n in refs if e == experiment_id})
    if legacy:
        st.query_params["trials"] = ",".join(_context.trial_ref(experiment_id, n) for n in numbers)
    return experiment_id, numbers


requested_experiment, requested_numbers = _requested_trials()
mode = st.segmented_control(
    "Compare",
    ["Trials", "Experiments"],
    default="Experiments" if _id_list("experiments") and not requested_numbers else "Trials",
    key="compare_mode",
)
# Where the curves of compared trials are drawn against: batch sizes differ between
# trials, so batches alone mislead; samples and slot-seconds compare work and cost.
X_AXES = {"batches": "step", "epochs": "epoch", "samples": "samples", "slot-seconds": "slot_s"}


def _trials_mode() -> None:
    default_exp = requested_experiment if requested_experiment is not None else ids[0]
    if default_exp not in labels:
        summary = queries.experiment_summary(engine, default_exp)
        labels[default_exp] = f"{summary.name if summary else '?'} (#{default_exp})"
        ids.insert(0, default_exp)
    pick = st.columns([2, 3])
    experiment_id = pick[0].selectbox(
        "Experiment", ids, index=ids.index(default_exp), format_func=labels.__getitem__
    )
    bounds = queries.trial_number_range(engine, experiment_id)
    if bounds is None:
        st.info("This experiment has no trials yet.")
        return
    same = requested_numbers if experiment_id == requested_experiment else []
    numbers = pick[1].multiselect(
        f"Trial numbers (2 to {_context.MAX_COMPARED})",
        list(range(bounds[0], bounds[1] + 1)),
        default=[n for n in same if bounds[0] <= n <= bounds[1]][: _context.MAX_COMPARED],
        max_selections=_context.MAX_COMPARED,
        format_func=lambda n: _compare.trial_label(int(n)),
        key=f"compare_trials_{experiment_id}",
    )
    if len(numbers) < 2:
        st.info(
            f"Pick 2 to {_context.MAX_COMPARED} trials, here or on the Experiment page "
            "(select rows of the trials table, or click curves of the learning-curve chart)."
        )
        return
    trials = queries.trials_by_numbers(engine, experiment_id, sorted(numbers))
    st.query_params["trials"] = ",".join(
        _context.trial_ref(experiment_id, int(n)) for n in trials["number"]
    )
    _hparams_and_outcomes(trials)
    _overlaid_curves(trials)


def _hparams_and_outcomes(trials: pd.DataFrame) -> None:
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
            "metric": st.column_config.NumberColumn("searcher metric", format=_format.COLUMN),
            "slot_seconds": st.column_config.NumberColumn("slot·s", format=_format.COLUMN),
        },
    )


def _with_axes(curves: pd.DataFrame, trials: pd.DataFrame) -> pd.DataFrame:
    """``curves`` with samples and slot-seconds beside batches and epochs.

    Samples are batches times the trial's ``global_batch_size`` (when it has one);
    slot-seconds are the trial's total spread evenly over its batches, an estimate.
    """
    by_id = trials.set_index("id")
    batch_size = (
        by_id["hp.global_batch_size"]
        if "hp.global_batch_size" in by_id
        else pd.Series(float("nan"), index=by_id.index)
    )
    per_batch = by_id["slot_seconds"] / by_id["batches"].where(by_id["batches"] > 0)
    return curves.assign(
        samples=curves["step"] * curves["trial_id"].map(batch_size),
        slot_s=curves["step"] * curves["trial_id"].map(per_batch),
    )


def _overlaid_curves(trials: pd.DataFrame) -> None:
    by_id = {
        int(i): _compare.trial_label(int(n))
        for i, n in zip(trials["id"], trials["number"], strict=True)
    }
    axis_name = st.segmented_control(
        "x axis", list(X_AXES), default="batches", key="compare_x_axis"
    )
    axis_name = axis_name or "batches"
    x = X_AXES[axis_name]
    for kind in (MetricKind.TRAINING, MetricKind.VALIDATION):
        st.markdown(f"#### {kind.value.capitalize()} curves")
        curves = queries.trials_metric_curves(engine, list(by_id), kind)
        if curves.empty:
            st.caption(f"None of these trials recorded {kind.value} metrics.")
            continue
        curves = _with_axes(curves, trials)
        curves["trial"] = curves["trial_id"].map(by_id)
        if curves[x].isna().all():
            st.caption(f"These trials recorded no {axis_name} for their {kind.value} metrics.")
            continue
        columns = st.columns(2)
        for position, name in enumerate(sorted(set(curves["name"]))):
            with columns[position % 2]:
                st.markdown(f"**{name}**")
                spec = _charts.line_spec(
                    x=x, y="value", color="trial", x_title=axis_name, y_title=name
                )
                # Points too: a trial pruned at its first validation has a single one.
                spec["mark"]["point"] = True
                st.vega_lite_chart(
                    curves.loc[curves["name"] == name, ["trial", x, "value"]].dropna(),
                    spec,
                    height=260,
                    width="stretch",
                )
    if axis_name == "slot-seconds":
        st.caption("Slot-seconds along a curve are estimated: each trial's total, by batch.")


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
    frames, rows, metrics = [], [], set()
    for experiment_id in chosen:
        summary = queries.experiment_summary(engine, experiment_id)
        if summary is None:
            continue
        metrics.add(summary.metric)
        every = queries.best_so_far(
            engine, experiment_id, smaller_is_better=summary.smaller_is_better
        )
        frames.append(every.assign(experiment=labels[experiment_id]))
        rows.append(_summary_row(summary, every))
    st.markdown("#### Summary")
    st.dataframe(
        pd.DataFrame(rows),
        hide_index=True,
        width="stretch",
        column_config={
            "best": st.column_config.NumberColumn("best", format=_format.COLUMN),
            "slot_seconds": st.column_config.NumberColumn("slot·s", format=_format.COLUMN),
        },
    )
    failed = [r["experiment"] for r in rows if r["best"] is None]
    if failed:
        st.warning(
            "No completed trial, so no curve: "
            + "; ".join(
                f"{r['experiment']} ({r['state']}, {r['trials']} trials ended)"
                for r in rows
                if r["best"] is None
            )
            + "."
        )
    curves = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
    curves = curves[curves["best"].notna()] if not curves.empty else curves
    if curves.empty:
        st.info("None of these experiments has a completed trial yet.")
        return
    if len(metrics) > 1:
        st.warning(
            f"These experiments optimise different metrics ({', '.join(sorted(metrics))}); "
            "their curves share an axis but not a meaning."
        )
    _best_so_far_charts(curves, f"best {' / '.join(sorted(metrics))} so far")


def _summary_row(summary: queries.ExperimentSummary, every: pd.DataFrame) -> dict[str, object]:
    searcher = summary.config.searcher if summary.config is not None else None
    return {
        "experiment": labels[summary.id],
        "state": queries.shown_state(summary.state, summary.counts),
        "searcher": (f"{searcher.name} + {searcher.pruner.name}" if searcher is not None else "?"),
        "trials": len(every),
        "best": summary.best_value,
        "slot_seconds": float(every["slot_seconds"].iloc[-1]) if not every.empty else 0.0,
    }


def _best_so_far_charts(curves: pd.DataFrame, y_title: str) -> None:
    columns = st.columns(2)
    for column, (x, x_title) in zip(
        columns, (("trials", "trials ended"), ("slot_seconds", "slot-seconds used")), strict=True
    ):
        with column:
            st.markdown(f"**Best so far vs {x_title}**")
            spec = _charts.line_spec(
                x=x,
                y="best",
                color="experiment",
                x_title=x_title,
                y_title=y_title,
                y_format=_format.D3,
            )
            spec["mark"]["interpolate"] = "step-after"
            # Dashes and point shapes per experiment: two searches at the same value
            # would otherwise hide each other.
            spec["encoding"]["strokeDash"] = {"field": "experiment", "type": "nominal"}
            spec["mark"]["point"] = {"filled": False, "size": 30}
            spec["encoding"]["x"]["axis"] = {
                "format": "d" if x == "trials" else _format.D3,
                "tickMinStep": 1,
            }
            st.vega_lite_chart(
                curves[["experiment", x, "best", "number"]], spec, height=320, width="stretch"
            )
    st.caption(
        "One point per ended trial: the search whose curve is lower (or higher, when "
        "larger is better) further left reached a value with fewer trials or less compute."
    )


if mode == "Experiments":
    _experiments_mode()
else:
    _trials_mode()
