"""The environment of a trial on a share of one slot, and whether CUDA MPS runs here.

A share trial (``resources.slots_per_trial`` 0.5, 0.25, 0.125) has one rank on one slot
that other share trials use at the same time. Its node's environment says so:

* :data:`SHARE_ENV_VAR` holds its share; on a GPU the rank caps its memory at that
  share of the GPU (:mod:`trials.runtime._memory_cap`), so a trial that outgrows its
  share fails itself with one line, not a neighbour with an unexplained OOM;
* ``CUDA_VISIBLE_DEVICES`` names its slot's GPU only, as for any placement
  (:func:`trials.launch.launcher.gpu_environment`);
* where the CUDA MPS control daemon runs (:func:`mps_running`),
  ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` limits the trial to its share of the GPU's
  threads (rounded up to a whole percent: 50, 25, 13). Without MPS the trials'
  contexts time-share the GPU, as any processes on one GPU do.

Pure but for :func:`mps_running`, which looks at the daemon's pipe.

Example:
    >>> share_environment(0.25, use_gpus=True, mps=True)
    {'SLOTSWEEP_SLOT_SHARE': '0.25', 'CUDA_MPS_ACTIVE_THREAD_PERCENTAGE': '25'}
    >>> share_environment(0.125, use_gpus=False, mps=True)
    {'SLOTSWEEP_SLOT_SHARE': '0.125'}
"""

from __future__ import annotations

import math
import os
import stat
from collections.abc import Mapping
from pathlib import Path

SHARE_ENV_VAR = "SLOTSWEEP_SLOT_SHARE"
"""The share of its one slot a trial's rank runs on (absent: whole slots)."""

MPS_THREADS_ENV_VAR = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"
#: Where the MPS control daemon and its clients meet, unless CUDA_MPS_PIPE_DIRECTORY says.
DEFAULT_MPS_PIPE_DIRECTORY = Path("/tmp/nvidia-mps")


def share_environment(share: float, *, use_gpus: bool, mps: bool) -> dict[str, str]:
    """The environment a share trial's node adds for its share (nothing for whole slots)."""
    if share >= 1.0:
        return {}
    env = {SHARE_ENV_VAR: f"{share:g}"}
    if use_gpus and mps:
        env[MPS_THREADS_ENV_VAR] = str(math.ceil(share * 100))
    return env


def share_from_environment(environ: Mapping[str, str] | None = None) -> float:
    """The share this process runs on (1.0: whole slots, or no share said).

    Example:
        >>> share_from_environment({SHARE_ENV_VAR: "0.5"}), share_from_environment({})
        (0.5, 1.0)
    """
    environ = os.environ if environ is None else environ
    try:
        share = float(environ.get(SHARE_ENV_VAR, "1"))
    except ValueError:
        return 1.0
    return share if 0.0 < share < 1.0 else 1.0


def mps_pipe_directory(environ: Mapping[str, str] | None = None) -> Path:
    """Where the MPS control daemon's pipes are (``CUDA_MPS_PIPE_DIRECTORY`` or its default)."""
    environ = os.environ if environ is None else environ
    return Path(environ.get("CUDA_MPS_PIPE_DIRECTORY") or DEFAULT_MPS_PIPE_DIRECTORY)


def mps_running(environ: Mapping[str, str] | None = None) -> bool:
    """Whether the CUDA MPS control daemon runs for this machine's clients.

    The daemon listens on the named pipe ``control`` in its pipe directory; CUDA
    clients find it there. Without the pipe, CUDA starts no MPS server and trials on
    one GPU time-share it.

    Example:
        >>> mps_running({"CUDA_MPS_PIPE_DIRECTORY": "/nonexistent"})
        False
    """
    try:
        mode = (mps_pipe_directory(environ) / "control").stat().st_mode
    except OSError:
        return False
    return stat.S_ISFIFO(mode)
