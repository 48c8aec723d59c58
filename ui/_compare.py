"""The Compare page's tables: hyperparameters of several trials as a diff.

Example:
    >>> import pandas as pd
    >>> rows = pd.DataFrame({"number": [3, 5], "hp.lr": [0.1, 0.01], "hp.opt": ["sgd", "sgd"]})
    >>> hparam_diff(rows)[["hyperparameter", "differs", "#3", "#5"]].values.tolist()
    [['lr', True, '0.1', '0.01'], ['opt', False, 'sgd', 'sgd']]
"""

from __future__ import annotations

import pandas as pd

from trials import labels
from ui import _format


def trial_label(number: int) -> str:
    """How a trial is named in compared charts and tables: ``#NUMBER``, as everywhere."""
    return labels.trial_label(None, number)


def hparam_diff(trials: pd.DataFrame) -> pd.DataFrame:
    """One row per hyperparameter, one column per trial; differing values first.

    ``trials`` has a ``number`` column and ``hp.<name>`` columns (as
    :func:`trials.queries.trials_by_ids` returns them). A parameter one trial lacks
    counts as differing.
    """
    names = sorted(c.removeprefix("hp.") for c in trials.columns if c.startswith("hp."))
    labels = [trial_label(int(n)) for n in trials["number"]]
    rows = []
    for name in names:
        # One text column per trial: mixed types (0.1 beside "sgd") would not fit a number
        # column. Whether values differ is decided on the full values, not the shown ones.
        values = list(trials[f"hp.{name}"])
        rows.append(
            {
                "hyperparameter": name,
                "differs": len({_format.full(v) for v in values}) > 1,
                **{label: _format.number(v) for label, v in zip(labels, values, strict=True)},
            }
        )
    frame = pd.DataFrame(rows, columns=["hyperparameter", "differs", *labels])
    return frame.sort_values(
        ["differs", "hyperparameter"], ascending=[False, True], kind="stable"
    ).reset_index(drop=True)
