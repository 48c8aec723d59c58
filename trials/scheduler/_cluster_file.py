"""The cluster file (YAML) and the default cluster: this machine as one agent.

``--cluster FILE`` or ``$SLOTSWEEP_CLUSTER`` names a file like::

    resource_pools:
      - name: default
        allowing_heterogeneous_fits: false   # default
        fitting_policy: best                 # best | worst
        preemption: false                    # default; true: a blocked higher-priority
                                             # trial checkpoints and stops lower ones
        preempt_without_checkpoint: false    # default; true: also stop trials before
                                             # their first checkpoint (progress lost)
        agents:
          - {name: a1, host: 127.0.0.1, slots: 2}        # a count: slots 0 and 1
          - {name: a2, host: 127.0.0.1, slots: [0, 1]}   # explicit GPU indices
    dtrain_network_interface: eth0    # optional: NCCL/gloo interface between nodes
                                      # (a name Linux allows: 1-15 bytes, no space, / or :)
    notifications:                    # optional: webhooks for every search on the cluster
      - {url: "https://hooks.slack.com/services/T0/B0/XYZ", on: [completed, error]}

``executor: slurm`` (or ``--cluster slurm``, or running inside ``salloc``/``sbatch``
with no cluster file) takes the agents from the Slurm allocation instead. With a
``slurm:`` block as well, each trial is its own Slurm job (``sbatch``) in a partition::

    executor: slurm
    slurm:
      partition: gpu
      account: my-project        # optional where the cluster has no accounts
      time_limit: "04:00:00"     # each job's (MM, HH:MM:SS, D-HH:MM:SS...); a trial
                                 # that reaches it resumes in a new job
      qos: normal                # optional
      constraint: a100           # optional, sbatch --constraint
      sbatch_options: ["--mem=64G"]   # optional; not the options slotsweep sets itself
      slot_type: gpu             # gpu | cpu; default: gpu when the nodes have GPUs

``executor: ray`` takes the agents from a Ray cluster instead: its alive nodes, each
with its GPUs as slots (CPU slots on nodes without GPUs). Every key of the ``ray:``
block is optional::

    executor: ray
    ray:
      address: ray://head-node:10001   # default: $RAY_ADDRESS
      slot_type: gpu                   # gpu | cpu; default: gpu when the nodes have GPUs
      reserve_timeout_s: 60            # a trial whose slots Ray has not reserved by
                                       # then goes back to the queue

Without a file the cluster is one pool ``default`` holding this machine, named after
its hostname, with its GPUs as slots (found through NVML) or else one slot per CPU.
Every problem in a file becomes one line naming the field path; :class:`ClusterConfigError`
holds them all so the CLI can print them and exit 2. A Slurm cluster's nodes come from
Slurm itself, which the executors ask (:func:`trials.executors.load_cluster` reads the
file, the environment and Slurm; this module only validates).

Example:
    >>> cluster = read_cluster({"resource_pools": [{"name": "default",
    ...     "agents": [{"name": "a1", "slots": 2}, {"name": "a2", "slots": [0, 1]}]}]})
    >>> [(a.name, a.host, a.slots) for a in cluster.pool("default").agents]
    [('a1', '127.0.0.1', (0, 1)), ('a2', '127.0.0.1', (0, 1))]
"""

from __future__ import annotations

import os
import re
import socket
from collections import Counter
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field, ValidationError, field_validator

from trials.config import ConfigModel, NotificationConfig, validation_problems
from trials.scheduler._cluster import (
    DEFAULT_RAY_RESERVE_TIMEOUT_S,
    Agent,
    Cluster,
    RaySettings,
    ResourcePool,
    SlotType,
    SlurmJobSettings,
)
from trials.scheduler._sbatch_options import sbatch_option_problems

CLUSTER_ENV_VAR = "SLOTSWEEP_CLUSTER"
#: ``--cluster slurm``: the nodes of the Slurm allocation this process runs in.
SLURM_CLUSTER = "slurm"
DEFAULT_POOL = "default"
LOCAL_HOST = "127.0.0.1"
# More slots than any machine has GPUs (or cores to run CPU slots on): a typo, not a cluster.
MAX_SLOTS_PER_AGENT = 4096


class ClusterConfigError(Exception):
    """A cluster that cannot be used; ``problems`` holds one line per problem."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("\n".join(problems))
        self.problems = problems


@dataclass(frozen=True)
class SlurmNodes:
    """A cluster file's ``executor: slurm``: the agents are nodes that only Slurm knows.

    With ``jobs`` (a ``slurm:`` block) they are the partition's nodes and each trial is
    a Slurm job of its own; without, the nodes of the allocation this process runs in.
    The Slurm executors ask Slurm for them (:func:`trials.executors.parse_cluster`).
    """

    jobs: SlurmJobSettings | None = None
    slot_type: SlotType | None = None
    dtrain_network_interface: str | None = None
    notifications: tuple[NotificationConfig, ...] = ()


@dataclass(frozen=True)
class RayNodes:
    """A cluster file's ``executor: ray``: the agents are the nodes of a Ray cluster.

    The Ray executor asks Ray for them (:func:`trials.executors.parse_cluster`).
    """

    settings: RaySettings
    dtrain_network_interface: str | None = None
    notifications: tuple[NotificationConfig, ...] = ()


SlotId = Annotated[int, Field(ge=0, lt=MAX_SLOTS_PER_AGENT, strict=True)]


class _AgentSpec(ConfigModel):
    name: str = Field(min_length=1, max_length=200)
    # 253 characters: the longest DNS name.
    host: str = Field(default=LOCAL_HOST, min_length=1, max_length=253)
    slots: list[SlotId] = Field(min_length=1, max_length=MAX_SLOTS_PER_AGENT)

    @field_validator("slots", mode="before")
    @classmethod
    def _count_or_ids(cls, value: Any) -> Any:
        # ``slots: 4`` is shorthand for slot ids 0..3.
        if isinstance(value, bool) or not isinstance(value, (int, list)):
            raise ValueError("must be a slot count (e.g. 8) or a list of slot ids (e.g. [0, 1])")
        if isinstance(value, int):
            _check_slot_count(value)
            return list(range(value))
        return value

    @field_validator("slots")
    @classmethod
    def _unique(cls, value: list[int]) -> list[int]:
        repeated = sorted(slot for slot, n in Counter(value).items() if n > 1)
        if repeated:
            raise ValueError(f"slot ids must be unique; repeated: {repeated}")
        return value


def _check_slot_count(count: int) -> None:
    """Refuse a slot count no agent can have; shared by the file and ``--slots``."""
    if not 1 <= count <= MAX_SLOTS_PER_AGENT:
        raise ValueError(
            f"must be a slot count from 1 to {MAX_SLOTS_PER_AGENT} (got {count})"
            if count >= 1
            else "must be at least 1 slot"
        )


class _PoolSpec(ConfigModel):
    name: str = Field(min_length=1, max_length=200)
    allowing_heterogeneous_fits: bool = False
    fitting_policy: Literal["best", "worst"] = "best"
    preemption: bool = False
    preempt_without_checkpoint: bool = False
    agents: list[_AgentSpec] = Field(min_length=1)


# Slurm's time formats: MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS, or no limit.
# The leading field may be any size (90 minutes, 36 hours); a field after it is
# sexagesimal, and hours after days stay below 24.
_SIXTY = r"[0-5]?\d"
_HOURS_OF_A_DAY = r"(?:[01]?\d|2[0-3])"
_TIME_LIMIT = re.compile(
    rf"\d+(?::{_SIXTY}){{0,2}}|\d+-{_HOURS_OF_A_DAY}(?::{_SIXTY}){{0,2}}|unlimited|infinite",
    re.IGNORECASE | re.ASCII,
)
_TIME_LIMIT_RULE = (
    "must be a Slurm time limit: MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS "
    "(minutes and seconds below 60 after the first field, hours below 24 after days), "
    "or UNLIMITED"
)
_SLURM_NAME = re.compile(r"[\w.\-]+")
# Linux's rule for a network interface's name (dev_valid_name): at most IFNAMSIZ - 1
# bytes, none of them a space (the kernel's isspace, 0xa0 included), '/' or ':'.
_IFNAME_MAX_BYTES = 15
_IFNAME_FORBIDDEN_BYTES = frozenset(b" \t\n\v\f\r\xa0/:")


class _RefusedItem:
    """A list item already found wrong where the whole list was read, with the reason.

    The item's own validation raises the reason, so the problem is reported at the
    item's path (``slurm.sbatch_options.2``), as pydantic reports any item.
    """

    def __init__(self, item: str, problem: str) -> None:
        self.item = item
        self.problem = problem

    def __repr__(self) -> str:
        return repr(self.item)


def _refuse_marked(value: Any) -> Any:
    if isinstance(value, _RefusedItem):
        raise ValueError(value.problem)
    return value


_SbatchItem = Annotated[str, BeforeValidator(_refuse_marked), Field(max_length=4096)]


class _SlurmJobsSpec(ConfigModel):
    partition: str = Field(min_length=1, max_length=200)
    time_limit: str = Field(min_length=1, max_length=40)
    account: str | None = Field(default=None, min_length=1, max_length=200)
    qos: str | None = Field(default=None, min_length=1, max_length=200)
    constraint: str | None = Field(default=None, min_length=1, max_length=1000)
    sbatch_options: list[_SbatchItem] = Field(default_factory=list, max_length=100)
    slot_type: Literal["gpu", "cpu"] | None = None

    @field_validator("partition", "account", "qos")
    @classmethod
    def _slurm_name(cls, value: str | None) -> str | None:
        if value is not None and not _SLURM_NAME.fullmatch(value):
            raise ValueError("must be a Slurm name (letters, digits, _ . -)")
        return value

    @field_validator("time_limit", mode="before")
    @classmethod
    def _time(cls, value: Any) -> Any:
        if isinstance(value, int) and not isinstance(value, bool):
            value = str(value)  # minutes, as Slurm reads a bare number
        if not isinstance(value, str) or not _TIME_LIMIT.fullmatch(value):
            raise ValueError(_TIME_LIMIT_RULE)
        return value

    @field_validator("sbatch_options", mode="before")
    @classmethod
    def _options(cls, value: Any) -> Any:
        # sbatch reads the list as a whole (an option's value may be the next item), so
        # it is read here, and each refused item marked for its own path.
        if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
            return value  # pydantic says what is not a list of strings
        problems = sbatch_option_problems(value)
        return [
            _RefusedItem(item, problems[index]) if index in problems else item
            for index, item in enumerate(value)
        ]


class _RaySpec(ConfigModel):
    address: str | None = Field(default=None, min_length=1, max_length=1000)
    slot_type: Literal["gpu", "cpu"] | None = None
    # Ray starts a node's runner (a worker process) in a second or two; far below that every
    # trial would go back to the queue, far above it a lost node holds a trial a day.
    reserve_timeout_s: float = Field(default=DEFAULT_RAY_RESERVE_TIMEOUT_S, ge=5, le=86400)


class _ClusterSpec(ConfigModel):
    # Where trials run. With "slurm" the agents are the nodes of the Slurm allocation
    # the search runs in, with "ray" the nodes of a Ray cluster, so the file declares
    # no resource pools.
    executor: Literal["local", "slurm", "ray"] = "local"
    dtrain_network_interface: str | None = None
    resource_pools: list[_PoolSpec] | None = Field(default=None, min_length=1)
    # One Slurm job per trial (sbatch) instead of job steps of an allocation.
    slurm: _SlurmJobsSpec | None = None
    ray: _RaySpec | None = None
    # Webhooks every search on this cluster posts to (beside its own config's).
    notifications: list[NotificationConfig] = Field(default_factory=list, max_length=100)

    @field_validator("dtrain_network_interface")
    @classmethod
    def _interface_name(cls, value: str | None) -> str | None:
        # It becomes NCCL_SOCKET_IFNAME and GLOO_SOCKET_IFNAME on every node: a name
        # no interface can have would fail each trial's rendezvous, not this file.
        if value is None:
            return value
        name = value.encode()
        if (
            not 1 <= len(name) <= _IFNAME_MAX_BYTES
            or value in (".", "..")
            or any(byte in _IFNAME_FORBIDDEN_BYTES for byte in name)
        ):
            raise ValueError(
                f"must be a network interface name as Linux allows it (like ib0): 1 to "
                f"{_IFNAME_MAX_BYTES} bytes, no whitespace, '/' or ':', not '.' or '..'"
            )
        return value


def read_cluster(raw: Any) -> Cluster | SlurmNodes | RayNodes:
    """Validate a loaded cluster document; raises :class:`ClusterConfigError` listing every problem.

    A file with ``executor: slurm`` declares no agents: it is returned as the
    :class:`SlurmNodes` to ask Slurm for (:func:`trials.executors.parse_cluster` does);
    one with ``executor: ray`` as the :class:`RayNodes` to ask Ray for.

    Example:
        >>> read_cluster({"executor": "ray", "ray": {"address": "ray://head:10001"}}).settings.address
        'ray://head:10001'
    """
    if not isinstance(raw, dict):
        raise ClusterConfigError(["<top level>: must be a mapping with a 'resource_pools' list"])
    try:
        spec = _ClusterSpec.model_validate(raw)
    except ValidationError as exc:
        raise ClusterConfigError(validation_problems(exc, _ClusterSpec)) from None
    if spec.slurm is not None and spec.executor != "slurm":
        raise ClusterConfigError(["slurm: needs executor: slurm"])
    if spec.ray is not None and spec.executor != "ray":
        raise ClusterConfigError(["ray: needs executor: ray"])
    if spec.executor == "ray":
        return _ray_nodes(spec)
    if spec.executor == "slurm":
        return _slurm_nodes(spec)
    return _declared_cluster(spec)


def _ray_nodes(spec: _ClusterSpec) -> RayNodes:
    """``executor: ray``: the settings to ask Ray for its nodes with."""
    if spec.resource_pools is not None:
        raise ClusterConfigError(
            [
                "resource_pools: not allowed with executor: ray "
                "(the agents are the nodes of the Ray cluster)"
            ]
        )
    ray = spec.ray or _RaySpec()
    return RayNodes(
        settings=RaySettings(
            address=ray.address,
            slot_type=ray.slot_type,
            reserve_timeout_s=ray.reserve_timeout_s,
        ),
        dtrain_network_interface=spec.dtrain_network_interface,
        notifications=tuple(spec.notifications),
    )


def _slurm_nodes(spec: _ClusterSpec) -> SlurmNodes:
    """``executor: slurm``: the allocation's nodes, or a job per trial with ``slurm:``."""
    if spec.resource_pools is not None:
        raise ClusterConfigError(
            [
                "resource_pools: not allowed with executor: slurm "
                "(the agents are the nodes of the Slurm allocation)"
            ]
        )
    if spec.slurm is None:
        return SlurmNodes(
            dtrain_network_interface=spec.dtrain_network_interface,
            notifications=tuple(spec.notifications),
        )
    return SlurmNodes(
        jobs=SlurmJobSettings(
            partition=spec.slurm.partition,
            time_limit=spec.slurm.time_limit,
            account=spec.slurm.account,
            qos=spec.slurm.qos,
            constraint=spec.slurm.constraint,
            sbatch_options=tuple(spec.slurm.sbatch_options),
        ),
        slot_type=spec.slurm.slot_type,
        dtrain_network_interface=spec.dtrain_network_interface,
        notifications=tuple(spec.notifications),
    )


def _declared_cluster(spec: _ClusterSpec) -> Cluster:
    """The local executor's pools and agents as the file declares them, names unique."""
    if spec.resource_pools is None:
        raise ClusterConfigError(["resource_pools: required field is missing"])
    problems: list[str] = []
    seen_pools: dict[str, int] = {}
    seen_agents: dict[str, str] = {}
    for p, pool in enumerate(spec.resource_pools):
        if pool.name in seen_pools:
            problems.append(
                f"resource_pools.{p}.name: pool {pool.name!r} is already declared "
                f"(resource_pools.{seen_pools[pool.name]})"
            )
        seen_pools.setdefault(pool.name, p)
        if pool.preempt_without_checkpoint and not pool.preemption:
            # It only widens whom preemption may stop; alone it would silently do nothing.
            problems.append(
                f"resource_pools.{p}.preempt_without_checkpoint: needs preemption: true "
                "in the same pool"
            )
        for a, agent in enumerate(pool.agents):
            # Slot ownership is keyed by agent name, so a name means one machine.
            where = f"resource_pools.{p}.agents.{a}"
            if agent.name in seen_agents:
                problems.append(
                    f"{where}.name: agent {agent.name!r} is already declared "
                    f"({seen_agents[agent.name]}); agent names must be unique in the cluster"
                )
            seen_agents.setdefault(agent.name, where)
    if problems:
        raise ClusterConfigError(problems)
    return Cluster(
        dtrain_network_interface=spec.dtrain_network_interface,
        notifications=tuple(spec.notifications),
        pools=tuple(
            ResourcePool(
                name=pool.name,
                agents=tuple(
                    Agent(name=agent.name, host=agent.host, slots=tuple(agent.slots))
                    for agent in pool.agents
                ),
                allowing_heterogeneous_fits=pool.allowing_heterogeneous_fits,
                fitting_policy=pool.fitting_policy,
                preemption=pool.preemption,
                preempt_without_checkpoint=pool.preempt_without_checkpoint,
            )
            for pool in spec.resource_pools
        ),
    )


def local_cluster(slots: int | None = None) -> Cluster:
    """This machine as the one agent of pool ``default``: its GPUs, else one slot per CPU.

    ``slots`` overrides the count (the first ``slots`` GPUs, or CPU slots 0..slots-1).
    """
    from trials._system_metrics import detect_gpus  # lazy: NVML only when no file is given

    gpus = detect_gpus()
    if slots is not None:
        if isinstance(slots, bool) or not isinstance(slots, int) or slots < 1:
            raise ClusterConfigError([f"slots: must be a positive integer (got {slots!r})"])
        try:
            _check_slot_count(slots)
        except ValueError as exc:
            raise ClusterConfigError([f"slots: {exc}"]) from None
        if gpus and slots > len(gpus):
            raise ClusterConfigError(
                [f"slots: {slots} is more than the {len(gpus)} GPUs of this machine"]
            )
    ids = gpus or list(range(os.cpu_count() or 1))
    if slots is not None:
        ids = gpus[:slots] if gpus else list(range(slots))
    agent = Agent(name=socket.gethostname() or "localhost", host=LOCAL_HOST, slots=tuple(ids))
    return Cluster(pools=(ResourcePool(name=DEFAULT_POOL, agents=(agent,)),))
