"""The ``gpu`` marker: checks that only an NVIDIA GPU can make, skipped elsewhere with why.

Registered as a pytest plugin by ``tests/conftest.py`` (the marker itself is declared
in ``pyproject.toml``). A test marked ``@pytest.mark.gpu`` runs only where torch sees a
CUDA device and NVML answers (the system-metrics sampler reads the GPUs through NVML);
``@pytest.mark.gpu(devices=2)`` also needs that many CUDA devices. Otherwise it is
marked skipped at collection, so none of its fixtures runs, with the reason from this
one place, e.g. ``needs an NVIDIA GPU: torch.cuda.is_available() is False (torch
2.13.0+cpu is a CPU-only build); NVML: nvmlInit() failed (NVML Shared Library Not
Found)`` or ``needs 2 CUDA devices (found 1)``.

``bash .ci/test -m gpu`` runs every such test (README, "GPU checks").
"""

from __future__ import annotations

import functools

import pytest


@functools.cache
def gpu_unavailable_reason() -> str | None:
    """Why this machine cannot run the GPU checks (naming CUDA, NVML or both), or None.

    Neither probe creates a CUDA context: ``torch.cuda.is_available()`` only counts
    devices.
    """
    import torch

    problems = []
    if not torch.cuda.is_available():
        if torch.version.cuda is None:
            why = f"torch {torch.__version__} is a CPU-only build"
        else:
            why = f"torch {torch.__version__} (CUDA {torch.version.cuda}) finds no device"
        problems.append(f"torch.cuda.is_available() is False ({why})")
    nvml = _nvml_problem()
    if nvml is not None:
        problems.append(f"NVML: {nvml}")
    if not problems:
        return None
    return "needs an NVIDIA GPU: " + "; ".join(problems)


def _nvml_problem() -> str | None:
    import pynvml

    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as err:
        return f"nvmlInit() failed ({err})"
    try:
        count = pynvml.nvmlDeviceGetCount()
    except pynvml.NVMLError as err:
        return f"nvmlDeviceGetCount() failed ({err})"
    finally:
        pynvml.nvmlShutdown()
    return None if count > 0 else "no GPU found"


def cuda_device_count() -> int:
    """CUDA devices this process sees (after ``CUDA_VISIBLE_DEVICES``)."""
    import torch

    return torch.cuda.device_count()


def nvml_uuids() -> list[str]:
    """Every GPU's UUID by NVML index (the index a slot names), normalised for comparison."""
    import pynvml

    pynvml.nvmlInit()
    try:
        return [
            normalise_uuid(pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetHandleByIndex(index)))
            for index in range(pynvml.nvmlDeviceGetCount())
        ]
    finally:
        pynvml.nvmlShutdown()


def normalise_uuid(uuid: object) -> str:
    """NVML's ``GPU-1a2b...`` and torch's ``1a2b...`` as one comparable string."""
    text = uuid.decode() if isinstance(uuid, bytes) else str(uuid)
    text = text.strip().lower()
    return text.removeprefix("gpu-")


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark the selected ``gpu`` tests skipped, with the reason, where they cannot run.

    After ``-m`` deselected what it does, so the probes run only when a gpu test is
    selected; a skip marker keeps the test's own location in the report and stops its
    fixtures from starting anything.
    """
    for item in items:
        marker = item.get_closest_marker("gpu")
        if marker is None:
            continue
        reason = gpu_unavailable_reason()
        if reason is None:
            devices = int(marker.kwargs.get("devices", 1))
            found = cuda_device_count()
            if found >= devices:
                continue
            reason = f"needs {devices} CUDA devices (found {found})"
        item.add_marker(pytest.mark.skip(reason=reason))
