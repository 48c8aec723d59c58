"""The Slurm executor's pure parts: command lines and parsing of Slurm's own output."""

from __future__ import annotations

import pytest

from trials.executors._slurm import _last_error
from trials.executors._slurm_commands import (
    batch_script,
    expand_counts,
    gpu_indices,
    job_node_gres,
    node_addresses,
    nodes_meeting,
    partition_nodes,
    rendezvous_port,
    sacct_job,
    sbatch_argv,
    show_job,
    squeue_jobs,
    srun_argv,
    step_name,
    steps_named,
    unavailable_nodes,
)
from trials.scheduler import SlurmJobSettings


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
    # Every node computes it for itself, in processes of its own: the values are pinned,
    # so a port drawn from anything per process (a salted hash()) fails here.
    assert rendezvous_port("slotsweep-1-0") == 35699
    assert rendezvous_port("slotsweep-12-3") == 37365
    assert all(29500 <= p < 39500 for p in ports)
    assert len(ports) > 140  # distinct attempts rarely share a port


def test_srun_runs_one_torchrun_per_node_on_exactly_the_placed_nodes() -> None:
    argv = srun_argv(
        job_id="42",
        nodes=["n1", "n2"],
        slots_per_node=2,
        use_gpus=False,
        name="slotsweep-tok",
        torchrun=["--nnodes=2", "-m", "trials.node.worker"],
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
        "trials.node.cluster_node",
        "--nnodes=2",
        "-m",
        "trials.node.worker",
    ]


def test_gpu_slots_ask_slurm_for_that_many_gpus_per_node() -> None:
    argv = srun_argv(
        job_id="1", nodes=["n1"], slots_per_node=4, use_gpus=True, name="x", torchrun=[]
    )
    assert "--gpus-per-node=4" in argv


def test_lost_drained_and_unanswering_nodes_take_no_steps() -> None:
    sinfo = "n1 idle\nn2 down*\nn3 alloc*\nn4 drain\nn5 mix\nn6 alloc\nn7 drng\nn8 idle~\n"
    assert unavailable_nodes(sinfo) == {"n2", "n3", "n4", "n7"}


def test_partition_nodes_count_gpus_and_cpus_once_per_node() -> None:
    sinfo = "\n".join(
        [
            "g1|10.0.0.1|64|gpu:a100:4(S:0-1)|a100,ib",
            "g2|(null)|64|gpu:2,gpu:v100:2|(null)",
            "g1|10.0.0.1|64|gpu:a100:4(S:0-1)|a100,ib",
            "c1|10.0.0.9|32|(null)|(null)",
            "garbage line",
        ]
    )
    nodes = partition_nodes(sinfo)
    assert [(n.name, n.address, n.cpus, n.gpus) for n in nodes] == [
        ("g1", "10.0.0.1", 64, 4),
        ("g2", "g2", 64, 4),
        ("c1", "10.0.0.9", 32, 0),
    ]
    assert nodes[0].features == frozenset({"a100", "ib"})
    assert [n.name for n in nodes_meeting(nodes, "a100&ib")] == ["g1"]
    # Expressions sinfo's features cannot decide are left to Slurm.
    assert [n.name for n in nodes_meeting(nodes, "a100|v100")] == ["g1", "g2", "c1"]


def test_a_trial_on_several_nodes_is_a_job_of_whole_nodes_never_requeued_by_slurm() -> None:
    settings = SlurmJobSettings(
        "gpu", "4:00:00", account="proj", qos="high", sbatch_options=("--mem=64G",)
    )
    argv = sbatch_argv(
        settings, nodes=2, slots_per_node=4, use_gpus=True, name="slotsweep-t", log_path="/l"
    )
    # The user's options first: slotsweep's own, after them, are the ones that count.
    assert argv[:3] == ["sbatch", "--mem=64G", "--parsable"]
    for expected in (
        "--partition=gpu",
        "--time=4:00:00",
        "--job-name=slotsweep-t",
        "--nodes=2",
        "--ntasks-per-node=1",
        "--exclusive",
        "--gpus-per-node=4",
        "--cpus-per-task=4",
        "--account=proj",
        "--qos=high",
        "--output=/l",
        "--open-mode=append",
        "--no-requeue",
    ):
        assert expected in argv, expected
    one_node = sbatch_argv(
        SlurmJobSettings("cpu", "60"),
        nodes=1,
        slots_per_node=2,
        use_gpus=False,
        name="n",
        log_path="/l",
    )
    assert "--exclusive" not in one_node and "--cpus-per-task=2" in one_node
    assert not any(a.startswith(("--gpus", "--account", "--qos")) for a in one_node)


def test_the_batch_script_execs_one_srun_step_of_the_node_wrapper() -> None:
    script = batch_script(["--nnodes=2", "--rdzv-id=a b"], python="/venv/bin/python")
    first, command, *rest = script.splitlines()
    assert first == "#!/bin/sh" and not rest
    assert command.startswith("exec srun ")
    assert "/venv/bin/python -m trials.node.cluster_node --nnodes=2 '--rdzv-id=a b'" in command


def test_job_states_and_exit_codes_read_as_the_driver_needs_them() -> None:
    listed = squeue_jobs("7|PENDING|Resources|\n8|RUNNING|None|n[1-2]\nbad")
    assert listed["7"].pending and listed["7"].reason == "Resources"
    assert not listed["8"].pending and listed["8"].nodes == "n[1-2]" and listed["8"].reason == ""
    preempted = show_job(
        "JobId=9 JobName=x JobState=PREEMPTED Reason=None NodeList=n1 ExitCode=0:9"
    )
    assert preempted is not None and preempted.stopped_by_cluster
    assert preempted.exit_code == 128 + 9
    failed = show_job("JobId=9 JobState=FAILED Reason=NonZeroExitCode NodeList=n1 ExitCode=3:0")
    assert failed is not None and failed.exit_code == 3 and not failed.stopped_by_cluster
    assert show_job("slurm_load_jobs error: Invalid job id specified") is None
    # Once slurmctld forgot the job, the accounting database still knows it.
    timed_out = sacct_job("12", "11|COMPLETED|0:0|n1\n12|TIMEOUT|0:15|n[1-2]")
    assert timed_out is not None and timed_out.stopped_by_cluster
    assert timed_out.exit_code == 143 and timed_out.nodes == "n[1-2]"
    assert sacct_job("13", "12|TIMEOUT|0:15|n1") is None


def test_a_failed_slurm_command_says_why_in_one_line() -> None:
    stderr = (
        "sinfo: error: resolve_ctls_from_dns_srv: res_nsearch error: Unknown host\n"
        "sinfo: fatal: Could not establish a configuration source\n"
    )
    assert _last_error("sinfo", stderr, 1) == "Could not establish a configuration source"
    assert _last_error("squeue", "", 3) == "exit 3"
