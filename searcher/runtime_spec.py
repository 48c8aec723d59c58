"""The runtime spec of one trial attempt: everything its ranks need, built from rows alone.

A pure builder (no database, no processes): the experiment (:class:`DriverContext`),
the trial's row, the attempt number and the checkpoint it restores go in, a
:class:`~trials.RuntimeSpec` comes out. :mod:`searcher.running` stores it on the run
row and hands it to the executor.

Example:
    >>> spec = build_runtime_spec(ctx, trial, attempt=0, checkpoint=None)  # doctest: +SKIP
    >>> spec.restore_checkpoint_path is None  # doctest: +SKIP
    True
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from searcher import samplers
from searcher.config import ExperimentConfig
from searcher.driver_context import DriverContext
from storage import Checkpoint, Trial
from trials import RuntimeSpec


def checkpoint_root(config: ExperimentConfig, model_dir: Path) -> Path:
    """Where the experiment's checkpoints go: the configured path, relative to ``model_dir``.

    Example:
        >>> checkpoint_root(config, Path("/models/digits"))  # doctest: +SKIP
        PosixPath('/models/digits/checkpoints')
    """
    path = Path(config.checkpoint_storage.path)
    return path if path.is_absolute() else (model_dir / path).resolve()


def build_runtime_spec(
    ctx: DriverContext, trial: Trial, attempt: int, checkpoint: Checkpoint | None
) -> RuntimeSpec:
    """The spec of ``trial``'s attempt ``attempt``, restoring ``checkpoint`` if given.

    The seed is distinct per trial and reproducible from the experiment's seed; the
    scratch folder is per trial under the system's temporary folder.
    """
    config = ctx.config
    pruner = samplers.pruner_spec(config)
    return RuntimeSpec(
        db_url=ctx.db_url,
        experiment_id=ctx.experiment_id,
        trial_id=trial.id,
        study_name=ctx.study_name,
        optuna_trial_id=trial.optuna_trial_id,
        optuna_trial_number=trial.optuna_trial_number,
        attempt=attempt,
        entrypoint=config.entrypoint,
        model_dir=str(ctx.model_dir),
        hparams=trial.hparams,
        data=config.data,
        slots_per_trial=trial.slots_per_trial,
        max_length=config.searcher.max_length,
        searcher_metric=config.searcher.metric,
        smaller_is_better=config.searcher.smaller_is_better,
        pruning=pruner is not None,
        pruner=pruner,
        min_validation_period=config.min_validation_period,
        min_checkpoint_period=config.min_checkpoint_period,
        optimizations=config.optimizations,
        checkpoint_storage=config.checkpoint_storage.model_copy(
            update={"path": str(checkpoint_root(config, ctx.model_dir))}
        ),
        profiling=config.profiling,
        scratch_dir=str(
            Path(tempfile.gettempdir())
            / "slotsweep"
            / f"experiment-{ctx.experiment_id}"
            / f"trial-{trial.id}"
        ),
        # Distinct per trial (as Determined does), reproducible from the experiment seed.
        seed=None
        if config.searcher.seed is None
        else config.searcher.seed + trial.optuna_trial_number,
        restore_checkpoint_path=checkpoint.path if checkpoint else None,
        agent=ctx.pool.agents[0].name,
    )
