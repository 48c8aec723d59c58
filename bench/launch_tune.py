"""The tiny 2-rank job of ``bench/launch_overhead.py`` as K Ray Tune trials of Ray Train.

Run by ``launch_overhead.py --executor ray`` as a driver of its own on the Ray test
cluster (``RAY_ADDRESS``, Ray Client): a ``tune.Tuner`` of K trials, one at a time,
each a Ray Train ``TorchTrainer`` of 2 workers (1 CPU each) running
:func:`launch_trial.train` in the gloo group Ray Train sets up, then averaging the loss
across the workers as the bare script does; each trial's driver function (Ray Train
V2's way of tuning a trainer) runs on the head node and takes no CPU, so the two
workers fill one worker node as the other kinds' 2 ranks do. Storage is a folder (the nodes share this machine's
filesystem; Ray Tune and Train keep their results there).

Prints one JSON line: ``{"init_s": ..., "fit_s": ..., "trials": K, "completed": N}``
(``ray.init`` apart, so that a per-trial cost is ``fit_s / K``).

    RAY_ADDRESS=ray://HEAD:10001 python bench/launch_tune.py K STORAGE_FOLDER
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

WORKERS = 2


def _train_per_worker(config: dict[str, Any]) -> None:
    import torch
    import torch.distributed as dist
    from launch_trial import train as train_tiny
    from ray import train

    loss, _ = train_tiny(torch.device("cpu"))
    averaged = torch.tensor([loss])
    dist.all_reduce(averaged)
    averaged /= dist.get_world_size()
    train.report({"loss": float(averaged.item())})


def _trial(config: dict[str, Any]) -> None:
    """One Tune trial: a TorchTrainer of ``WORKERS`` workers, fitted."""
    from ray import tune
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer
    from ray.tune.integration.ray_train import TuneReportCallback

    trainer = TorchTrainer(
        _train_per_worker,
        train_loop_config=config,
        scaling_config=ScalingConfig(num_workers=WORKERS, resources_per_worker={"CPU": 1}),
        run_config=RunConfig(
            name=f"train-{tune.get_context().get_trial_id()}",
            storage_path=config["storage"],
            callbacks=[TuneReportCallback()],
        ),
    )
    trainer.fit()


def main() -> None:
    k, storage = int(sys.argv[1]), str(Path(sys.argv[2]).resolve())
    import ray
    from ray import tune

    began = time.time()
    # launch_trial.py (in the working folder) must reach the workers: it travels as the
    # job's working_dir.
    ray.init(
        logging_level="ERROR",
        runtime_env={"working_dir": str(Path.cwd())},
    )
    init_s = time.time() - began
    tuner = tune.Tuner(
        # On the head (the test cluster's host_rayhead resource): no CPU of the workers.
        tune.with_resources(_trial, {"CPU": 0, "host_rayhead": 0.001}),
        param_space={"storage": storage, "lr": tune.uniform(0.01, 0.1)},
        tune_config=tune.TuneConfig(num_samples=k, max_concurrent_trials=1),
        run_config=tune.RunConfig(name="tune", storage_path=storage, verbose=0),
    )
    began = time.time()
    results = tuner.fit()
    fit_s = time.time() - began
    completed = sum(1 for result in results if result.error is None)
    print(json.dumps({"init_s": init_s, "fit_s": fit_s, "trials": k, "completed": completed}))


if __name__ == "__main__":
    main()
