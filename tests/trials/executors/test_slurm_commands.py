"""The Slurm executor's pure parts: command lines and parsing of Slurm's own output."""

from __future__ import annotations

import pytest

from trials.executors._slurm_commands import (
    expand_counts,
    gpu_indices,
    job_node_gres,
    node_addresses,
    rendezvous_port,
    srun_argv,
    step_name,
    steps_named,
    unavailable_nodes,
)


@pytest.mark.parametrize(
    ("value", "counts"),
    [("2", [2]), ("2(x3)", [2, 2, 2]), ("8(x2),4", [8, 8, 4]), ("", [])],
)
def test_cpus_per_node_expand_slurms_repeat_notation(value: str, counts: list[int]) -> None:
    assert expand_counts(value) == counts


def test_a_malformed_count_list_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="not a Slurm count list"):
        expand_counts("two")


@pytest.mark.parametrize(
    ("gres", "indices"),
    [
        ("gpu:2(IDX:0-1)", (0, 1)),
        ("gpu:a100:4(IDX:0,2-3,5)", (0, 2, 3, 5)),
        ("gpu:1(IDX:3),gpu:v100:1(IDX:1)", (1, 3)),
        ("", ()),
        ("(null)", ()),
    ],
)
def test_gpu_indices_come_from_the_jobs_detailed_gres(gres: str, indices: tuple[int, ...]) -> None:
    assert gpu_indices(gres) == indices


def test_job_detail_gives_each_nodes_gres() -> None:
    detail = (
        "JobId=12 JobName=search\n"
        "   NumNodes=2 NumCPUs=4\n"
        "     Nodes=n[1-2] CPU_IDs=0-1 Mem=0 GRES=gpu:2(IDX:0-1)\n"
        "     Nodes=n3 CPU_IDs=0 Mem=0 GRES=\n"
    )
    assert job_node_gres(detail) == {"n[1-2]": "gpu:2(IDX:0-1)", "n3": ""}


def test_node_addresses_fall_back_to_the_node_name() -> None:
    text = (
        "NodeName=ssnode1 Arch=x86_64 CoresPerSocket=1 NodeAddr=10.0.0.11 NodeHostName=ssnode1\n"
        "NodeName=ssnode2 Arch=x86_64 CoresPerSocket=1\n"
    )
    assert node_addresses(text) == {"ssnode1": "10.0.0.11", "ssnode2": "ssnode2"}


def test_steps_are_found_by_their_attempts_name_only() -> None:
    name = step_name("abc")
    squeue = f"12.0 {name} n[1-2]\n12.1 slotsweep-other n1\n13.4 {name} n3\n12.batch batch n1\n"
    assert steps_named(squeue, name) == [("12.0", "n[1-2]"), ("13.4", "n3")]
    assert steps_named("", name) == []


def test_rendezvous_port_is_stable_per_attempt_and_in_range() -> None:
    ports = {rendezvous_port(f"slotsweep-{t}-{a}") for t in range(50) for a in range(3)}
    assert rendezvous_port("slotsweep-1-0") == rendezvous_port("slotsweep-1-0")
    assert all(29500 <= p < 39500 for p in ports)
    assert len(ports) > 140  # distinct attempts rarely share a port


def test_srun_runs_one_torchrun_per_node_on_exactly_the_placed_nodes() -> None:
    argv = srun_argv(
        job_id="42",
        nodes=["n1", "n2"],
        slots_per_node=2,
        use_gpus=False,
        name="slotsweep-tok",
        torchrun=["--nnodes=2", "-m", "trials.worker"],
        python="/venv/bin/python",
    )
    assert argv[0] == "srun"
    for flag in (
        "--jobid=42",
        "--nodes=2",
        "--ntasks-per-node=1",
        "--nodelist=n1,n2",
        "--exact",
        "--kill-on-bad-exit=1",
        "--job-name=slotsweep-tok",
        "--cpus-per-task=2",
    ):
        assert flag in argv
    assert not any(a.startswith("--gpus") for a in argv)
    tail = argv[argv.index("/venv/bin/python") :]
    assert tail == [
        "/venv/bin/python",
        "-m",
        "trials.executors._slurm_node",
        "--nnodes=2",
        "-m",
        "trials.worker",
    ]


def test_gpu_slots_ask_slurm_for_that_many_gpus_per_node() -> None:
    argv = srun_argv(
        job_id="1", nodes=["n1"], slots_per_node=4, use_gpus=True, name="x", torchrun=[]
    )
    assert "--gpus-per-node=4" in argv


def test_lost_drained_and_unanswering_nodes_take_no_steps() -> None:
    sinfo = "n1 idle\nn2 down*\nn3 alloc*\nn4 drain\nn5 mix\nn6 alloc\nn7 drng\nn8 idle~\n"
    assert unavailable_nodes(sinfo) == {"n2", "n3", "n4", "n7"}
