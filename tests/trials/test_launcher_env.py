"""What the launcher tells each node's ranks about their slots (pure: no process starts)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from trials.launch.launcher import torchrun_commands
from trials.launch.shares import mps_pipe_directory, mps_running
from trials.scheduler import Agent, AgentSlots, Placement


def _placement(slots: tuple[int, ...]) -> Placement:
    agent = Agent("a1", "127.0.0.1", (0, 1, 2, 3))
    return Placement(request_id=1, pool="default", agents=(AgentSlots(agent, slots),))


def test_gpu_slots_become_the_visible_devices_in_pci_bus_order() -> None:
    """Slots are NVML indices (PCI bus order); CUDA counts fastest first unless told."""
    (command,) = torchrun_commands(_placement((2, 3)), rdzv_id="t", use_gpus=True)
    assert command.env["CUDA_VISIBLE_DEVICES"] == "2,3"
    assert command.env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    assert command.env["SLOTSWEEP_SLOTS"] == "2,3"
    assert "--nproc-per-node=2" in command.argv


def test_cpu_slots_leave_cuda_alone() -> None:
    (command,) = torchrun_commands(_placement((2, 3)), rdzv_id="t", use_gpus=False)
    assert "CUDA_VISIBLE_DEVICES" not in command.env
    assert "CUDA_DEVICE_ORDER" not in command.env
    assert command.env["SLOTSWEEP_SLOTS"] == "2,3"


def _share_placement(slot: int, share: float) -> Placement:
    agent = Agent("a1", "127.0.0.1", (0, 1, 2, 3))
    return Placement(1, "default", (AgentSlots(agent, (slot,)),), share=share)


def test_a_share_trial_sees_only_its_gpu_and_its_share() -> None:
    (command,) = torchrun_commands(_share_placement(2, 0.25), rdzv_id="t", use_gpus=True)
    assert command.env["CUDA_VISIBLE_DEVICES"] == "2"
    assert command.env["SLOTSWEEP_SLOT_SHARE"] == "0.25"
    assert "--nproc-per-node=1" in command.argv
    # Without MPS the trials on one GPU time-share it: no thread percentage.
    assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE" not in command.env


@pytest.mark.parametrize(("share", "percent"), [(0.5, "50"), (0.25, "25"), (0.125, "13")])
def test_with_mps_a_share_trial_gets_its_share_of_the_gpu_s_threads(
    share: float, percent: str
) -> None:
    (command,) = torchrun_commands(
        _share_placement(0, share), rdzv_id="t", use_gpus=True, mps=True
    )
    assert command.env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == percent


def test_a_share_on_cpu_slots_is_said_but_nothing_is_capped() -> None:
    (command,) = torchrun_commands(_share_placement(1, 0.5), rdzv_id="t", use_gpus=False, mps=True)
    assert command.env["SLOTSWEEP_SLOT_SHARE"] == "0.5"
    assert command.env["SLOTSWEEP_SLOTS"] == "1"
    assert not {"CUDA_VISIBLE_DEVICES", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"} & set(command.env)


def test_whole_slots_carry_no_share() -> None:
    (command,) = torchrun_commands(_placement((0, 1)), rdzv_id="t", use_gpus=True, mps=True)
    assert not {"SLOTSWEEP_SLOT_SHARE", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"} & set(command.env)


def test_mps_is_seen_running_where_its_control_pipe_is(tmp_path: Path) -> None:
    environ = {"CUDA_MPS_PIPE_DIRECTORY": str(tmp_path)}
    assert not mps_running(environ)
    (tmp_path / "control").write_text("")  # a plain file is no daemon's pipe
    assert not mps_running(environ)
    (tmp_path / "control").unlink()
    os.mkfifo(tmp_path / "control")
    assert mps_running(environ)
    assert mps_pipe_directory({}) == Path("/tmp/nvidia-mps")
