"""Reset a warm worker's process between two trials, as if the next one started fresh.

A warm job's ranks run one trial after another in the same process, so whatever the
previous trial left behind would leak into the next: a ``torch.set_default_dtype``,
deterministic algorithms switched on, TF32 allowed, grad mode off, autocast left
enabled, cached CUDA blocks, and the module globals of the user's own code (a counter,
a cache, a registry filled at import). Any of these would make a trial's result depend
on which trial ran before it on the same job. This module puts them back:

* :class:`TorchGlobals` captures torch's process-global settings once, when the job
  starts, and restores them after every trial;
* :func:`reimport_user_modules` drops the user's modules from :data:`sys.modules`, so
  the next import re-executes them with fresh globals;
* :func:`release_accelerator_memory` hands cached CUDA memory back and resets the peak
  statistics the next trial reports;
* :func:`reset_between_trials` does all of it in the right order.

RNG state is not touched here: every trial re-seeds its generators itself. Nothing here
reads the database or talks to other processes, so each rank resets on its own.
"""

from __future__ import annotations

import functools
import gc
import importlib
import os
import site
import sys
import sysconfig
from dataclasses import dataclass
from importlib.machinery import ModuleSpec
from pathlib import Path
from typing import Any

import torch

# Top-level packages whose modules are never dropped, wherever their files are: our own
# packages (a model_dir may be the repository itself) and the libraries whose module
# state (registered ops, dispatch tables) must not be imported twice into one process.
_PROTECTED_PACKAGES = frozenset(
    {"__main__", "__mp_main__", "trials", "searcher", "storage", "ui", "torch", "numpy"}
)

# Torch's per-backend fp32 precision knobs (torch >= 2.9), relative to ``torch.backends``,
# parents before children: setting a parent to a precision overwrites its children, so
# the children are restored after it. ``torch.backends.mkldnn.fp32_precision`` is left
# out: its setter writes the generic knob (the first entry), which is how it changes.
_FP32_PRECISION_KNOBS = (
    "",
    "cudnn",
    "cuda.matmul",
    "cudnn.conv",
    "cudnn.rnn",
    "mkldnn.matmul",
    "mkldnn.conv",
    "mkldnn.rnn",
)


@dataclass(frozen=True)
class _AutocastState:
    """Autocast's flag and dtype for one device type."""

    device_type: str
    enabled: bool
    dtype: torch.dtype


@dataclass(frozen=True)
class TorchGlobals:
    """Torch's process-global settings that a trial commonly changes, captured to restore.

    Grad mode and autocast are thread-local in torch: capture and restore on the thread
    that runs the trials. On torch with per-backend ``fp32_precision`` knobs, the legacy
    getters (``torch.get_float32_matmul_precision``, ``torch.backends.cudnn.allow_tf32``)
    raise torch's ``RuntimeError`` once the knobs disagree with them, and so does
    :meth:`capture` then; restoring works from any state.

    Example:
        >>> settings = TorchGlobals.capture()
        >>> torch.set_default_dtype(torch.float64)
        >>> settings.restore()
        >>> torch.get_default_dtype()
        torch.float32
    """

    default_dtype: torch.dtype
    num_threads: int
    deterministic_algorithms: bool
    deterministic_warn_only: bool
    anomaly_enabled: bool
    anomaly_check_nan: bool
    autocast: tuple[_AutocastState, ...]
    autocast_cache_enabled: bool
    grad_enabled: bool
    float32_matmul_precision: str
    cudnn_benchmark: bool
    cudnn_deterministic: bool
    cuda_matmul_allow_tf32: bool
    cudnn_allow_tf32: bool
    # (knob, precision) for each of _FP32_PRECISION_KNOBS; empty on torch without them.
    fp32_precisions: tuple[tuple[str, str], ...]

    @classmethod
    def capture(cls) -> TorchGlobals:
        """The settings as they are now.

        Example:
            >>> TorchGlobals.capture().default_dtype
            torch.float32
        """
        return cls(
            default_dtype=torch.get_default_dtype(),
            num_threads=torch.get_num_threads(),
            deterministic_algorithms=torch.are_deterministic_algorithms_enabled(),
            deterministic_warn_only=torch.is_deterministic_algorithms_warn_only_enabled(),
            anomaly_enabled=torch.is_anomaly_enabled(),
            anomaly_check_nan=torch.is_anomaly_check_nan_enabled(),
            autocast=tuple(
                _AutocastState(
                    device_type,
                    torch.is_autocast_enabled(device_type),
                    torch.get_autocast_dtype(device_type),
                )
                for device_type in _autocast_device_types()
            ),
            autocast_cache_enabled=torch.is_autocast_cache_enabled(),
            grad_enabled=torch.is_grad_enabled(),
            float32_matmul_precision=torch.get_float32_matmul_precision(),
            cudnn_benchmark=torch.backends.cudnn.benchmark,
            cudnn_deterministic=torch.backends.cudnn.deterministic,
            cuda_matmul_allow_tf32=torch.backends.cuda.matmul.allow_tf32,
            cudnn_allow_tf32=torch.backends.cudnn.allow_tf32,
            fp32_precisions=tuple(
                (knob, _fp32_precision_owner(knob).fp32_precision)
                for knob in _fp32_precision_knobs()
            ),
        )

    def restore(self) -> None:
        """Put every captured setting back.

        Example:
            >>> settings = TorchGlobals.capture()
            >>> torch.use_deterministic_algorithms(True)
            >>> settings.restore()
            >>> torch.are_deterministic_algorithms_enabled()
            False
        """
        torch.set_default_dtype(self.default_dtype)
        torch.set_num_threads(self.num_threads)
        # torch's setter also sets Inductor's flag, importing Inductor (about 800 modules,
        # sympy's among them: ~0.85 s on the first hand-over, and ~0.1 s more collecting
        # at the next) into a job whose trials never used it. Not imported, that flag is
        # as a fresh process has it; so the setter runs only when either differs.
        if (
            "torch._inductor.config" in sys.modules
            or torch.are_deterministic_algorithms_enabled() != self.deterministic_algorithms
            or torch.is_deterministic_algorithms_warn_only_enabled()
            != self.deterministic_warn_only
        ):
            torch.use_deterministic_algorithms(
                self.deterministic_algorithms, warn_only=self.deterministic_warn_only
            )
        torch.set_anomaly_enabled(self.anomaly_enabled, self.anomaly_check_nan)
        for state in self.autocast:
            torch.set_autocast_enabled(state.device_type, state.enabled)
            torch.set_autocast_dtype(state.device_type, state.dtype)
        torch.set_autocast_cache_enabled(self.autocast_cache_enabled)
        # Weights cast under the previous trial's autocast would otherwise stay alive
        # (and be reused) until the next autocast region exits.
        torch.clear_autocast_cache()
        torch.set_grad_enabled(self.grad_enabled)
        # cuBLAS's TF32 flag is a view of the matmul precision ("highest" or not), and
        # setting it turns "medium" into "high": so the flag first, the precision last.
        torch.backends.cuda.matmul.allow_tf32 = self.cuda_matmul_allow_tf32
        torch.set_float32_matmul_precision(self.float32_matmul_precision)
        torch.backends.cudnn.allow_tf32 = self.cudnn_allow_tf32
        torch.backends.cudnn.benchmark = self.cudnn_benchmark
        torch.backends.cudnn.deterministic = self.cudnn_deterministic
        # Last, so the exact per-backend values win over what the legacy setters above
        # wrote into them (those set "ieee"/"tf32" where a fresh process has "none").
        for knob, precision in self.fp32_precisions:
            _fp32_precision_owner(knob).fp32_precision = precision


def reimport_user_modules(model_dir: str) -> list[str]:
    """Drop the modules loaded from ``model_dir`` so that their next import runs afresh.

    A module counts as the user's when its file (or, for a namespace package, every
    directory of its path) lies under ``model_dir`` as the user sees it: both made
    absolute, symlinks not followed. A module in the folder that is a link to a file
    elsewhere is the user's (it was imported from the folder, and its globals would
    leak into the next trial), while a module imported from elsewhere is not, even when
    it links into the folder. The runtime imports the user's code through ``model_dir``
    itself (the first entry of ``sys.path``), so its modules' files are spelled as
    ``model_dir`` is, links in the folder's own path included. Modules of the
    interpreter's standard library and site-packages (wherever their links lead),
    ``__main__``, and the packages ``trials``, ``searcher``, ``storage``, ``ui``,
    ``torch`` and ``numpy`` stay, even when ``model_dir`` contains them.

    Returns:
        The dropped module names, sorted.

    Example:
        >>> import json, torch
        >>> (folder / "mymodel").mkdir()
        >>> for name in ("__init__.py", "layers.py"):
        ...     (folder / "mymodel" / name).touch()
        >>> sys.path.insert(0, str(folder))
        >>> import mymodel.layers
        >>> sys.path.remove(str(folder))
        >>> reimport_user_modules(str(folder))
        ['mymodel', 'mymodel.layers']
        >>> "json" in sys.modules and "torch" in sys.modules
        True
    """
    root = os.path.abspath(model_dir)
    kept = _kept_modules.setdefault(root, {})
    dropped: list[str] = []
    # A snapshot: other threads may import while we look.
    for name, module in list(sys.modules.items()):
        if kept.get(name) is module:
            continue
        if name.partition(".")[0] not in _PROTECTED_PACKAGES:
            locations = _module_locations(module)
            if locations and _lies_under(locations, root):
                del sys.modules[name]
                dropped.append(name)
                continue
        kept[name] = module
    # Finders cache directory listings; a file the user changed or added must be seen.
    importlib.invalidate_caches()
    return sorted(dropped)


def release_accelerator_memory() -> None:
    """Return the CUDA caching allocator's free blocks and reset its peak statistics.

    Does nothing where CUDA is unavailable or not yet initialized in this process: a
    CPU trial must not pay for (or fail on) CUDA initialization here.

    Example:
        >>> cuda_was_initialized = torch.cuda.is_initialized()
        >>> release_accelerator_memory()
        >>> torch.cuda.is_initialized() == cuda_was_initialized  # it never initializes CUDA
        True
    """
    if not (torch.cuda.is_available() and torch.cuda.is_initialized()):
        return
    # cuBLAS keeps a workspace per handle and stream for the life of the process,
    # allocated through the caching allocator wherever the trial's first matrix product
    # found room: often inside the largest block the trial had freed, which then cannot
    # be returned (seen on an H100: a 32 MiB workspace pinned a 1 GiB block into the
    # next trial). Dropped here, the next trial's first product allocates a new one.
    # torch has no public call for it; without the private one the cache is emptied
    # around the workspaces, as before.
    clear_cublas_workspaces = getattr(torch._C, "_cuda_clearCublasWorkspaces", None)
    if clear_cublas_workspaces is not None:
        torch.cuda.synchronize()
        clear_cublas_workspaces()
    # One call empties every device's cache; entering each device instead would create
    # a CUDA context on GPUs this rank never used.
    torch.cuda.empty_cache()
    for device in range(torch.cuda.device_count()):
        torch.cuda.reset_peak_memory_stats(device)


def reset_between_trials(
    globals_: TorchGlobals, *, model_dir: str, keep_entrypoint_module: bool
) -> list[str]:
    """Reset this process after a trial so the next behaves as in a fresh process.

    Args:
        globals_: The settings captured when the job started.
        model_dir: The finished trial's model directory, whose modules are dropped.
        keep_entrypoint_module: Keep the user's modules (and their globals) loaded,
            for entrypoints that are expensive to import and known to hold no state.

    Returns:
        The dropped module names, sorted (empty when they are kept).

    Example:
        >>> settings = TorchGlobals.capture()
        >>> _ = torch.set_grad_enabled(False)
        >>> reset_between_trials(settings, model_dir="/nonexistent", keep_entrypoint_module=True)
        []
        >>> torch.is_grad_enabled()
        True
    """
    dropped = [] if keep_entrypoint_module else reimport_user_modules(model_dir)
    # After the drop, so the user's module globals (a cached model, a tensor registry)
    # are garbage too, and before empty_cache, which can only return freed blocks.
    gc.collect()
    # What survived (modules, the job's own objects, context.cache) is moved out of the
    # collector's reach, so the next trial's collections, and this one after it, scan only
    # what that trial made: a full collection of torch's heap took ~0.2-0.5 s per trial.
    # Objects are still freed by reference counting; only a reference cycle among them
    # that becomes garbage later stays until the process ends.
    gc.freeze()
    globals_.restore()
    release_accelerator_memory()
    return dropped


def _autocast_device_types() -> tuple[str, ...]:
    # Autocast keeps a flag and dtype per device type, also for "cuda" on machines
    # without a GPU; reading them does not initialize CUDA.
    return tuple(
        device_type
        for device_type in ("cpu", "cuda")
        if torch.amp.is_autocast_available(device_type)
    )


def _fp32_precision_knobs() -> tuple[str, ...]:
    # Older torch has only the legacy flags, which TorchGlobals restores anyway.
    return _FP32_PRECISION_KNOBS if hasattr(torch.backends, "fp32_precision") else ()


def _fp32_precision_owner(knob: str) -> Any:
    """The object under ``torch.backends`` whose ``fp32_precision`` is ``knob``."""
    return functools.reduce(getattr, knob.split(".") if knob else [], torch.backends)


def _module_locations(module: object) -> tuple[str, ...]:
    """Where ``module`` was loaded from, as written: its file, or a namespace package's dirs."""
    # Its __dict__, not getattr: sys.modules also holds lazy modules and other objects
    # whose __getattr__ computes (or imports) what it is asked for.
    namespace = getattr(module, "__dict__", None)
    if not isinstance(namespace, dict):
        return ()
    file = namespace.get("__file__")
    if isinstance(file, str):
        return (file,)
    # Namespace packages have no file; builtins and frozen modules have no location.
    spec = namespace.get("__spec__")
    if (
        isinstance(spec, ModuleSpec)
        and spec.origin is None
        and spec.submodule_search_locations is not None
    ):
        return tuple(entry for entry in spec.submodule_search_locations if isinstance(entry, str))
    return ()


# The modules judged to stay, by model_dir and name: the same module object is not
# judged again after the next trial (a few thousand of them, ~1 ms a trial). Held, so
# that a module judged is never mistaken for another one at its address.
_kept_modules: dict[str, dict[str, object]] = {}


# Cached per job: the modules that are not the user's (torch, the standard library, a few
# thousand) stay loaded from trial to trial, and checking all their paths again after
# every trial cost ~0.15 s, a whole epoch of a small model. A symlink retargeted while the
# job runs is not seen; the job's next cold start sees it.
@functools.cache
def _lies_under(locations: tuple[str, ...], root: str) -> bool:
    """Whether every one of ``locations`` lies under ``root`` and outside the interpreter's.

    Under ``root`` as written (``root`` is absolute, links not followed); outside the
    interpreter's libraries where the links lead, so a virtual environment inside the
    user's folder stays loaded.
    """
    protected_roots = _interpreter_library_dirs()
    model_root = Path(root)
    for entry in locations:
        location = Path(os.path.abspath(entry))
        if not location.is_relative_to(model_root):
            return False
        real = location.resolve()
        if any(real.is_relative_to(lib) for lib in protected_roots):
            return False
    return True


@functools.cache
def _interpreter_library_dirs() -> tuple[Path, ...]:
    """The standard library and site-packages directories of this interpreter and its base."""
    dirs = set(site.getsitepackages())
    if site.ENABLE_USER_SITE:
        dirs.add(site.getusersitepackages())
    for prefix in {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix}:
        paths = sysconfig.get_paths(
            vars={
                "base": prefix,
                "platbase": prefix,
                "installed_base": prefix,
                "installed_platbase": prefix,
            }
        )
        dirs.update(paths[key] for key in ("stdlib", "platstdlib", "purelib", "platlib"))
    return tuple(Path(entry).resolve() for entry in dirs)
