"""The cluster file, its one-line-per-problem errors, and the local machine as default."""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Any

import pytest
import yaml

from trials._system_metrics import detect_gpus
from trials.executors import load_cluster, parse_cluster
from trials.executors._ray import node_agents
from trials.executors._slurm_commands import sbatch_argv
from trials.scheduler import (
    CLUSTER_ENV_VAR,
    Agent,
    Cluster,
    ClusterConfigError,
    RayNodes,
    RaySettings,
    ResourcePool,
    SlurmJobSettings,
    UnknownPool,
    read_cluster,
)
from trials.scheduler._sbatch_options import MANAGED_SBATCH_OPTIONS, sbatch_option_problems


def two_pools() -> dict[str, Any]:
    return {
        "resource_pools": [
            {
                "name": "default",
                "agents": [
                    {"name": "a1", "host": "127.0.0.1", "slots": 2},
                    {"name": "a2", "host": "127.0.0.1", "slots": [0, 1]},
                ],
            },
            {
                "name": "big",
                "allowing_heterogeneous_fits": True,
                "fitting_policy": "worst",
                "agents": [{"name": "gpu-box", "host": "10.0.0.5", "slots": [3, 1, 2]}],
            },
        ]
    }


def problems_of(raw: Any) -> list[str]:
    with pytest.raises(ClusterConfigError) as info:
        parse_cluster(raw)
    assert str(info.value) == "\n".join(info.value.problems)
    return info.value.problems


def test_a_file_declares_pools_and_agents(tmp_path: Path) -> None:
    path = tmp_path / "cluster.yaml"
    path.write_text(yaml.safe_dump(two_pools()))
    cluster = load_cluster(path)
    assert cluster == Cluster(
        pools=(
            ResourcePool(
                "default",
                (Agent("a1", "127.0.0.1", (0, 1)), Agent("a2", "127.0.0.1", (0, 1))),
            ),
            ResourcePool(
                "big",
                (Agent("gpu-box", "10.0.0.5", (3, 1, 2)),),
                allowing_heterogeneous_fits=True,
                fitting_policy="worst",
            ),
        )
    )
    assert [agent.name for _, agent in cluster.agents] == ["a1", "a2", "gpu-box"]


def test_host_defaults_to_loopback() -> None:
    cluster = parse_cluster(
        {"resource_pools": [{"name": "p", "agents": [{"name": "a", "slots": 1}]}]}
    )
    assert cluster.pool("p").agents[0].host == "127.0.0.1"


def test_unknown_pool_names_the_pools() -> None:
    cluster = parse_cluster(two_pools())
    with pytest.raises(UnknownPool) as info:
        cluster.pool("gpus")
    assert str(info.value) == "unknown resource pool 'gpus'; pools: default, big"
    assert isinstance(info.value, KeyError)


def test_every_problem_is_one_line_naming_its_field() -> None:
    raw = two_pools()
    raw["resource_pools"][0]["agents"][0]["slots"] = 0
    raw["resource_pools"][0]["agents"][1]["slots"] = [0, 0, -1]
    raw["resource_pools"][1]["fitting_policy"] = "first"
    raw["resource_pools"][1]["agents"][0]["gpus"] = 2
    assert problems_of(raw) == [
        "resource_pools.0.agents.0.slots: must be at least 1 slot (got 0)",
        "resource_pools.0.agents.1.slots.2: Input should be greater than or equal to 0 (got -1)",
        "resource_pools.1.agents.0.gpus: unknown field; allowed: name, host, slots",
        "resource_pools.1.fitting_policy: Input should be 'best' or 'worst' (got 'first')",
    ]


def test_repeated_slot_ids_are_refused() -> None:
    raw = two_pools()
    raw["resource_pools"][0]["agents"][1]["slots"] = [0, 1, 1]
    assert problems_of(raw) == [
        "resource_pools.0.agents.1.slots: slot ids must be unique; repeated: [1]"
    ]


@pytest.mark.parametrize("slots", ["two", True, 2.5, None])
def test_slots_must_be_a_count_or_a_list(slots: Any) -> None:
    raw = two_pools()
    raw["resource_pools"][0]["agents"][0]["slots"] = slots
    [problem] = problems_of(raw)
    assert problem.startswith(
        "resource_pools.0.agents.0.slots: must be a slot count (e.g. 8) or a list of slot ids"
    )


def test_names_must_be_unique() -> None:
    raw = two_pools()
    raw["resource_pools"][1]["name"] = "default"
    raw["resource_pools"][1]["agents"][0]["name"] = "a1"
    assert problems_of(raw) == [
        "resource_pools.1.name: pool 'default' is already declared (resource_pools.0)",
        "resource_pools.1.agents.0.name: agent 'a1' is already declared "
        "(resource_pools.0.agents.0); agent names must be unique in the cluster",
    ]


def test_preemption_is_off_unless_a_pool_turns_it_on() -> None:
    raw = two_pools()
    raw["resource_pools"][1]["preemption"] = True
    cluster = parse_cluster(raw)
    default, big = cluster.pool("default"), cluster.pool("big")
    assert (default.preemption, default.preempt_without_checkpoint) == (False, False)
    assert (big.preemption, big.preempt_without_checkpoint) == (True, False)
    raw["resource_pools"][1]["preempt_without_checkpoint"] = True
    assert parse_cluster(raw).pool("big").preempt_without_checkpoint is True


def test_preempt_without_checkpoint_needs_preemption() -> None:
    raw = two_pools()
    raw["resource_pools"][1]["preempt_without_checkpoint"] = True
    assert problems_of(raw) == [
        "resource_pools.1.preempt_without_checkpoint: needs preemption: true in the same pool"
    ]
    raw["resource_pools"][1]["preemption"] = False
    assert len(problems_of(raw)) == 1


def test_preemption_fields_must_be_booleans() -> None:
    raw = two_pools()
    raw["resource_pools"][0]["preemption"] = "sometimes"
    raw["resource_pools"][1]["preempt_without_checkpoint"] = [True]
    assert problems_of(raw) == [
        "resource_pools.0.preemption: must be true or false (got 'sometimes')",
        "resource_pools.1.preempt_without_checkpoint: must be true or false",
    ]


@pytest.mark.parametrize("value", [1, 0, "yes", "true", "false", "on", 1.0])
@pytest.mark.parametrize(
    "field", ["preemption", "preempt_without_checkpoint", "allowing_heterogeneous_fits"]
)
def test_booleans_are_true_or_false_only(field: str, value: Any) -> None:
    """pydantic's lax mode would read 1, "yes" and "true" as true; a cluster file may not."""
    raw = two_pools()
    raw["resource_pools"][1]["preemption"] = True  # preempt_without_checkpoint needs it
    raw["resource_pools"][1][field] = value
    assert problems_of(raw) == [f"resource_pools.1.{field}: must be true or false (got {value!r})"]


@pytest.mark.parametrize(
    ("raw", "problem"),
    [
        ([], "<top level>: must be a mapping with a 'resource_pools' list"),
        ({}, "resource_pools: required field is missing"),
        (
            {"resource_pools": []},
            "resource_pools: List should have at least 1 item after validation, not 0",
        ),
        (
            {"resource_pools": [{"name": "p", "agents": []}]},
            "resource_pools.0.agents: List should have at least 1 item after validation, not 0",
        ),
        (
            {"pools": []},
            "pools: unknown field; allowed: executor, dtrain_network_interface, resource_pools, slurm, ray, notifications",
        ),
    ],
)
def test_shape_problems(raw: Any, problem: str) -> None:
    assert problem in problems_of(raw)


def test_file_problems_name_the_file(tmp_path: Path) -> None:
    missing = tmp_path / "nope.yaml"
    with pytest.raises(ClusterConfigError) as info:
        load_cluster(missing)
    assert info.value.problems == [f"cluster: cannot read {missing}: No such file or directory"]
    broken = tmp_path / "broken.yaml"
    broken.write_text("resource_pools: [\n")
    with pytest.raises(ClusterConfigError, match=r"is not valid YAML at line \d+"):
        load_cluster(broken)
    bad = tmp_path / "bad.yaml"
    bad.write_text("resource_pools: [{name: p}]\n")
    with pytest.raises(ClusterConfigError) as info:
        load_cluster(bad)
    assert info.value.problems == [
        f"cluster {bad}: resource_pools.0.agents: required field is missing"
    ]


def test_the_environment_variable_names_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "cluster.yaml"
    path.write_text(yaml.safe_dump(two_pools()))
    monkeypatch.setenv(CLUSTER_ENV_VAR, str(path))
    assert [pool.name for pool in load_cluster().pools] == ["default", "big"]
    monkeypatch.setenv(CLUSTER_ENV_VAR, str(tmp_path / "gone.yaml"))
    with pytest.raises(ClusterConfigError, match=f"^{CLUSTER_ENV_VAR}: cannot read"):
        load_cluster()


def test_without_a_file_the_local_machine_is_one_agent(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(CLUSTER_ENV_VAR, raising=False)
    cluster = load_cluster()
    [pool] = cluster.pools
    [agent] = pool.agents
    assert pool.name == "default" and agent.name == socket.gethostname()
    assert agent.host == "127.0.0.1"
    gpus = detect_gpus()
    # Its GPUs, or one slot per CPU where NVML finds none (as on CPU-only machines).
    assert agent.slots == (tuple(gpus) or tuple(range(os.cpu_count() or 1)))
    if not gpus:
        assert load_cluster(slots=3).pool("default").agents[0].slots == (0, 1, 2)


def test_slots_override_is_checked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(CLUSTER_ENV_VAR, raising=False)
    with pytest.raises(ClusterConfigError, match=r"^slots: must be a positive integer \(got 0\)$"):
        load_cluster(slots=0)
    path = tmp_path / "cluster.yaml"
    path.write_text(yaml.safe_dump(two_pools()))
    with pytest.raises(ClusterConfigError, match="slots: cannot be combined with a cluster file"):
        load_cluster(path, slots=2)


@pytest.mark.parametrize(
    ("slots", "problem"),
    [
        (10**30, "resource_pools.0.agents.0.slots: must be a slot count from 1 to 4096 (got 10"),
        (4097, "resource_pools.0.agents.0.slots: must be a slot count from 1 to 4096 (got 4097)"),
        ([0, 5000], "resource_pools.0.agents.0.slots.1: Input should be less than 4096"),
    ],
)
def test_slot_counts_beyond_any_machine_are_refused(slots: Any, problem: str) -> None:
    raw = {"resource_pools": [{"name": "p", "agents": [{"name": "a", "slots": slots}]}]}
    [line] = problems_of(raw)
    assert line.startswith(problem), line


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        (b"\x89PNG\r\n\x1a\n\x00\x00", "cluster: {path} is not UTF-8 text"),
        (
            "resource_pools: [{name: café}]\n".encode("latin-1"),
            "cluster: {path} is not UTF-8 text",
        ),
        (b"built: 2024-01-31\n", "cluster {path}: built: 2024-01-31 reads as a YAML date"),
        (b"a: " + b"[" * 10_000 + b"]" * 10_000, "nested more than 64 levels deep"),
        (
            b"resource_pools: []\nresource_pools: []\n",
            "cluster {path}: resource_pools: key given twice",
        ),
    ],
)
def test_hostile_files_get_one_line(tmp_path: Path, content: bytes, problem: str) -> None:
    path = tmp_path / "cluster.yaml"
    path.write_bytes(content)
    with pytest.raises(ClusterConfigError) as info:
        load_cluster(path)
    [line] = info.value.problems
    assert problem.format(path=path) in line, line


def test_slots_override_has_an_upper_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(CLUSTER_ENV_VAR, raising=False)
    with pytest.raises(ClusterConfigError) as info:
        load_cluster(slots=100_000_000)
    assert info.value.problems == ["slots: must be a slot count from 1 to 4096 (got 100000000)"]


def test_a_slurm_cluster_file_takes_its_agents_from_the_allocation_not_the_file() -> None:
    pools = {"resource_pools": [{"name": "p", "agents": [{"name": "a", "slots": 1}]}]}
    assert problems_of({"executor": "slurm", **pools}) == [
        "resource_pools: not allowed with executor: slurm "
        "(the agents are the nodes of the Slurm allocation)"
    ]
    assert problems_of({"executor": "kubernetes"}) == [
        "executor: Input should be 'local', 'slurm' or 'ray' (got 'kubernetes')"
    ]


def test_a_ray_cluster_file_takes_its_agents_from_ray_and_checks_its_block_first() -> None:
    pools = {"resource_pools": [{"name": "p", "agents": [{"name": "a", "slots": 1}]}]}
    assert problems_of({"executor": "ray", **pools}) == [
        "resource_pools: not allowed with executor: ray (the agents are the nodes of the Ray cluster)"
    ]
    assert problems_of({"ray": {"address": "ray://h:10001"}}) == ["ray: needs executor: ray"]
    problems = problems_of(
        {"executor": "ray", "ray": {"slot_type": "tpu", "reserve_timeout_s": 1, "adress": "x"}}
    )
    assert [problem.split(":")[0] for problem in problems] == [
        "ray.adress",
        "ray.reserve_timeout_s",
        "ray.slot_type",
    ], problems
    found = read_cluster({"executor": "ray", "dtrain_network_interface": "ens5"})
    assert isinstance(found, RayNodes)
    assert found.settings == RaySettings() and found.dtrain_network_interface == "ens5"


def test_ray_nodes_become_agents_with_gpu_or_cpu_slots() -> None:
    def node(host: str, address: str, alive: bool = True, **resources: float) -> dict[str, Any]:
        return {
            "NodeManagerHostname": host,
            "NodeManagerAddress": address,
            "Alive": alive,
            "Resources": resources,
        }

    nodes = [
        node("gpu1", "10.0.0.2", CPU=16, GPU=4),
        node("cpu1", "10.0.0.3", CPU=8),
        node("gpu2", "10.0.0.4", alive=False, CPU=16, GPU=4),  # dead: Ray keeps listing it
        node("box", "10.0.0.5", GPU=2),
        node("box", "10.0.0.6", GPU=2),  # two Ray nodes on one host
    ]
    agents, use_gpus = node_agents(nodes, None)
    assert use_gpus
    assert [(a.name, a.host, a.slots) for a in agents] == [
        ("box@10.0.0.5", "10.0.0.5", (0, 1)),
        ("box@10.0.0.6", "10.0.0.6", (0, 1)),
        ("gpu1", "10.0.0.2", (0, 1, 2, 3)),
    ]
    agents, use_gpus = node_agents(nodes, "cpu")
    assert not use_gpus
    assert [(a.name, len(a.slots)) for a in agents] == [("cpu1", 8), ("gpu1", 16)]


def test_slurm_outside_an_allocation_is_one_clear_line(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("SLURM_JOB_ID", "SLURM_JOB_NODELIST", "SLURM_NODELIST"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(ClusterConfigError) as raised:
        load_cluster("slurm")
    assert raised.value.problems == [
        "cluster slurm: not inside a Slurm allocation (SLURM_JOB_ID and "
        "SLURM_JOB_NODELIST are unset); run the search under salloc or sbatch"
    ]
    with pytest.raises(ClusterConfigError, match="slots: cannot be combined with --cluster slurm"):
        load_cluster("slurm", slots=2)


def test_dtrain_network_interface_reaches_the_cluster() -> None:
    cluster = parse_cluster(
        {
            "dtrain_network_interface": "ib0",
            "resource_pools": [{"name": "p", "agents": [{"name": "a", "slots": 1}]}],
        }
    )
    assert cluster.dtrain_network_interface == "ib0" and cluster.executor == "local"


def test_a_slurm_block_is_checked_field_by_field_before_slurm_is_asked() -> None:
    problems = problems_of(
        {
            "executor": "slurm",
            "slurm": {
                "partition": "gpu queue",
                "time_limit": "4 hours",
                "sbatch_options": ["--mem=64G", "--nodes=3", "mem"],
                "slot_type": "tpu",
            },
        }
    )
    by_field = {p.split(": ", 1)[0]: p for p in problems}
    assert sorted(by_field) == [
        "slurm.partition",
        "slurm.sbatch_options.1",
        "slurm.sbatch_options.2",
        "slurm.slot_type",
        "slurm.time_limit",
    ], problems
    assert "must be a Slurm name" in by_field["slurm.partition"]
    assert "HH:MM:SS" in by_field["slurm.time_limit"]
    assert "--nodes is set by slotsweep" in by_field["slurm.sbatch_options.1"]
    assert "'mem' is not an sbatch option" in by_field["slurm.sbatch_options.2"]
    assert problems_of({"slurm": {"partition": "gpu", "time_limit": "60"}}) == [
        "slurm: needs executor: slurm"
    ]


def slurm_problems(**slurm: Any) -> list[str]:
    """The problems of a slurm block with a wrong partition besides ``slurm``'s fields.

    The wrong partition keeps Slurm from being asked, so a block whose other fields
    pass still yields one problem: ``slurm.partition``.
    """
    return problems_of({"executor": "slurm", "slurm": {"partition": "p!", **slurm}})


# Slurm's MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM and D-HH:MM:SS, any size in the first field.
@pytest.mark.parametrize(
    "limit",
    [
        "30",
        30,
        0,
        "90",
        "30:00",
        "59:59",
        "4:00:00",
        "36:00:00",
        "100:59:59",
        "1-0",
        "1-23",
        "14-23:59",
        "2-12:30:00",
        "7-0:0:0",
        "UNLIMITED",
        "infinite",
    ],
)
def test_every_slurm_time_format_is_a_time_limit(limit: object) -> None:
    # Only the partition is wrong: the time limit passed.
    assert [p.split(":")[0] for p in slurm_problems(time_limit=limit)] == ["slurm.partition"]


@pytest.mark.parametrize(
    "limit",
    [
        "25:99",  # seconds
        "99:99:99",  # minutes and seconds
        "4:60:00",
        "1-25:00:00",  # hours after days
        "1-24",
        "1-12:60",
        "1-12:00:60",
        "1-",
        "-5",
        -5,
        "1:2:3:4",
        "1-2-3",
        "4 hours",
        "٣٠",  # digits, but not the ones Slurm reads
        True,
    ],
)
def test_time_limit_fields_stay_in_range(limit: object) -> None:
    by_field = {p.split(": ", 1)[0]: p for p in slurm_problems(time_limit=limit)}
    assert sorted(by_field) == ["slurm.partition", "slurm.time_limit"]
    assert (
        "must be a Slurm time limit: MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS "
        "(minutes and seconds below 60 after the first field, hours below 24 after days), "
        "or UNLIMITED"
    ) in by_field["slurm.time_limit"]


@pytest.mark.parametrize(
    ("options", "index", "spelled"),
    [
        (["--output=/etc/x"], 0, "--output"),
        (["--output", "/etc/x"], 0, "--output"),
        (["--output /etc/x"], 0, "--output"),
        (["-o/etc/x"], 0, "-o (--output)"),
        (["-o", "/etc/x"], 0, "-o (--output)"),
        (["-e/tmp/err"], 0, "-e (--error)"),
        (["--mem=1G", "-pother"], 1, "-p (--partition)"),
        (["-p", "other"], 0, "-p (--partition)"),
        (["-vpother"], 0, "-p (--partition)"),
        (["-Jrenamed"], 0, "-J (--job-name)"),
        (["--part=x"], 0, "--part (--partition)"),
        (["--out=x"], 0, "--out (--output)"),
        (["--acco=x"], 0, "--acco (--account)"),
        (["--job=x"], 0, "--job (--job-name)"),
        (["-t", "5"], 0, "-t (--time)"),
        (["-N2"], 0, "-N (--nodes)"),
        (["-n", "8"], 0, "-n (--ntasks)"),
        (["--tasks-per-node=4"], 0, "--tasks-per-node"),
        (["-G2"], 0, "-G (--gpus)"),
        (["--gres=gpu:8"], 0, "--gres"),
        (["--gpus-per-task=1"], 0, "--gpus-per-task"),
        (["-c16"], 0, "-c (--cpus-per-task)"),
        (["-Aother"], 0, "-A (--account)"),
        (["-q", "high"], 0, "-q (--qos)"),
        (["-Ca100"], 0, "-C (--constraint)"),
        (["-D/tmp"], 0, "-D (--chdir)"),
        (["--requeue"], 0, "--requeue"),
        (["--no-req"], 0, "--no-req (--no-requeue)"),
        (["--exclusive=user"], 0, "--exclusive"),
        (["--export=NONE"], 0, "--export"),
        (["--wrap=hostname"], 0, "--wrap"),
    ],
)
def test_options_slotsweep_sets_are_refused_in_every_spelling(
    options: list[str], index: int, spelled: str
) -> None:
    problems = slurm_problems(time_limit="60", sbatch_options=options)
    assert problems == [
        "slurm.partition: must be a Slurm name (letters, digits, _ . -) (got 'p!')",
        f"slurm.sbatch_options.{index}: {spelled} is set by slotsweep for every job; use the "
        "slurm block's own fields (partition, account, time_limit, qos, constraint) or "
        f"leave it out (got {options[index]!r})",
    ]


@pytest.mark.parametrize(
    ("options", "index", "problem"),
    [
        (["--wait"], 0, "--wait would keep slotsweep from following the job it submits"),
        (["-W"], 0, "-W (--wait) would keep slotsweep from following the job"),
        (["-Q"], 0, "-Q (--quiet) would keep slotsweep from following the job"),
        (["--array=1-4"], 0, "--array would keep slotsweep from following the job"),
        (["--par=x"], 0, "--par abbreviates several sbatch options (parsable, partition)"),
        (["--mem"], 0, "--mem needs a value, in the same item or the next"),
        (["-L"], 0, "-L needs a value, in the same item or the next"),
        (["--hold=yes"], 0, "--hold takes no value"),
        (["--mem=1G", "job.sh"], 1, "'job.sh' is not an sbatch option (like --mem=64G)"),
        (["--hold", "job.sh"], 1, "sbatch would take it as the batch script"),
        (["--"], 0, "'--' ends sbatch's options"),
        ([":"], 0, "':' separates the components of a heterogeneous job"),
        (["--comment", ":"], 1, "':' separates the components"),
        (["-Z"], 0, "-Z is not an sbatch option"),
        (["--mem 64G"], 0, "give one option per item"),
        (["--site-flag"], 0, "--site-flag is not an option sbatch lists; write its value as"),
        (["--site", "x"], 1, "(if it is the value of --site, write --site=x)"),
        (["--mem=1G\n--x"], 0, "an option may not hold line breaks"),
    ],
)
def test_sbatch_options_that_would_reach_slotsweeps_own_are_refused(
    options: list[str], index: int, problem: str
) -> None:
    problems = slurm_problems(time_limit="60", sbatch_options=options)
    assert len(problems) == 2, problems
    assert problems[1].startswith(f"slurm.sbatch_options.{index}: "), problems
    assert problem in problems[1]


@pytest.mark.parametrize(
    "options",
    [
        ["--mem=64G", "--signal=TERM@120"],
        ["--mem", "64G", "--signal", "B:USR1@60"],
        ["-L", "scratch:1", "-x", "n3", "-H"],
        ["-Lscratch:1", "-vv", "--mail-type=END"],
        ["--comment", "-p is not an option here, a value"],
        ["--site-flag", "--mem=1G", "--site=x"],
        ["--exclude=n1", "--get-user-env", "-k"],
    ],
)
def test_other_sbatch_options_pass_in_every_spelling(options: list[str]) -> None:
    assert [p.split(":")[0] for p in slurm_problems(time_limit="60", sbatch_options=options)] == [
        "slurm.partition"
    ]


def test_every_option_on_slotsweeps_sbatch_line_is_refused_in_sbatch_options() -> None:
    """Adding an option to the line without refusing it from users fails here."""
    settings = SlurmJobSettings(
        "gpu", "60", account="a", qos="q", constraint="c", sbatch_options=("--mem=1G",)
    )
    argv = sbatch_argv(
        settings, nodes=2, slots_per_node=4, use_gpus=True, name="slotsweep-t", log_path="/l"
    )
    ours = argv[2:]
    assert argv[:2] == ["sbatch", "--mem=1G"]
    names = {option.removeprefix("--").partition("=")[0] for option in ours}
    assert names <= MANAGED_SBATCH_OPTIONS, names - MANAGED_SBATCH_OPTIONS
    assert all(sbatch_option_problems([option]) for option in ours)


@pytest.mark.parametrize("name", ["eth0", "ib0", "enp65s0f1np1", "bond0.100", "x" * 15, "é"])
def test_a_network_interface_is_named_as_linux_allows(name: str) -> None:
    cluster = parse_cluster({**two_pools(), "dtrain_network_interface": name})
    assert cluster.dtrain_network_interface == name


@pytest.mark.parametrize(
    "name", ["eth0; rm -rf /", "", "x" * 16, "é" * 8, ".", "..", "eth0:1", "a/b", "ib 0", "ib\t0"]
)
def test_a_network_interface_name_linux_refuses_is_refused(name: str) -> None:
    assert problems_of({**two_pools(), "dtrain_network_interface": name}) == [
        "dtrain_network_interface: must be a network interface name as Linux allows it "
        "(like ib0): 1 to 15 bytes, no whitespace, '/' or ':', not '.' or '..' "
        f"(got {name!r})"
    ]
