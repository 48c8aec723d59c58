"""What the launcher tells each node's ranks about their slots (pure: no process starts)."""

from __future__ import annotations

from trials.launch.launcher import torchrun_commands
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
