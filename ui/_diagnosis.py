"""The Diagnosis page's tables and the trial page's "diagnose this configuration" command.

Plain functions over a stored ``slotsweep diagnose --json`` document (its ``format``
1), with no Streamlit, so they are tested as functions.

Example:
    >>> diagnose_command("/m/experiment.yaml", {"lr": 0.01, "optimizer": "sgd"}, ["lr", "optimizer"], None)
    'slotsweep diagnose /m/experiment.yaml --hparams lr=0.01 optimizer=sgd'
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Iterable, Mapping
from typing import Any

import pandas as pd

from storage import redact_url

# The parts of a step the chart stacks, in the order drawn.
STEP_PARTS = ("compute", "communication", "input")


def diagnose_command(
    config_path: str | None,
    hparams: Mapping[str, Any],
    searched: Iterable[str],
    db_url: str | None,
) -> str:
    """The ``slotsweep diagnose`` command line for a trial's point of the space.

    Only searched hyperparameters are given (``--hparams`` refuses constants); a
    database URL is shown without its password. Without a stored config path the
    command names ``CONFIG`` for the user to fill in.
    """
    words = ["slotsweep", "diagnose", shlex.quote(config_path) if config_path else "CONFIG"]
    values = [
        f"{name}={value if isinstance(value, str) else json.dumps(value)}"
        for name, value in hparams.items()
        if name in set(searched)
    ]
    if values:
        words += ["--hparams", *(shlex.quote(v) for v in values)]
    if db_url:
        words += ["--db", shlex.quote(redact_url(db_url))]
    return " ".join(words)


def probe_table(report: Mapping[str, Any]) -> pd.DataFrame:
    """One row per probe: samples/s (median and range), step, input and train_batch in ms,
    and the system metrics it recorded."""
    rows = []
    for probe in report.get("probes", []):
        rate, step, split = probe["samples_per_s"], probe["step_s"], probe["split_s"]
        rows.append(
            {
                "probe": probe["name"],
                "what": probe["description"],
                "slots": probe["slots"],
                "samples_per_s": rate["median"],
                "samples_per_s_low": rate["low"],
                "samples_per_s_high": rate["high"],
                "step_ms": step["median"] * 1e3,
                "input_ms": split["input_s"] * 1e3,
                "train_batch_ms": split["train_batch_s"] * 1e3,
                "windows": len(probe["windows"]),
                **{name: value for name, value in sorted(probe.get("system", {}).items())},
            }
        )
    return pd.DataFrame(rows)


def step_split_frame(report: Mapping[str, Any]) -> pd.DataFrame:
    """A configured step's milliseconds as compute, communication and input (the chart).

    Example:
        >>> step_split_frame({"step_split_s": {"compute": 0.002, "communication": 0.001,
        ...                                    "input": 0.0}})["ms"].tolist()
        [2.0, 1.0, 0.0]
    """
    split = report.get("step_split_s") or {}
    return pd.DataFrame(
        {
            "part": list(STEP_PARTS),
            "ms": [float(split.get(part, 0.0)) * 1e3 for part in STEP_PARTS],
            "step": ["configured step"] * len(STEP_PARTS),
        }
    )


def sweep_frame(report: Mapping[str, Any]) -> pd.DataFrame:
    """The bucket sweep: size (MB) and the exchange's median time (ms), by size."""
    exchange = report.get("exchange") or {}
    sweep = exchange.get("sweep_step_s") or {}
    frame = pd.DataFrame(
        {
            "bucket_mb": [float(size) for size in sweep],
            "exchange_ms": [spread["median"] * 1e3 for spread in sweep.values()],
        }
    )
    return frame.sort_values("bucket_mb", ignore_index=True)


def share_text(spread: Mapping[str, float] | None) -> str:
    """``42% (30-50%)``: a share or an efficiency with its range over the windows.

    Example:
        >>> share_text({"median": 0.42, "low": 0.3, "high": 0.5}), share_text(None)
        ('42% (30-50%)', 'not measured')
    """
    if spread is None:
        return "not measured"
    return f"{spread['median']:.0%} ({spread['low'] * 100:.0f}-{spread['high']:.0%})"
