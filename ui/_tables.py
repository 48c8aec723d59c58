"""Which columns a trials table shows, in what order and format.

At 1024 px a trials table shows about eight columns before it scrolls sideways, so the
order decides what a user sees: the trial, its state and metric, the hyperparameters
the search varies, its cost; constant hyperparameters (the same in every trial) and
bookkeeping last. Numbers read in 4 significant digits (:mod:`ui._format`); the
table keeps the full value, so a CSV export has it.

Example:
    >>> hparam_columns(["hp.lr", "hp.hidden_size", "hp.wd"], {"hidden_size"})
    ['hp.lr', 'hp.wd', 'hp.hidden_size']
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any

import pandas as pd
import streamlit as st

from trials.config import ExperimentConfig
from ui import _format

HEAD = ["open", "number", "state", "metric"]
COST = ["slot_seconds", "duration_s"]
TAIL = ["restarts", "batches", "slots", "started"]


def constant_hparams(config: ExperimentConfig | None) -> set[str]:
    """The hyperparameters the search does not vary (``const`` in the config)."""
    if config is None:
        return set()
    return {name for name, hp in config.hyperparameters.items() if hp.type == "const"}


def hparam_columns(columns: Sequence[str], constant: Collection[str]) -> list[str]:
    """``hp.*`` columns: searched ones first, constant ones after, each by name."""
    hparams = [c for c in columns if c.startswith("hp.")]
    searched = [c for c in hparams if c.removeprefix("hp.") not in constant]
    return searched + [c for c in hparams if c.removeprefix("hp.") in constant]


def trial_columns(rows: pd.DataFrame, constant: Collection[str]) -> list[str]:
    """The column order of a trials table (see the module docstring)."""
    ordered = hparam_columns(list(rows.columns), constant)
    searched = [c for c in ordered if c.removeprefix("hp.") not in constant]
    return [*HEAD, *searched, *COST, *TAIL, *ordered[len(searched) :]]


def trial_column_config(rows: pd.DataFrame) -> dict[str, Any]:
    """Headers and formats: hyperparameters without their ``hp.`` prefix, 4 digits."""
    config: dict[str, Any] = {
        # Pinned, so the trial stays in view while the hyperparameters scroll past.
        "open": st.column_config.LinkColumn("open", display_text="open ↗", pinned=True),
        "number": st.column_config.NumberColumn("trial #", pinned=True, format="#%d"),
        "metric": st.column_config.NumberColumn("metric", format=_format.COLUMN),
        "slot_seconds": st.column_config.NumberColumn("slot·s", format=_format.COLUMN),
        "duration_s": st.column_config.NumberColumn("duration (s)", format=_format.COLUMN),
        "started": st.column_config.DatetimeColumn("started (UTC)"),
    }
    for column in rows.columns:
        if not column.startswith("hp."):
            continue
        name = column.removeprefix("hp.")
        if pd.api.types.is_float_dtype(rows[column]):
            config[column] = st.column_config.NumberColumn(name, format=_format.COLUMN)
        else:
            config[column] = st.column_config.Column(name)
    return config


def shown_hparams(rows: pd.DataFrame) -> pd.DataFrame:
    """``rows`` with mixed-type hyperparameter columns as 4-digit text (numbers stay)."""
    mixed = [
        c
        for c in rows.columns
        if c.startswith("hp.") and rows[c].dtype == object and rows[c].map(type).nunique() > 1
    ]
    return rows.assign(**{c: rows[c].map(_format.number) for c in mixed})
