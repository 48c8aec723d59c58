"""The runtime spec of one trial attempt: everything its ranks need, built from rows alone.

A pure builder (no database, no processes): the experiment (:class:`DriverContext`),
the trial's row, the attempt number and the checkpoint it restores go in, a
:class:`~trials.RuntimeSpec` comes out. :mod:`searcher.driver.running` stores it on the run
row and hands it to the executor.

Example:
    >>> spec = build_runtime_spec(ctx, trial, attempt=0, checkpoint=None)
    >>> spec.restore_checkpoint_path is None
    True
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import searcher.submit.samplers as samplers
from searcher.driver.context import DriverContext
from searcher.logs import scratch_root
from storage import Checkpoint, Trial
from trials import RuntimeSpec, checkpoint_root
from trials.config import ExperimentConfig, WarmSpec


def build_runtime_spec(
    ctx: DriverContext,
    trial: Trial,
    attempt: int,
    checkpoint: Checkpoint | None,
    *,
    log_path: Path | None = None,
    warm_job_id: int | None = None,
) -> RuntimeSpec:
    """The spec of ``trial``'s attempt ``attempt``, restoring ``checkpoint`` if given.

    ``warm_job_id``: the attempt runs on that warm job (``resources.reuse_workers``),
    whose ranks then wait for the next trial instead of exiting.
    """
    warm = (
        None
        if warm_job_id is None
        else WarmSpec(
            job_id=warm_job_id,
            keep_entrypoint_module=ctx.config.resources.keep_entrypoint_module,
            driver_lease_s=ctx.timings.lease_s,
        )
    )
    spec = runtime_spec_of(
        ctx.config,
        db_url=ctx.db_url,
        experiment_id=ctx.experiment_id,
        checkpoint_folder=ctx.checkpoint_folder,
        study_name=ctx.study_name,
        model_dir=ctx.model_dir,
        trial_id=trial.id,
        optuna_trial_id=trial.optuna_trial_id,
        optuna_trial_number=trial.optuna_trial_number,
        hparams=trial.hparams,
        slots_per_trial=trial.slots_per_trial,
        attempt=attempt,
        checkpoint_path=checkpoint.path if checkpoint else None,
        agent=ctx.pool.agents[0].name,
        run_dir=ctx.run_dir,
    )
    return spec.model_copy(
        update={"log_path": None if log_path is None else str(log_path), "warm": warm}
    )


def runtime_spec_of(
    config: ExperimentConfig,
    *,
    db_url: str,
    experiment_id: int,
    checkpoint_folder: str,
    study_name: str,
    model_dir: Path,
    trial_id: int,
    optuna_trial_id: int,
    optuna_trial_number: int,
    hparams: dict[str, Any],
    slots_per_trial: int,
    attempt: int,
    checkpoint_path: str | None,
    agent: str,
    run_dir: Path,
) -> RuntimeSpec:
    """The spec of one attempt from plain values (the driver's, or a test's fixtures).

    The seed is distinct per trial and reproducible from the experiment's seed; the
    scratch folder is per trial under the experiment's (:func:`searcher.logs.scratch_root`
    of its log folder ``run_dir``).
    """
    pruner = samplers.pruner_spec(config)
    return RuntimeSpec(
        db_url=db_url,
        experiment_id=experiment_id,
        checkpoint_folder=checkpoint_folder,
        trial_id=trial_id,
        study_name=study_name,
        optuna_trial_id=optuna_trial_id,
        optuna_trial_number=optuna_trial_number,
        attempt=attempt,
        entrypoint=config.entrypoint,
        model_dir=str(model_dir),
        hparams=hparams,
        data=config.data,
        slots_per_trial=slots_per_trial,
        slot_share=config.resources.slot_share,
        max_length=config.searcher.max_length,
        searcher_metric=config.searcher.metric,
        smaller_is_better=config.searcher.smaller_is_better,
        pruning=pruner is not None,
        pruner=pruner,
        pruner_resource=config.searcher.pruner.resource,
        objectives=[objective.name for objective in config.searcher.objectives],
        min_validation_period=config.min_validation_period,
        min_checkpoint_period=config.min_checkpoint_period,
        optimizations=config.optimizations,
        checkpoint_storage=config.checkpoint_storage.model_copy(
            update={"path": str(checkpoint_root(config, model_dir))}
        ),
        profiling=config.profiling,
        scratch_dir=str(scratch_root(run_dir) / f"trial-{trial_id}"),
        # Distinct per trial (as Determined does), reproducible from the experiment seed.
        seed=None if config.searcher.seed is None else config.searcher.seed + optuna_trial_number,
        restore_checkpoint_path=checkpoint_path,
        agent=agent,
    )
