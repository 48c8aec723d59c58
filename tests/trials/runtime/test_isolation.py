"""A warm worker's reset between trials: torch's globals, the user's modules, CUDA memory."""

from __future__ import annotations

import gc
import importlib
import json
import sys
import types
import weakref
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy
import pytest
import torch

from trials.runtime._isolation import (
    TorchGlobals,
    reimport_user_modules,
    release_accelerator_memory,
    reset_between_trials,
)

HAS_FP32_PRECISION = hasattr(torch.backends, "fp32_precision")


@pytest.fixture(autouse=True)
def torch_globals() -> Iterator[TorchGlobals]:
    """The settings as the test found them, put back after it whatever it changed."""
    captured = TorchGlobals.capture()
    try:
        yield captured
    finally:
        captured.restore()


@pytest.fixture
def model_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """An importable user model directory; its modules leave sys.modules afterwards."""
    root = tmp_path / "model"
    root.mkdir()
    monkeypatch.syspath_prepend(str(root))
    yield root
    # Every module these tests write is named isolation_*.
    for name in [name for name in sys.modules if name.startswith("isolation_")]:
        del sys.modules[name]


def _flip_autocast(device_type: str) -> None:
    torch.set_autocast_enabled(device_type, not torch.is_autocast_enabled(device_type))


def _change_autocast_dtype(device_type: str) -> None:
    current = torch.get_autocast_dtype(device_type)
    torch.set_autocast_dtype(
        device_type, torch.float16 if current == torch.bfloat16 else torch.bfloat16
    )


def _change_fp32_precision(owner: Any) -> None:
    owner.fp32_precision = "ieee" if owner.fp32_precision != "ieee" else "tf32"


# (read the setting, change it to a value it does not have)
LEGACY_SETTINGS: list[Any] = [
    pytest.param(
        torch.get_default_dtype,
        lambda: torch.set_default_dtype(
            torch.float64 if torch.get_default_dtype() != torch.float64 else torch.float32
        ),
        id="default_dtype",
    ),
    pytest.param(
        torch.get_num_threads,
        lambda: torch.set_num_threads(1 if torch.get_num_threads() != 1 else 2),
        id="num_threads",
    ),
    pytest.param(
        torch.are_deterministic_algorithms_enabled,
        lambda: torch.use_deterministic_algorithms(
            not torch.are_deterministic_algorithms_enabled()
        ),
        id="deterministic_algorithms",
    ),
    pytest.param(
        torch.is_deterministic_algorithms_warn_only_enabled,
        lambda: torch.use_deterministic_algorithms(
            True, warn_only=not torch.is_deterministic_algorithms_warn_only_enabled()
        ),
        id="deterministic_warn_only",
    ),
    pytest.param(
        torch.is_anomaly_enabled,
        lambda: torch.set_anomaly_enabled(
            not torch.is_anomaly_enabled(), torch.is_anomaly_check_nan_enabled()
        ),
        id="anomaly_enabled",
    ),
    pytest.param(
        torch.is_anomaly_check_nan_enabled,
        lambda: torch.set_anomaly_enabled(
            torch.is_anomaly_enabled(), not torch.is_anomaly_check_nan_enabled()
        ),
        id="anomaly_check_nan",
    ),
    pytest.param(
        lambda: torch.is_autocast_enabled("cpu"), lambda: _flip_autocast("cpu"), id="autocast_cpu"
    ),
    pytest.param(
        lambda: torch.get_autocast_dtype("cpu"),
        lambda: _change_autocast_dtype("cpu"),
        id="autocast_dtype_cpu",
    ),
    pytest.param(
        lambda: torch.is_autocast_enabled("cuda"),
        lambda: _flip_autocast("cuda"),
        id="autocast_cuda",
    ),
    pytest.param(
        lambda: torch.get_autocast_dtype("cuda"),
        lambda: _change_autocast_dtype("cuda"),
        id="autocast_dtype_cuda",
    ),
    pytest.param(
        torch.is_autocast_cache_enabled,
        lambda: torch.set_autocast_cache_enabled(not torch.is_autocast_cache_enabled()),
        id="autocast_cache",
    ),
    pytest.param(
        torch.is_grad_enabled,
        lambda: torch.set_grad_enabled(not torch.is_grad_enabled()),
        id="grad_enabled",
    ),
    pytest.param(
        torch.get_float32_matmul_precision,
        lambda: torch.set_float32_matmul_precision(
            "medium" if torch.get_float32_matmul_precision() != "medium" else "highest"
        ),
        id="float32_matmul_precision",
    ),
    pytest.param(
        lambda: torch.backends.cudnn.benchmark,
        lambda: setattr(torch.backends.cudnn, "benchmark", not torch.backends.cudnn.benchmark),
        id="cudnn_benchmark",
    ),
    pytest.param(
        lambda: torch.backends.cudnn.deterministic,
        lambda: setattr(
            torch.backends.cudnn, "deterministic", not torch.backends.cudnn.deterministic
        ),
        id="cudnn_deterministic",
    ),
    pytest.param(
        lambda: torch.backends.cuda.matmul.allow_tf32,
        lambda: setattr(
            torch.backends.cuda.matmul, "allow_tf32", not torch.backends.cuda.matmul.allow_tf32
        ),
        id="cuda_matmul_allow_tf32",
    ),
    pytest.param(
        lambda: torch.backends.cudnn.allow_tf32,
        lambda: setattr(torch.backends.cudnn, "allow_tf32", not torch.backends.cudnn.allow_tf32),
        id="cudnn_allow_tf32",
    ),
]

# torch's per-backend precision knobs; a change to one alone leaves the legacy getters
# (and so TorchGlobals.capture) raising, as torch has it, until restored.
FP32_PRECISION_SETTINGS: list[Any] = [
    pytest.param(
        lambda: torch.backends.fp32_precision,
        lambda: setattr(
            torch.backends,
            "fp32_precision",
            "tf32" if torch.backends.fp32_precision != "tf32" else "ieee",
        ),
        id="fp32_precision_generic",
    ),
    pytest.param(
        lambda: torch.backends.cudnn.conv.fp32_precision,
        lambda: _change_fp32_precision(torch.backends.cudnn.conv),
        id="fp32_precision_cudnn_conv",
    ),
    pytest.param(
        lambda: torch.backends.mkldnn.matmul.fp32_precision,
        lambda: _change_fp32_precision(torch.backends.mkldnn.matmul),
        id="fp32_precision_mkldnn_matmul",
    ),
]
if not HAS_FP32_PRECISION:
    FP32_PRECISION_SETTINGS.clear()
SETTINGS = LEGACY_SETTINGS + FP32_PRECISION_SETTINGS


@pytest.mark.parametrize(("read", "change"), SETTINGS)
def test_restore_puts_each_setting_back(
    torch_globals: TorchGlobals, read: Callable[[], object], change: Callable[[], None]
) -> None:
    before = read()
    change()
    assert read() != before
    torch_globals.restore()
    assert read() == before
    assert TorchGlobals.capture() == torch_globals


@pytest.mark.parametrize(("read", "change"), LEGACY_SETTINGS)
def test_restore_puts_back_a_baseline_other_than_the_defaults(
    torch_globals: TorchGlobals, read: Callable[[], object], change: Callable[[], None]
) -> None:
    """Restoring to torch's defaults could pass by resetting; restoring to changed
    settings cannot."""
    change()
    changed, baseline = read(), TorchGlobals.capture()
    torch_globals.restore()
    assert read() != changed
    baseline.restore()
    assert read() == changed
    assert TorchGlobals.capture() == baseline


@pytest.mark.skipif(not HAS_FP32_PRECISION, reason="torch without fp32_precision")
def test_restore_puts_back_a_baseline_of_fp32_precision_knobs() -> None:
    """A baseline set with the per-backend knobs (those the legacy getters do not check;
    the others make torch's legacy getters, and so capture, raise)."""
    knobs = {
        "generic": torch.backends,
        "mkldnn.conv": torch.backends.mkldnn.conv,
        "mkldnn.rnn": torch.backends.mkldnn.rnn,
    }

    def precisions() -> dict[str, str]:
        return {knob: owner.fp32_precision for knob, owner in knobs.items()}

    torch.backends.mkldnn.conv.fp32_precision = "tf32"
    torch.backends.mkldnn.rnn.fp32_precision = "ieee"
    expected = precisions()
    baseline = TorchGlobals.capture()
    torch.backends.fp32_precision = "tf32"
    torch.backends.mkldnn.conv.fp32_precision = "ieee"
    torch.backends.mkldnn.rnn.fp32_precision = "tf32"
    assert precisions() != expected
    baseline.restore()
    assert precisions() == expected
    assert TorchGlobals.capture() == baseline


def test_restore_puts_every_setting_back_at_once(torch_globals: TorchGlobals) -> None:
    applicable = [param.values for param in SETTINGS]
    before = [read() for read, _ in applicable]
    for _, change in applicable:
        change()
    torch_globals.restore()
    assert [read() for read, _ in applicable] == before
    assert TorchGlobals.capture() == torch_globals


def test_restore_undoes_a_mix_of_legacy_tf32_settings(torch_globals: TorchGlobals) -> None:
    """On torch whose legacy TF32 flags share state, this mix leaves the matmul precision
    unreadable; restore makes it readable again, as it was."""
    torch.set_float32_matmul_precision("medium")
    torch.backends.cuda.matmul.allow_tf32 = False
    torch_globals.restore()
    assert torch.get_float32_matmul_precision() == torch_globals.float32_matmul_precision
    assert torch.backends.cuda.matmul.allow_tf32 == torch_globals.cuda_matmul_allow_tf32


def test_restore_clears_the_autocast_cache(torch_globals: TorchGlobals) -> None:
    """A weight cast under autocast stays cached (and alive) until the outermost autocast
    region exits; a trial that ended inside one must not hand its casts to the next."""
    weight, x = torch.randn(4, 4, requires_grad=True), torch.randn(2, 4)

    def cast_of_weight() -> object:
        # The autograd node of the weight's cast: the same node while the cast is cached.
        out = torch.mm(x, weight)
        assert out.grad_fn is not None and out.dtype != torch.float32
        return out.grad_fn.next_functions[1][0]

    torch.set_autocast_enabled("cpu", True)
    first = cast_of_weight()
    assert cast_of_weight() is first
    torch_globals.restore()
    torch.set_autocast_enabled("cpu", True)
    assert cast_of_weight() is not first


def test_restore_leaves_inductor_unimported_when_nothing_deterministic_changed(
    torch_globals: TorchGlobals, monkeypatch: pytest.MonkeyPatch
) -> None:
    """torch's deterministic-algorithms setter imports Inductor (and sympy: ~0.85 s on a
    warm job's first hand-over); a job whose trials never changed the flags skips it."""
    calls: list[object] = []
    monkeypatch.delitem(sys.modules, "torch._inductor.config", raising=False)
    monkeypatch.setattr(torch, "use_deterministic_algorithms", lambda *a, **k: calls.append(a))
    torch_globals.restore()
    assert calls == []


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


COUNTER = "COUNT = 0\n\n\ndef bump():\n    global COUNT\n    COUNT += 1\n    return COUNT\n"


def test_reimport_gives_the_user_module_fresh_globals(model_dir: Path) -> None:
    _write(model_dir / "isolation_counter.py", COUNTER)
    old = importlib.import_module("isolation_counter")
    assert (old.bump(), old.bump()) == (1, 2)
    json_module, torch_module = sys.modules["json"], sys.modules["torch"]

    assert reimport_user_modules(str(model_dir)) == ["isolation_counter"]

    assert "isolation_counter" not in sys.modules
    assert sys.modules["json"] is json_module is json
    assert sys.modules["torch"] is torch_module is torch
    fresh = importlib.import_module("isolation_counter")
    assert fresh is not old
    assert (fresh.COUNT, old.COUNT) == (0, 2)


def test_reimport_sees_a_module_file_changed_on_disk(model_dir: Path) -> None:
    _write(model_dir / "isolation_version.py", "VERSION = 1\n")
    assert importlib.import_module("isolation_version").VERSION == 1
    _write(model_dir / "isolation_version.py", "VERSION = 22\n")
    reimport_user_modules(str(model_dir))
    assert importlib.import_module("isolation_version").VERSION == 22


@pytest.mark.parametrize("namespace", [False, True], ids=["package", "namespace_package"])
def test_reimport_drops_packages_and_their_submodules(model_dir: Path, namespace: bool) -> None:
    if not namespace:
        _write(model_dir / "isolation_pkg" / "__init__.py", "from . import sub\n")
    _write(model_dir / "isolation_pkg" / "sub.py", "STATE: list[int] = []\n")
    importlib.import_module("isolation_pkg.sub").STATE.append(1)

    assert reimport_user_modules(str(model_dir)) == ["isolation_pkg", "isolation_pkg.sub"]

    assert importlib.import_module("isolation_pkg.sub").STATE == []


def test_reimport_drops_a_module_that_links_to_a_file_elsewhere(
    model_dir: Path, tmp_path: Path
) -> None:
    """A link in the folder is the user's module: its globals must not reach the next trial."""
    _write(tmp_path / "shared" / "counter.py", COUNTER)
    (model_dir / "isolation_linked_file.py").symlink_to(tmp_path / "shared" / "counter.py")
    old = importlib.import_module("isolation_linked_file")
    assert old.bump() == 1

    assert reimport_user_modules(str(model_dir)) == ["isolation_linked_file"]

    assert importlib.import_module("isolation_linked_file").COUNT == 0


@pytest.mark.parametrize("namespace", [False, True], ids=["package", "namespace_package"])
def test_reimport_drops_a_package_whose_folder_links_elsewhere(
    model_dir: Path, tmp_path: Path, namespace: bool
) -> None:
    shared = tmp_path / "shared" / "pkg"
    if not namespace:
        _write(shared / "__init__.py", "")
    _write(shared / "sub.py", "STATE: list[int] = []\n")
    (model_dir / "isolation_linked_pkg").symlink_to(shared, target_is_directory=True)
    importlib.import_module("isolation_linked_pkg.sub").STATE.append(1)

    assert reimport_user_modules(str(model_dir)) == [
        "isolation_linked_pkg",
        "isolation_linked_pkg.sub",
    ]

    assert importlib.import_module("isolation_linked_pkg.sub").STATE == []


def test_reimport_keeps_a_module_from_elsewhere_that_links_into_model_dir(
    model_dir: Path, tmp_path: Path
) -> None:
    """Under the folder means as imported: a link from outside into it is not the user's."""
    _write(model_dir / "isolation_target.py", "X = 1\n")
    other = tmp_path / "other"
    other.mkdir()
    (other / "isolation_into.py").symlink_to(model_dir / "isolation_target.py")
    sys.path.insert(0, str(other))
    try:
        into = importlib.import_module("isolation_into")
        assert reimport_user_modules(str(model_dir)) == []
        assert sys.modules["isolation_into"] is into
    finally:
        sys.path.remove(str(other))
        sys.modules.pop("isolation_into", None)


@pytest.mark.parametrize("spelled", ["link", "real"])
def test_reimport_compares_the_folder_as_spelled(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, spelled: str
) -> None:
    """A model_dir whose own path holds a link matches its modules spelled the same way.

    The runtime imports the user's code through model_dir itself, so both carry the link.
    """
    real = tmp_path / "real"
    _write(real / "isolation_linked.py", "X = 1\n")
    (tmp_path / "link").symlink_to(real, target_is_directory=True)
    monkeypatch.syspath_prepend(str(tmp_path / spelled))
    try:
        importlib.import_module("isolation_linked")
        assert reimport_user_modules(str(tmp_path / spelled)) == ["isolation_linked"]
    finally:
        sys.modules.pop("isolation_linked", None)


def test_reimport_takes_a_relative_model_dir_and_module_paths_as_absolute(
    model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(model_dir.parent)
    _write(model_dir / "isolation_relative.py", "X = 1\n")
    module = types.ModuleType("isolation_relative")
    module.__file__ = f"{model_dir.name}/isolation_relative.py"
    sys.modules["isolation_relative"] = module
    assert reimport_user_modules(model_dir.name) == ["isolation_relative"]


def test_reimport_keeps_a_virtual_environment_inside_model_dir(
    model_dir: Path, tmp_path: Path
) -> None:
    """Libraries of the interpreter stay wherever they are reached from, links included."""
    site_packages = Path(numpy.__file__).parent.parent
    (model_dir / "venv").symlink_to(site_packages, target_is_directory=True)
    name = "isolation_site_module"
    module = types.ModuleType(name)
    module.__file__ = str(model_dir / "venv" / "numpy" / "__init__.py")
    sys.modules[name] = module
    try:
        assert reimport_user_modules(str(model_dir)) == []
        assert sys.modules[name] is module
    finally:
        sys.modules.pop(name, None)


def test_reimport_leaves_modules_outside_model_dir(model_dir: Path, tmp_path: Path) -> None:
    other = tmp_path / "other"
    _write(other / "isolation_elsewhere.py", "X = 1\n")
    sys.path.insert(0, str(other))
    try:
        elsewhere = importlib.import_module("isolation_elsewhere")
        _write(model_dir / "isolation_here.py", "X = 1\n")
        importlib.import_module("isolation_here")
        assert reimport_user_modules(str(model_dir)) == ["isolation_here"]
        assert sys.modules["isolation_elsewhere"] is elsewhere
    finally:
        sys.path.remove(str(other))


@pytest.mark.parametrize("prefix", [sys.prefix, sys.base_prefix], ids=["prefix", "base_prefix"])
def test_reimport_never_drops_the_interpreters_libraries(prefix: str) -> None:
    """A model_dir that contains site-packages and the standard library drops neither."""
    kept = {name: sys.modules[name] for name in ("json", "torch", "numpy", "pytest")}
    assert reimport_user_modules(prefix) == []
    assert all(sys.modules[name] is module for name, module in kept.items())
    assert sys.modules["numpy"] is numpy


@pytest.mark.parametrize("package", ["trials", "searcher", "storage", "ui", "torch", "numpy"])
def test_reimport_never_drops_our_packages_or_torch_and_numpy(
    model_dir: Path, package: str
) -> None:
    """Even a model_dir holding their files (the repository itself) keeps them."""
    _write(model_dir / "isolation_plain.py", "X = 1\n")
    importlib.import_module("isolation_plain")
    name = f"{package}._isolation_test_module"
    module = types.ModuleType(name)
    module.__file__ = str(model_dir / package / "_isolation_test_module.py")
    sys.modules[name] = module
    try:
        assert reimport_user_modules(str(model_dir)) == ["isolation_plain"]
        assert sys.modules[name] is module
    finally:
        sys.modules.pop(name, None)


def test_release_accelerator_memory_does_not_initialize_cuda() -> None:
    if torch.cuda.is_initialized():
        pytest.skip("CUDA is already initialized in this process")
    release_accelerator_memory()
    assert not torch.cuda.is_initialized()


BLOCK_BYTES = 64 * 2**20


@pytest.mark.gpu
def test_release_accelerator_memory_returns_cached_blocks_and_resets_peaks() -> None:
    """What a warm worker does between trials on a GPU: the finished trial's freed blocks
    go back to the driver and the next trial's peak statistics start from what is live.

    On every device the process used (two, where there are two), so the one call that
    empties every cache is checked against each, not only the current device.
    """
    devices = [torch.device("cuda", index) for index in range(min(2, torch.cuda.device_count()))]
    # Free blocks cached by earlier tests could serve the allocations below.
    release_accelerator_memory()
    live = {device: torch.cuda.memory_allocated(device) for device in devices}
    for device in devices:
        block = torch.empty(BLOCK_BYTES, dtype=torch.uint8, device=device)
        block.fill_(1)
        del block
    torch.cuda.synchronize()
    for device in devices:
        # The caching allocator keeps the freed block: the trial's memory outlives it.
        assert torch.cuda.memory_allocated(device) == live[device]
        assert torch.cuda.memory_reserved(device) >= live[device] + BLOCK_BYTES
        assert torch.cuda.max_memory_allocated(device) >= live[device] + BLOCK_BYTES
    reserved = {device: torch.cuda.memory_reserved(device) for device in devices}

    release_accelerator_memory()

    for device in devices:
        assert torch.cuda.memory_reserved(device) <= reserved[device] - BLOCK_BYTES
        assert torch.cuda.max_memory_allocated(device) == live[device]
        stats = torch.cuda.memory_stats(device)
        assert stats["reserved_bytes.all.peak"] == torch.cuda.memory_reserved(device)


HOLDER = "class Holder:\n    def __init__(self):\n        self.me = self\n\n\nHELD = Holder()\n"


@pytest.mark.parametrize("keep", [False, True], ids=["reimport", "keep_entrypoint_module"])
def test_reset_between_trials(torch_globals: TorchGlobals, model_dir: Path, keep: bool) -> None:
    _write(model_dir / "isolation_entry.py", HOLDER)
    module = importlib.import_module("isolation_entry")
    held = weakref.ref(module.HELD)
    del module
    torch.set_default_dtype(torch.float64)
    torch.set_grad_enabled(False)
    torch.use_deterministic_algorithms(True)
    gc.disable()  # so only the reset can free the module's cyclic garbage
    try:
        dropped = reset_between_trials(
            torch_globals, model_dir=str(model_dir), keep_entrypoint_module=keep
        )
    finally:
        gc.enable()
        gc.unfreeze()  # the reset froze this test process's objects; give them back

    assert TorchGlobals.capture() == torch_globals
    if keep:
        assert dropped == []
        assert "isolation_entry" in sys.modules
        assert held() is sys.modules["isolation_entry"].HELD
    else:
        assert dropped == ["isolation_entry"]
        assert "isolation_entry" not in sys.modules
        # The finished trial's module globals are gone, not waiting for a later GC.
        assert held() is None


def test_a_later_trials_cyclic_garbage_is_still_collected_after_the_freeze(
    torch_globals: TorchGlobals, model_dir: Path
) -> None:
    # The first reset freezes what survived it, so later resets scan only what the
    # trials after it made; a trial's cyclic garbage must still go at its own reset.
    gc.disable()
    try:
        reset_between_trials(torch_globals, model_dir=str(model_dir), keep_entrypoint_module=False)
        assert gc.get_freeze_count() > 0
        _write(model_dir / "second_trial.py", HOLDER)
        module = importlib.import_module("second_trial")
        held = weakref.ref(module.HELD)
        del module
        reset_between_trials(torch_globals, model_dir=str(model_dir), keep_entrypoint_module=False)
        assert held() is None
    finally:
        gc.enable()
        gc.unfreeze()
